"""Mem-Gallery adapter (Multimodal track): scenario files -> samples with image parts.

Source: Mem-Gallery (Bei et al., 2026, arXiv:2601.03515; data on Hugging Face ``Ethan-Bei/Mem-Gallery``,
not obtained here, MANIFEST.md section 2). The layout read here is the published one as AML issue 9
describes it; the JSON key names are this adapter's reading of it and are checked strictly, so a
release that names them differently fails loudly instead of loading empty samples:

- a directory of scenario files ``*.json`` (``data_path`` may also be one file); one file = one user
  = one sample (``sample_id`` = ``scenario_id``, else the file stem);
- ``user_profile``: the user's profile (object or text), Added first as a system message;
- ``sessions``: ``[{"session_id", "date", "rounds": [{"round_id": "D<s>:<r>", "user", "assistant",
  "image"?, "image_id"?, "image_caption"?}]}]``; ``date`` is ISO (``2024-05-01`` or with a time);
  ``image`` is a path relative to the scenario file;
- ``qa``: ``[{"question_id"?, "question", "question_type", "answer", "evidence": ["D1:2", ...],
  "question_image"?}]``.

Rounds become Add messages in order: the user turn (its text, then its image as an ``image_url`` part
with ``[image <image_id>] <caption>`` as text after it) and the assistant turn; every message carries the
session date. A question image is sent with the question as parts. Categories are the
``question_type`` values (Mem-Gallery has nine); the metric is :mod:`aml_ray.scoring.memgallery_f1`.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aml_ray.contract import Message
from aml_ray.datasets.base import Question, Sample, Session
from aml_ray.media import MediaLimits, data_url, image_type, media_context

#: Limits used to build the adapter's messages (the run checks the suite's limits again before sending).
_ADAPTER_LIMITS = MediaLimits()
_CTX = media_context(_ADAPTER_LIMITS)


class MemGalleryFormatError(ValueError):
    """A scenario file does not follow the layout (names the file and the field)."""


def _ms(date: Any, where: str) -> int:
    try:
        dt = datetime.fromisoformat(str(date))
    except ValueError:
        raise MemGalleryFormatError(f"{where}: date {date!r} is not an ISO date") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def _image_part(base: Path, rel: Any, where: str) -> dict[str, Any]:
    path = (base / str(rel)).resolve()
    if not path.is_file():
        raise MemGalleryFormatError(f"{where}: image {rel!r} not found at {path}")
    data = path.read_bytes()
    kind = image_type(data)
    if kind is None:
        raise MemGalleryFormatError(f"{where}: {path} is not a PNG, JPEG, WEBP or GIF image")
    return {"type": "image_url", "image_url": {"url": data_url(kind, data)}}


def _need(obj: dict[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise MemGalleryFormatError(f"{where}: missing {key!r}")
    return obj[key]


def load_scenario(path: Path) -> Sample:
    """One scenario file -> one sample.

    Raises:
        MemGalleryFormatError: a missing key, a bad date, a missing or unknown image, a round id that is
            not ``D<s>:<r>``, or evidence naming a round that does not exist.
    """
    raw = json.loads(path.read_text(encoding="utf-8"))
    name = path.name
    sample_id = str(raw.get("scenario_id") or path.stem)
    sessions_raw = _need(raw, "sessions", name)
    profile = raw.get("user_profile")
    sessions: list[Session] = []
    rounds_seen: set[str] = set()
    for si, s in enumerate(sessions_raw, start=1):
        where = f"{name} sessions[{si - 1}]"
        at = _ms(_need(s, "date", where), where)
        messages: list[Message] = []
        if si == 1 and profile:
            text = profile if isinstance(profile, str) else json.dumps(profile, ensure_ascii=False, sort_keys=True)
            messages.append(Message(role="system", content=f"User profile: {text}", timestamp=at))
        for ri, rnd in enumerate(_need(s, "rounds", where)):
            rw = f"{where}.rounds[{ri}]"
            rid = str(_need(rnd, "round_id", rw))
            if not (rid.startswith("D") and ":" in rid):
                raise MemGalleryFormatError(f"{rw}: round_id {rid!r} is not 'D<session>:<round>'")
            rounds_seen.add(rid)
            user_text = str(rnd.get("user") or "").strip()
            if rnd.get("image"):
                image_id = str(rnd.get("image_id") or Path(str(rnd["image"])).stem)
                caption = str(rnd.get("image_caption") or "").strip()
                parts: list[dict[str, Any]] = []
                if user_text:
                    parts.append({"type": "text", "text": f"[{rid}] {user_text}"})
                parts.append(_image_part(path.parent, rnd["image"], rw))
                parts.append({"type": "text", "text": f"[image {image_id}] {caption}".strip()})
                messages.append(Message.model_validate({"role": "user", "content": parts, "timestamp": at},
                                                       context=_CTX))
            elif user_text:
                messages.append(Message(role="user", content=f"[{rid}] {user_text}", timestamp=at))
            answer = str(rnd.get("assistant") or "").strip()
            if answer:
                messages.append(Message(role="assistant", content=f"[{rid}] {answer}", timestamp=at))
        sessions.append(Session(key=str(s.get("session_id") or f"session_{si}"), index=si, started_at_ms=at,
                                messages=tuple(messages)))
    questions: list[Question] = []
    for qi, q in enumerate(_need(raw, "qa", name)):
        qw = f"{name} qa[{qi}]"
        evidence = tuple(str(e) for e in q.get("evidence") or ())
        unknown = [e for e in evidence if e not in rounds_seen]
        if unknown:
            raise MemGalleryFormatError(f"{qw}: evidence {unknown} names rounds the scenario does not have")
        text = str(_need(q, "question", qw))
        parts = None
        if q.get("question_image"):
            parts = ({"type": "text", "text": text}, _image_part(path.parent, q["question_image"], qw))
        answer = _need(q, "answer", qw)
        questions.append(Question(
            question_id=f"{sample_id}:{q.get('question_id') or f'q{qi:04d}'}", sample_id=sample_id,
            question=text, answer=[str(a) for a in answer] if isinstance(answer, list) else str(answer),
            category=str(_need(q, "question_type", qw)), evidence=evidence, question_parts=parts))
    return Sample(sample_id=sample_id, sessions=tuple(sessions), questions=tuple(questions))


def load_memgallery(path: Path) -> list[Sample]:
    """All scenarios under ``path`` (a directory of ``*.json`` files, sorted by name, or one file).

    Raises:
        FileNotFoundError: no scenario file there.
        MemGalleryFormatError: see :func:`load_scenario`.
    """
    path = Path(path)
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files or not files[0].is_file():
        raise FileNotFoundError(f"no Mem-Gallery scenario files (*.json) at {path}")
    return [load_scenario(f) for f in files]
