"""Search: one ParticipantClient call per group of questions (run by the Ingest stage, per sample).

A Search that stops the run (a contract error or a status that is not retried) leaves its question's row
in ``evidence/stopped/searches.jsonl`` (:class:`aml_ray.run.evidence.StopLog`) before the stage stops.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from aml_ray.run.evidence import QUESTION_SCHEMA, SEARCH_SCHEMA, RunDir, StopLog
from aml_ray.stages._common import call_participant


def stopped_question_row(questions: pa.Table, outcome: dict[str, Any]) -> dict[str, Any] | None:
    """The evidence row of the question whose Search stopped the run.

    Args:
        questions: the group's question columns (as :func:`search_rows`).
        outcome: the outcome the error carries (``ContractError.outcome`` / ``ParticipantError.outcome``);
            its ``request_id`` is the question's ``ref``.

    Returns:
        A :data:`aml_ray.run.evidence.QUESTION_SCHEMA` row: the question's own columns and its Search columns
        (``search_status`` ``contract_error`` or ``error``, ``contract`` = ``"<field>: <reason>"``,
        ``search_error`` the message; no memories); None when no question of the group has that ref.
    """
    refs = questions.column("ref").to_pylist()
    if outcome["request_id"] not in refs:
        return None
    row = questions.slice(refs.index(outcome["request_id"]), 1).to_pylist()[0]
    row = {name: value for name, value in row.items() if name in QUESTION_SCHEMA.names}
    row.update(search_status=outcome["status"], search_http_status=outcome["http_status"],
               search_attempts=outcome["attempts"], search_retried_statuses=outcome["retried_statuses"],
               search_latency_ms=outcome["latency_ms"], search_queue_ms=outcome.get("queue_ms"),
               search_request_sha256=outcome["request_sha256"],
               contract=outcome["contract"], search_error=outcome["error"])
    return row


async def search_rows(participant, questions: pa.Table, top_k: int, tracker=None,
                      media_root: str | None = None, run_dir: RunDir | None = None) -> pa.Table:
    """Search every question through the participant in one actor call; return their Search columns.

    Args:
        participant: the ``ParticipantClient`` actor handle.
        questions: question columns (:data:`aml_ray.run.evidence.QUESTION_INPUT_COLUMNS`; read here:
            ``question``, ``user_id``, ``options``, ``ref``, and ``question_parts`` for Multimodal).
        top_k: Top K sent with every Search.
        tracker: optional ``ProgressTracker`` (receives a contract failure before it is raised).
        media_root: the run's media folder (Multimodal): question images are read from it and returned
            images are stored in it (:class:`aml_ray.media.MediaStore`).
        run_dir: the run directory: a Search that stops the run leaves its question's row there
            (:func:`stopped_question_row`, :class:`aml_ray.run.evidence.StopLog`); None writes none.

    Returns:
        :data:`aml_ray.run.evidence.SEARCH_SCHEMA` columns, one row per question, in order (built by the
        client: :meth:`aml_ray.actors.participant.ParticipantClient.search_table`).

    Raises:
        aml_ray.stages._common.StageStopped: a Search broke the contract or got a status that is not
            retried (recorded on the tracker, its row written first).
    """
    if not questions.num_rows:
        return SEARCH_SCHEMA.empty_table()
    texts, user_ids, options, refs = (questions.column(name).to_pylist()
                                      for name in ("question", "user_id", "options", "ref"))
    parts = questions.column("question_parts")
    parts = parts.to_pylist() if parts.null_count < len(parts) else [None] * len(parts)
    media = None
    if media_root is not None and any(parts):
        from aml_ray.media import MediaStore

        media = MediaStore(media_root)
    items = []
    for text, user_id, opts, ref, qparts in zip(texts, user_ids, options, refs, parts):
        query: Any = media.to_contract(qparts) if qparts and media is not None else text
        request: dict[str, Any] = {"query": query, "user_id": user_id, "top_k": top_k}
        if opts:
            request["options"] = opts
        items.append({"ref": ref, "request": request})
    def record(outcome: dict[str, Any]) -> str | None:
        row = stopped_question_row(questions, outcome)
        return None if row is None or run_dir is None else StopLog(run_dir).append("search", row)

    return await call_participant(participant.search_table.remote(items, media_root), tracker, record)
