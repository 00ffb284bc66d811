"""Search: one ParticipantClient call per group of questions (run by the Ingest stage, per sample)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from aml_ray.evidence import RETRIEVED, SEARCH_SCHEMA
from aml_ray.stages._common import call_participant


async def search_rows(participant, rows: list[dict[str, Any]], top_k: int, tracker=None,
                      media_root: str | None = None) -> pa.Table:
    """Search every row through the participant in one actor call; return the rows' Search columns.

    Args:
        participant: the ``ParticipantClient`` actor handle.
        rows: question rows (``question``, ``user_id``, ``options``, ``ref``; Multimodal:
            ``question_parts``).
        top_k: Top K sent with every Search.
        tracker: optional ``ProgressTracker`` (receives a contract failure before it is raised).
        media_root: the run's media folder (Multimodal): question images are read from it and returned
            images are stored in it (:class:`aml_ray.media.MediaStore`).

    Returns:
        :data:`aml_ray.evidence.SEARCH_SCHEMA` columns, one row per row, in order (built by the client:
        :meth:`aml_ray.actors.participant.ParticipantClient.search_table`).
    """
    if not rows:
        return SEARCH_SCHEMA.empty_table()
    media = None
    if media_root is not None and any(r.get("question_parts") for r in rows):
        from aml_ray.media import MediaStore

        media = MediaStore(media_root)
    items = []
    for r in rows:
        query: Any = r["question"]
        if r.get("question_parts") and media is not None:
            query = media.to_contract(r["question_parts"])
        request: dict[str, Any] = {"query": query, "user_id": r["user_id"], "top_k": top_k}
        if r["options"]:
            request["options"] = r["options"]
        items.append({"ref": r["ref"], "request": request})
    return await call_participant(participant.search_table.remote(items, media_root), tracker)


def final_status(search_status: str | None) -> str:
    """A retrieval-only run's final status of a searched row: ``retrieved`` or ``search_error``."""
    return RETRIEVED if search_status == "ok" else "search_error"
