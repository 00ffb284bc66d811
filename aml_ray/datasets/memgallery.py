"""Mem-Gallery adapter (Multimodal track): the released scenario files -> samples with image parts.

Source: Mem-Gallery (Bei et al., 2026, arXiv:2601.03515; data on Hugging Face ``Ethan-Bei/Mem-Gallery``).
The layout is the release's, as the benchmark's own runner reads it: ``benchmark/run/run_bench.py``
``run_mm_bench`` and ``process_conversation`` (code release ma-xueqian/Mem-Gallery @
``c0a045454850be4db8ded067105c81f998b9d457``, whose ``benchmark/data/dialog/`` holds the 20 scenario files,
e.g. ``Baking_Dessert_Daily_Life_Skill.json``):

- ``data_path`` is the ``dialog`` folder (or the folder holding ``dialog/``, or one scenario file); every
  ``*.json`` there is a scenario, by name order (names holding ``_results_`` or ``_evaluate_result_``
  are skipped, as upstream ``get_available_datasets``). One scenario = one user = one sample, whose id is
  the file stem;
- ``character_profile`` (object, optional): its ``name`` labels the user's turns ``user (<name>): ...``
  as upstream's ``speaker_a``; the profile itself is not Added (upstream stores the rounds only);
- ``multi_session_dialogues``: ``[{"session_id": "D1", "date": "2024-06-24", "dialogues": [{"round":
  "D1:1", "user", "assistant", "image_id"?, "input_image"?, "image_caption"?}]}]``; the three image
  fields are lists of the same length (a single string stands for a list of one); a round with neither
  user nor assistant text is skipped (upstream);
- ``"human-annotated QAs"``: ``[{"point", "question", "answer", "session_id"?, "clue"?, "question_image"?,
  "image_caption"?}]``; ``point`` is the category (FR, VS, TTL, VR, AR, TR, CD, MR...), ``clue`` the
  evidence rounds (audit only: kept as given), the question id ``<stem>:q<index>`` (0-based, 4 digits).

Image paths are upstream's: an absolute path as is; ``../image/<rest>`` is ``<data>/image/<rest>``, where
``<data>`` is the dialog folder's parent; any other relative path is ``<data>/<path>`` for a round image
and ``<data>/image/<path>`` for a question image.

A round becomes two Add messages, both stamped with the session date: the user turn (``[D1:1] user
(Maya): <text>``, then each image as an ``image_url`` part followed by ``[image <image_id>] <caption>``)
and the assistant turn (``[D1:1] assistant: <text>``). All the round's images are Added (upstream's
runner keeps only the first). A question image is sent with the question as parts.

One bad image (missing, a type the contract does not take such as BMP, or over the suite's size limits,
:func:`aml_ray.media.image_problem`) is that item's error, never the bundle's: the round is Added with
``[image <id> not available: <reason>] <caption>`` in its place, a question whose image is bad is
excluded with the reason (``excluded_reason``), and a warning names the file, the round or question and
the reason. The limits are the shipped ``multimodal`` suite's (:mod:`aml_ray.suites`).

Malformed files raise :class:`DatasetFormatError` naming the file, the scenario and the field.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aml_ray.contract import Message
from aml_ray.datasets.base import Question, Sample, Session
from aml_ray.datasets.validate import DatasetFormatError, Where, in_file, read_json
from aml_ray.media import data_url, image_problem, image_type, media_context
from aml_ray.media import suite_media_limits as media_limits

log = logging.getLogger(__name__)

#: The name this adapter's format errors had; every adapter now raises :class:`DatasetFormatError`.
MemGalleryFormatError = DatasetFormatError
#: The QA list's key in a scenario file.
QA_KEY = "human-annotated QAs"
#: Files of the dialog folder that are not scenarios (upstream ``get_available_datasets``).
_NOT_SCENARIOS = ("_results_", "_evaluate_result_")


def _ms(date: Any, where: Where) -> int:
    where.check(date, str, "an ISO date like '2024-06-24'")
    try:
        dt = datetime.fromisoformat(date)
    except ValueError:
        raise where.error(f"date {date!r} is not an ISO date; expected a date like '2024-06-24'") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def _strings(obj: dict[str, Any], key: str, where: Where) -> list[str]:
    """A field holding a list of strings, or one string (a list of one); missing, null or blank is empty."""
    value = where.get(obj, key, (list, str), "a list of strings", required=False, default=[])
    if isinstance(value, str):
        return [value] if value.strip() else []
    for i, v in enumerate(value):
        (where / key / i).check(v, str, "a string")
    return value


def image_path(dialog_file: Path, raw: str, *, question: bool = False) -> Path:
    """Where an image of a scenario file is (upstream ``process_conversation`` and ``run_mm_bench``).

    Args:
        dialog_file: the scenario file (in the release's ``data/dialog/``).
        raw: the path as the file gives it, e.g. ``"../image/Baking_Dessert_Daily_Life_Skill/D1_IMG_001.jpg"``.
        question: a question image (a bare relative path is then under ``<data>/image``).

    Examples:
        >>> str(image_path(Path("/d/data/dialog/S.json"), "../image/S/D1_IMG_001.jpg"))
        '/d/data/image/S/D1_IMG_001.jpg'
        >>> str(image_path(Path("/d/data/dialog/S.json"), "S/QA_IMG_001.jpg", question=True))
        '/d/data/image/S/QA_IMG_001.jpg'
    """
    if os.path.isabs(raw):
        return Path(raw)
    data = dialog_file.parent.parent
    if raw.startswith("../image/"):
        return data / "image" / raw[len("../image/"):]
    return data / "image" / raw if question else data / raw


def _image(dialog_file: Path, raw: str, *, question: bool = False) -> tuple[dict[str, Any] | None, str, Path]:
    """``(image_url part, "", file)`` for a usable image, else ``(None, reason, file)``."""
    path = image_path(dialog_file, raw, question=question)
    try:
        data = path.read_bytes()
    except OSError as exc:
        return None, f"the file cannot be read ({exc.strerror or type(exc).__name__})", path
    problem = image_problem(data, media_limits())
    if problem:
        return None, problem, path
    return {"type": "image_url", "image_url": {"url": data_url(image_type(data) or "png", data)}}, "", path


def _round_messages(path: Path, d: dict[str, Any], rw: Where, speaker: str, at: int) -> list[Message]:
    """The user and assistant messages of one round (none for a round without text)."""
    rid = str(rw.get(d, "round", (str, int), "a round id like 'D1:1'", nonempty=True))
    user = str(rw.get(d, "user", str, "the user's text", required=False, default="")).strip()
    assistant = str(rw.get(d, "assistant", str, "the assistant's text", required=False, default="")).strip()
    images = _strings(d, "input_image", rw)
    ids, captions = _strings(d, "image_id", rw), _strings(d, "image_caption", rw)
    for key, values in (("image_id", ids), ("image_caption", captions)):
        if images and values and len(values) != len(images):
            raise (rw / key).error(f"has {len(values)} entries for {len(images)} input_image entries; expected "
                                   "one per image")
    if not user and not assistant:  # upstream skips such a round, images and all
        return []
    parts: list[dict[str, Any]] = [{"type": "text", "text": f"[{rid}] {speaker}: {user}"}] if user else []
    for i, raw in enumerate(images):
        image_id = ids[i] if ids else Path(raw).stem
        caption = captions[i] if captions else ""
        part, reason, file = _image(path, raw)
        if part is None:
            log.warning("%s: round %s: image %s is left out: %s; the round is Added without it", path, rid, file,
                        reason)
            parts.append({"type": "text", "text": f"[image {image_id} not available: {reason}] {caption}".strip()})
        else:
            parts += [part, {"type": "text", "text": f"[image {image_id}] {caption}".strip()}]
    out = []
    if images:
        out.append(Message.model_validate({"role": "user", "content": parts, "timestamp": at},
                                          context=media_context(media_limits())))
    elif user:
        out.append(Message(role="user", content=parts[0]["text"], timestamp=at))
    if assistant:
        out.append(Message(role="assistant", content=f"[{rid}] assistant: {assistant}", timestamp=at))
    return out


def _question(path: Path, sample_id: str, qi: int, q: Any, qw: Where) -> Question:
    qw.check(q, dict, "a QA object {point, question, answer, clue}")
    text = qw.get(q, "question", str, "the question text", nonempty=True)
    answer = qw.get(q, "answer", (str, int, float), "the gold answer")
    category = str(qw.get(q, "point", (str, int), "the question type (FR, VS, TTL, ...)", nonempty=True))
    evidence = tuple(_strings(q, "clue", qw))
    parts, excluded = None, None
    raw = qw.get(q, "question_image", str, "an image path", required=False)
    if raw:
        part, reason, file = _image(path, raw, question=True)
        if part is None:
            excluded = f"media: question {qi}: {raw}: {reason}"
            log.warning("%s: question %d: image %s: %s; the question is excluded", path, qi, file, reason)
        else:
            parts = ({"type": "text", "text": text}, part)
    return Question(question_id=f"{sample_id}:q{qi:04d}", sample_id=sample_id, question=text, answer=str(answer),
                    category=category, evidence=evidence, question_parts=parts, excluded_reason=excluded)


def _scenario(path: Path, raw: dict[str, Any]) -> Sample:
    sample_id = path.stem
    top = Where(f"scenario {sample_id!r}")
    profile = top.get(raw, "character_profile", dict, "an object {name, ...}", required=False, default={})
    name = profile.get("name")
    speaker = f"user ({name})" if isinstance(name, str) and name.strip() else "user"
    sessions: list[Session] = []
    for si, s in enumerate(top.get(raw, "multi_session_dialogues", list, "a list of sessions {session_id, date, "
                                   "dialogues}")):
        where = top / "multi_session_dialogues" / si
        where.check(s, dict, "a session object {session_id, date, dialogues}")
        key = str(where.get(s, "session_id", (str, int), "a session id like 'D1'", required=False) or f"D{si + 1}")
        at = _ms(where.get(s, "date", str, "an ISO date like '2024-06-24'"), where / "date")
        messages: list[Message] = []
        for ri, d in enumerate(where.get(s, "dialogues", list, "a list of rounds {round, user, assistant}")):
            rw = where / "dialogues" / ri
            rw.check(d, dict, "a round object {round, user, assistant, input_image?}")
            messages += _round_messages(path, d, rw, speaker, at)
        sessions.append(Session(key=key, index=si + 1, started_at_ms=at, messages=tuple(messages)))
    qas = top.get(raw, QA_KEY, list, "a list of QA objects {point, question, answer, clue}")
    questions = tuple(_question(path, sample_id, qi, q, top / QA_KEY / qi) for qi, q in enumerate(qas))
    return Sample(sample_id=sample_id, sessions=tuple(sessions), questions=questions)


def load_scenario(path: Path) -> Sample:
    """One scenario file -> one sample (layout: module docstring).

    Raises:
        DatasetFormatError: an empty file or invalid JSON, a missing key or one of the wrong type, a bad
            date, image lists of different lengths; the message names the file, the scenario and the field.
    """
    raw = read_json(path, dict, "a scenario object {character_profile, multi_session_dialogues, "
                                "human-annotated QAs}")
    with in_file(path):
        return _scenario(Path(path), raw)


def scenario_files(path: Path) -> list[Path]:
    """The scenario files of ``path``: the dialog folder's ``*.json`` by name (also when ``path`` holds
    ``dialog/``), or ``path`` itself when it is a file.

    Raises:
        FileNotFoundError: no scenario file there.
    """
    path = Path(path)
    if path.is_dir() and (path / "dialog").is_dir():
        path = path / "dialog"
    files = ([f for f in sorted(path.glob("*.json")) if not any(s in f.name for s in _NOT_SCENARIOS)]
             if path.is_dir() else [path])
    if not files or not files[0].is_file():
        raise FileNotFoundError(f"no Mem-Gallery scenario files (dialog/*.json) at {path}")
    return files


def load_memgallery(path: Path) -> list[Sample]:
    """All scenarios under ``path`` (:func:`scenario_files`), one sample each.

    Raises:
        FileNotFoundError: no scenario file there.
        DatasetFormatError: see :func:`load_scenario`.
    """
    return [load_scenario(f) for f in scenario_files(path)]
