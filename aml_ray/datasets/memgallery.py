"""Mem-Gallery adapter (Multimodal track): scenario files -> samples with image parts.

Source: Mem-Gallery (Bei et al., 2026, arXiv:2601.03515; data on Hugging Face ``Ethan-Bei/Mem-Gallery``,
not obtained here, MANIFEST.md section 2). The layout read here is the published one as AML issue 9
describes it; the JSON key names are this adapter's reading of it and are checked strictly, so a
release that names them differently fails loudly (:class:`DatasetFormatError` naming the file, the
scenario and the field) instead of loading empty samples:

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
from aml_ray.datasets.validate import DatasetFormatError, Where, in_file, read_json
from aml_ray.media import MediaLimits, data_url, image_type, media_context

#: Limits used to build the adapter's messages (the run checks the suite's limits again before sending).
_ADAPTER_LIMITS = MediaLimits()
_CTX = media_context(_ADAPTER_LIMITS)


#: The name this adapter's format errors had; every adapter now raises :class:`DatasetFormatError`.
MemGalleryFormatError = DatasetFormatError


def _ms(date: Any, where: Where) -> int:
    where.check(date, str, "an ISO date like '2024-05-01'")
    try:
        dt = datetime.fromisoformat(date)
    except ValueError:
        raise where.error(f"date {date!r} is not an ISO date; expected a date like '2024-05-01'") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def _image_part(base: Path, rel: Any, where: Where) -> dict[str, Any]:
    where.check(rel, str, "an image path relative to the scenario file")
    path = (base / rel).resolve()
    if not path.is_file():
        raise where.error(f"image {rel!r} not found at {path}")
    data = path.read_bytes()
    kind = image_type(data)
    if kind is None:
        raise where.error(f"{path} is not a PNG, JPEG, WEBP or GIF image")
    return {"type": "image_url", "image_url": {"url": data_url(kind, data)}}


def _text(obj: dict[str, Any], key: str, where: Where) -> str:
    return str(where.get(obj, key, (str, int, float), "text", required=False, default="")).strip()


def load_scenario(path: Path) -> Sample:
    """One scenario file -> one sample.

    Raises:
        DatasetFormatError: an empty file or invalid JSON, a missing key or one of the wrong type, a bad
            date, a missing or unknown image, a round id that is not ``D<s>:<r>``, or evidence naming a
            round that does not exist; the message names the file, the scenario and the field.
    """
    raw = read_json(path, dict, "a scenario object {scenario_id, user_profile, sessions, qa}")
    with in_file(path):
        return _scenario(path, raw)


def _scenario(path: Path, raw: dict[str, Any]) -> Sample:
    sample_id = str(raw.get("scenario_id") or path.stem)
    top = Where(f"scenario {sample_id!r}")
    sessions_raw = top.get(raw, "sessions", list, "a list of sessions {session_id, date, rounds}")
    profile = raw.get("user_profile")
    sessions: list[Session] = []
    rounds_seen: set[str] = set()
    for si, s in enumerate(sessions_raw, start=1):
        where = top / "sessions" / (si - 1)
        where.check(s, dict, "a session object {session_id, date, rounds}")
        at = _ms(where.get(s, "date", str, "an ISO date like '2024-05-01'"), where / "date")
        messages: list[Message] = []
        if si == 1 and profile:
            text = profile if isinstance(profile, str) else json.dumps(profile, ensure_ascii=False, sort_keys=True)
            messages.append(Message(role="system", content=f"User profile: {text}", timestamp=at))
        for ri, rnd in enumerate(where.get(s, "rounds", list, "a list of rounds")):
            rw = where / "rounds" / ri
            rw.check(rnd, dict, "a round object {round_id, user, assistant, image?}")
            rid = str(rw.get(rnd, "round_id", (str, int), "a round id 'D<session>:<round>'"))
            if not (rid.startswith("D") and ":" in rid):
                raise (rw / "round_id").error(f"round_id {rid!r} is not 'D<session>:<round>'")
            rounds_seen.add(rid)
            user_text = _text(rnd, "user", rw)
            if rnd.get("image"):
                image_id = str(rnd.get("image_id") or Path(str(rnd["image"])).stem)
                caption = _text(rnd, "image_caption", rw)
                parts: list[dict[str, Any]] = []
                if user_text:
                    parts.append({"type": "text", "text": f"[{rid}] {user_text}"})
                parts.append(_image_part(path.parent, rnd["image"], rw / "image"))
                parts.append({"type": "text", "text": f"[image {image_id}] {caption}".strip()})
                messages.append(Message.model_validate({"role": "user", "content": parts, "timestamp": at},
                                                       context=_CTX))
            elif user_text:
                messages.append(Message(role="user", content=f"[{rid}] {user_text}", timestamp=at))
            answer = _text(rnd, "assistant", rw)
            if answer:
                messages.append(Message(role="assistant", content=f"[{rid}] {answer}", timestamp=at))
        sessions.append(Session(key=str(s.get("session_id") or f"session_{si}"), index=si, started_at_ms=at,
                                messages=tuple(messages)))
    questions: list[Question] = []
    for qi, q in enumerate(top.get(raw, "qa", list, "a list of questions")):
        qw = top / "qa" / qi
        qw.check(q, dict, "a question object {question, question_type, answer, evidence}")
        evidence = tuple(str(e) for e in qw.get(q, "evidence", list, "a list of round ids", required=False,
                                                default=[]))
        unknown = [e for e in evidence if e not in rounds_seen]
        if unknown:
            raise (qw / "evidence").error(f"evidence {unknown} names rounds the scenario does not have")
        text = str(qw.get(q, "question", (str, int, float), "the question text"))
        parts = None
        if q.get("question_image"):
            parts = ({"type": "text", "text": text},
                     _image_part(path.parent, q["question_image"], qw / "question_image"))
        answer = qw.get(q, "answer", (str, int, float, list), "the gold answer as text or a list of texts")
        questions.append(Question(
            question_id=f"{sample_id}:{q.get('question_id') or f'q{qi:04d}'}", sample_id=sample_id,
            question=text, answer=[str(a) for a in answer] if isinstance(answer, list) else str(answer),
            category=str(qw.get(q, "question_type", (str, int))), evidence=evidence, question_parts=parts))
    return Sample(sample_id=sample_id, sessions=tuple(sessions), questions=tuple(questions))


def load_memgallery(path: Path) -> list[Sample]:
    """All scenarios under ``path`` (a directory of ``*.json`` files, sorted by name, or one file).

    Raises:
        FileNotFoundError: no scenario file there.
        DatasetFormatError: see :func:`load_scenario`.
    """
    path = Path(path)
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files or not files[0].is_file():
        raise FileNotFoundError(f"no Mem-Gallery scenario files (*.json) at {path}")
    return [load_scenario(f) for f in files]
