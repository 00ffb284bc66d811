"""Search: one ParticipantClient call per group of questions (run by the Ingest stage, per sample)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from aml_ray.evidence import SEARCH_SCHEMA
from aml_ray.stages._common import call_participant


async def search_rows(participant, questions: pa.Table, top_k: int, tracker=None,
                      media_root: str | None = None) -> pa.Table:
    """Search every question through the participant in one actor call; return their Search columns.

    Args:
        participant: the ``ParticipantClient`` actor handle.
        questions: question columns (:data:`aml_ray.evidence.QUESTION_INPUT_COLUMNS`; read here:
            ``question``, ``user_id``, ``options``, ``ref``, and ``question_parts`` for Multimodal).
        top_k: Top K sent with every Search.
        tracker: optional ``ProgressTracker`` (receives a contract failure before it is raised).
        media_root: the run's media folder (Multimodal): question images are read from it and returned
            images are stored in it (:class:`aml_ray.media.MediaStore`).

    Returns:
        :data:`aml_ray.evidence.SEARCH_SCHEMA` columns, one row per question, in order (built by the
        client: :meth:`aml_ray.actors.participant.ParticipantClient.search_table`).
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
    return await call_participant(participant.search_table.remote(items, media_root), tracker)
