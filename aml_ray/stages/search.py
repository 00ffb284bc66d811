"""Search: one ParticipantClient call per group of questions (run by the Ingest stage, per sample)."""

from __future__ import annotations

from typing import Any

from aml_ray.evidence import RETRIEVED
from aml_ray.stages._common import call_participant


def _memory_rows(memories: list[dict[str, Any]], media) -> list[dict[str, Any]]:
    """Multimodal: memories returned as parts -> evidence memories (images stored once by hash)."""
    if not any(isinstance(m["content"], list) for m in memories):
        return memories
    from aml_ray.media import render_parts

    out = []
    for m in memories:
        if isinstance(m["content"], list):
            parts = media.externalize(m["content"])
            m = {**m, "content": render_parts(parts), "parts": parts}
        out.append(m)
    return out


async def search_rows(participant, rows: list[dict[str, Any]], top_k: int, tracker=None,
                      media_root: str | None = None) -> None:
    """Search every row through the participant in one actor call and fill its search columns in place.

    Args:
        participant: the ``ParticipantClient`` actor handle.
        rows: question rows (``question``, ``user_id``, ``options``, ``ref``; Multimodal:
            ``question_parts``).
        top_k: Top K sent with every Search.
        tracker: optional ``ProgressTracker`` (receives a contract failure before it is raised).
        media_root: the run's media folder (Multimodal): question images are read from it and returned
            images are stored in it (:class:`aml_ray.media.MediaStore`).
    """
    if not rows:
        return
    media = None
    if media_root is not None:
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
    outcomes = await call_participant(participant.search_batch.remote(items), tracker)
    for r, o in zip(rows, outcomes):
        if media is not None:
            o["memories"] = _memory_rows(o["memories"], media)
        r.update(search_status=o["status"], search_http_status=o["http_status"],
                 search_attempts=o["attempts"], search_retried_statuses=o["retried_statuses"],
                 search_latency_ms=o["latency_ms"], search_request_sha256=o["request_sha256"],
                 search_error=o["error"], memories=o["memories"], n_memories=len(o["memories"]),
                 contract="ok" if o["status"] == "ok" else None)


def final_status(row: dict[str, Any]) -> str:
    """A retrieval-only run's final status of a searched row: ``retrieved`` or ``search_error``."""
    return RETRIEVED if row["search_status"] == "ok" else "search_error"
