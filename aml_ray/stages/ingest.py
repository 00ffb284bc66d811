"""Ingest stage: one sample's Adds, in order, then that sample's question rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from aml_ray.evidence import ADD_SCHEMA, QUESTION_SCHEMA, RunDir, to_table, write_parquet_atomic
from aml_ray.stages._common import call_participant, report


class IngestStage:
    """Adds one sample's chunks in order, writes their evidence, and emits the sample's question rows.

    Input rows: ``{sample_id, adds_json, add_meta_json, questions_json}`` where ``adds_json`` is the
    ordered list of AddRequest dicts, ``add_meta_json`` their per-chunk metadata (chunk_index, n_words)
    and ``questions_json`` the sample's scorable question rows.

    Args:
        participant: the ``ParticipantClient`` actor handle.
        run_root: the run directory (Add evidence goes to ``evidence/adds/<sample_id>.parquet``; on a
            multi-node cluster it must be storage every node sees).
        tracker: optional ``ProgressTracker`` actor handle.
    """

    def __init__(self, participant, run_root: str, tracker=None):
        self.participant = participant
        self.run_dir = RunDir(Path(run_root))
        self.tracker = tracker

    async def __call__(self, batch: pa.Table) -> pa.Table:
        out: list[dict[str, Any]] = []
        for row in batch.to_pylist():
            adds = json.loads(row["adds_json"])
            meta = json.loads(row["add_meta_json"])
            outcomes = await call_participant(self.participant.add_sample.remote(adds), self.tracker)
            evidence = [{
                "sample_id": row["sample_id"], "chunk_index": m["chunk_index"], "n_words": m["n_words"],
                "request_id": a["request_id"], "user_id": a["user_id"], "session_id": a["session_id"],
                "n_messages": len(a["messages"]), "request_sha256": o["request_sha256"],
                "status": o["status"], "http_status": o["http_status"], "attempts": o["attempts"],
                "retried_statuses": o["retried_statuses"], "latency_ms": o["latency_ms"],
                "elapsed_ms": o["elapsed_ms"], "contract": "ok" if o["status"] == "ok" else None,
                "error": o["error"],
            } for a, m, o in zip(adds, meta, outcomes)]
            write_parquet_atomic(to_table(evidence, ADD_SCHEMA), self.run_dir.add_file(row["sample_id"]))
            report(self.tracker, "add", len(adds))
            out.extend(json.loads(row["questions_json"]))
        return to_table(out, QUESTION_SCHEMA)
