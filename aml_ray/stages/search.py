"""Search stage: one ParticipantClient call per batch of questions."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from aml_ray.evidence import QUESTION_SCHEMA, to_table
from aml_ray.stages._common import call_participant, report


class SearchStage:
    """Searches every question of a batch through the participant (one actor call per batch).

    Args:
        participant: the ``ParticipantClient`` actor handle.
        top_k: the suite's Top K (formal: 100).
        tracker: optional ``ProgressTracker`` actor handle.
    """

    def __init__(self, participant, top_k: int, tracker=None):
        self.participant, self.top_k, self.tracker = participant, top_k, tracker

    async def __call__(self, batch: pa.Table) -> pa.Table:
        rows = batch.to_pylist()
        items = []
        for r in rows:
            request: dict[str, Any] = {"query": r["question"], "user_id": r["user_id"], "top_k": self.top_k}
            if r["options"]:
                request["options"] = r["options"]
            items.append({"ref": r["ref"], "request": request})
        outcomes = await call_participant(self.participant.search_batch.remote(items), self.tracker)
        for r, o in zip(rows, outcomes):
            r.update(search_status=o["status"], search_http_status=o["http_status"],
                     search_attempts=o["attempts"], search_retried_statuses=o["retried_statuses"],
                     search_latency_ms=o["latency_ms"], search_request_sha256=o["request_sha256"],
                     search_error=o["error"], memories=o["memories"], n_memories=len(o["memories"]),
                     contract="ok" if o["status"] == "ok" else None)
        report(self.tracker, "search", len(rows))
        return to_table(rows, QUESTION_SCHEMA)
