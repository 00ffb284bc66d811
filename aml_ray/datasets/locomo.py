"""LoCoMo (locomo10) adapter: ``locomo10.json`` -> :class:`~aml_ray.datasets.base.Sample` objects.

Source: snap-research/LoCoMo ``data/locomo10.json`` (pinned by :data:`LOCOMO_SHA256`); schema notes in
``shared/datasets/MANIFEST.md`` section 3.1. Mapping decisions:

- One sample per conversation; ``sample_id`` is the file's ``sample_id`` (``conv-26``); speakers are
  ``(speaker_a, speaker_b)``.
- Sessions are the ``session_N`` lists in numeric order (``session_10`` after ``session_9``). A session
  with a ``session_N_date_time`` but no turns is skipped (conv-26 has dates for sessions 20-35 and no
  turns). The session key is ``session_N``.
- ``session_N_date_time`` (``"1:56 pm on 8 May, 2023"``) is parsed without the locale; the source has no
  time zone, so the wall time is taken **as UTC**. A malformed date raises ``DatasetFormatError`` naming
  the sample, the key and the value; there is no fallback to the current time.
- Each turn becomes ``Message(role, content="<speaker>: <text>", timestamp)``. Role: ``speaker_a`` ->
  ``"user"``, ``speaker_b`` -> ``"assistant"`` (LoCoMo is a dialogue between two people; the mapping
  only keeps the two speakers apart, the speaker's name stays in the content). A turn with a
  ``blip_caption`` gets `` [shares an image: <caption>]`` appended: the images are not in the release,
  so the caption is kept as text. ``img_url`` and ``query`` (the image-search query) are not sent.
- Message timestamp = session start (ms) + turn index (0-based), so order within a session is explicit
  and stable while every message keeps its session's date.
- Questions: ``question_id = f"{sample_id}:q{idx:04d}"`` with ``idx`` the 0-based position in the
  sample's ``qa`` list; ``category`` as a string; an int answer becomes text; ``evidence`` is the
  ``dia_id`` list with the one packed entry (``"D8:6; D9:17"``) split on ``;``. Category 5
  (adversarial) is excluded from scoring by default (``excluded_reason="adversarial"``) and its answer
  is the ``answer`` field if present, else None. ``adversarial_answer`` (the wrong answer the question
  tries to elicit) is never used as the gold.
"""

from __future__ import annotations

import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aml_ray.contract import Message
from aml_ray.datasets.dates import MONTHS
from aml_ray.datasets.base import Question, Sample, Session
from aml_ray.datasets.fetch import (
    DatasetDownloadError,
    DatasetHashMismatch,
    fetch_to_cache,
    verify_sha256,
)
from aml_ray.datasets.validate import DatasetFormatError, Where, in_file, read_json

#: Dataset name used in ids (``eval:<run>:locomo:<sample>``).
DATASET = "locomo"
#: Pinned source (MANIFEST.md: snap-research/LoCoMo @ 3eb6f2c5, ``data/locomo10.json``).
LOCOMO_URL = "https://raw.githubusercontent.com/snap-research/locomo/main/data/locomo10.json"
LOCOMO_SHA256 = "79fa87e90f04081343b8c8debecb80a9a6842b76a7aa537dc9fdf651ea698ff4"
#: File name inside the cache directory: ``<cache_dir>/locomo/locomo10.json``.
LOCOMO_CACHE_NAME = Path("locomo") / "locomo10.json"
#: LoCoMo category 5: adversarial / unanswerable (MANIFEST.md 3.1); excluded from scoring by default.
ADVERSARIAL_CATEGORY = "5"
#: Category meaning, from the official task_eval/evaluation.py (MANIFEST.md section 3.1).
CATEGORY_NAMES = {"1": "multi-hop", "2": "temporal", "3": "open-domain", "4": "single-hop", "5": "adversarial"}

_SESSION_KEY = re.compile(r"^session_(\d+)$")
_DATE = re.compile(
    r"^\s*(\d{1,2}):(\d{2})\s*([ap]m)\s+on\s+(\d{1,2})\s+([A-Za-z]+),?\s+(\d{4})\s*$", re.IGNORECASE
)


def parse_session_datetime(value: Any, *, sample_id: str, key: str, where: Where | None = None) -> int:
    """Parse a LoCoMo ``session_N_date_time`` into UTC Unix milliseconds.

    The format is ``"<h>:<mm> <am|pm> on <d> <Month>, <yyyy>"`` (English month names, 12-hour clock).
    The source carries no time zone; the wall time is taken as UTC.

    Args:
        value: the field's value, e.g. ``"1:56 pm on 8 May, 2023"``.
        sample_id: the sample, for the error message.
        key: the field name (``session_N_date_time``), for the error message.
        where: the field's place in the file (default: sample ``sample_id``, field ``key``).

    Returns:
        Milliseconds since the Unix epoch, e.g. ``1683554160000`` for the example above.

    Raises:
        DatasetFormatError: if the value is not a string in that format or is not a real date/time; the
            message names the sample, the key and the value.
    """
    here = where or Where(f"sample {sample_id!r}", key)

    def bad(why: str) -> DatasetFormatError:
        return here.error(f"malformed {key}={value!r} ({why}); expected a date like '1:56 pm on 8 May, 2023'")

    if not isinstance(value, str):
        raise bad("not a string")
    m = _DATE.match(value)
    if not m:
        raise bad("does not match '<h>:<mm> <am|pm> on <d> <Month>, <yyyy>'")
    hour12, minute, ampm, day, month_name, year = m.groups()
    month = MONTHS.get(month_name.lower())
    if month is None:
        raise bad(f"unknown month {month_name!r}")
    hour12 = int(hour12)
    if not 1 <= hour12 <= 12:
        raise bad(f"hour {hour12} is not on a 12-hour clock")
    hour = hour12 % 12 + (12 if ampm.lower() == "pm" else 0)
    try:
        dt = datetime(int(year), month, int(day), hour, int(minute), tzinfo=timezone.utc)
    except ValueError as exc:
        raise bad(str(exc)) from None
    return int(dt.timestamp()) * 1000


def _render_turn(turn: dict[str, Any], where: Where) -> str:
    content = f"{turn['speaker']}: {where.get(turn, 'text', str)}"
    caption = turn.get("blip_caption")
    if isinstance(caption, str) and caption.strip():
        content += f" [shares an image: {caption.strip()}]"
    return content


def parse_sessions(sample_id: str, conv: dict[str, Any], where: Where | None = None) -> tuple[Session, ...]:
    """The sessions of one LoCoMo-layout ``conversation`` dict (rules in the module docstring).

    Shared with :mod:`aml_ray.datasets.locomo_refined`, which keeps this layout.

    Args:
        sample_id: the sample.
        conv: the ``conversation`` object.
        where: its place in the file, for error messages (default: sample ``sample_id``).

    Raises:
        DatasetFormatError: a missing or non-string speaker, a session or turn of the wrong type, a
            malformed date, a turn by an unknown speaker, or a session with turns but no date.
    """
    where = where or Where(f"sample {sample_id!r}")
    roles = {where.get(conv, "speaker_a", str, nonempty=True): "user",
             where.get(conv, "speaker_b", str, nonempty=True): "assistant"}
    numbered = sorted(
        (int(m.group(1)), key) for key in conv if (m := _SESSION_KEY.match(key))
    )
    sessions: list[Session] = []
    for _, key in numbered:
        turns = (where / key).check(conv[key], list, "a list of turns")
        if not turns:  # a date without turns (conv-26 sessions 20-35): nothing to ingest
            continue
        date_key = f"{key}_date_time"
        if date_key not in conv:
            raise (where / date_key).error(f"missing; {key} has turns, so its date is required")
        start = parse_session_datetime(conv[date_key], sample_id=sample_id, key=date_key, where=where / date_key)
        messages = []
        for i, turn in enumerate(turns):
            here = where / key / i
            here.check(turn, dict, "a turn object {speaker, dia_id, text}")
            speaker = here.get(turn, "speaker", str)
            role = roles.get(speaker)
            if role is None:
                raise (here / "speaker").error(f"turn {turn.get('dia_id')!r} has speaker {speaker!r}, "
                                               f"not one of {sorted(roles)}")
            messages.append(Message(role=role, content=_render_turn(turn, here), timestamp=start + i))
        sessions.append(Session(key=key, index=len(sessions) + 1, started_at_ms=start,
                                messages=tuple(messages)))
    return tuple(sessions)


def parse_evidence(raw: list[Any], where: Where | None = None) -> tuple[str, ...]:
    """Evidence ``dia_id`` values, with ``;``-packed entries (``"D8:6; D9:17"``) split.

    Raises:
        DatasetFormatError: ``raw`` is not a list of strings (``where`` names the field).
    """
    where = where or Where(path="evidence")
    where.check(raw, list, "a list of dia_id strings")
    for i, item in enumerate(raw):
        (where / i).check(item, (str, int), "a dia_id string")
    return tuple(part.strip() for item in raw for part in str(item).split(";") if part.strip())


def _questions(sample_id: str, qa: list[Any], include_adversarial: bool, where: Where) -> tuple[Question, ...]:
    questions = []
    for idx, item in enumerate(qa):
        here = where / idx
        here.check(item, dict, "a question object {question, answer, category, evidence}")
        category = str(here.get(item, "category", (str, int)))
        # never item["adversarial_answer"]: that is the wrong answer
        answer = here.get(item, "answer", (str, int, float, list), "text, a number or a list of answers",
                          required=False)
        if answer is not None and not isinstance(answer, (str, list)):
            answer = str(answer)
        excluded = "adversarial" if category == ADVERSARIAL_CATEGORY and not include_adversarial else None
        questions.append(Question(
            question_id=f"{sample_id}:q{idx:04d}",
            sample_id=sample_id,
            question=here.get(item, "question", str, nonempty=True),
            answer=answer,
            category=category,
            evidence=parse_evidence(here.get(item, "evidence", list, required=False, default=[]),
                                    here / "evidence"),
            excluded_reason=excluded,
        ))
    return tuple(questions)


def parse_conversation(index: int, item: Any) -> tuple[str, dict[str, Any], Where]:
    """Check the frame of the ``index``-th conversation of a LoCoMo-layout file.

    Shared with :mod:`aml_ray.datasets.locomo_refined`.

    Returns:
        ``(sample_id, conversation, where)``: the id, the ``conversation`` object and the item's place.

    Raises:
        DatasetFormatError: the item is not an object, or ``sample_id`` / ``conversation`` is missing or
            of the wrong type.
    """
    where = Where.item_of(index, item, "sample_id")
    where.check(item, dict, "a conversation object {sample_id, conversation, qa}")
    sample_id = where.get(item, "sample_id", str, nonempty=True)
    return sample_id, where.get(item, "conversation", dict), where


def parse_locomo(data: list[dict[str, Any]], *, include_adversarial: bool = False) -> list[Sample]:
    """Turn the decoded ``locomo10.json`` list into samples (mapping rules in the module docstring).

    Args:
        data: the file's top-level JSON list, one object per conversation.
        include_adversarial: score category 5 too (its answer is None for 444 of 446 items, so a scorer
            must then treat "no information" as correct); default False, as in Mem0-style reports.

    Returns:
        One sample per conversation, in file order.

    Raises:
        DatasetFormatError: a top level that is not a list, an item without ``sample_id``,
            ``conversation`` or a speaker, a field of the wrong type (``qa[i].question`` must be a
            non-empty string, ``category`` an integer or string, ``answer`` text, a number or a list,
            ``evidence`` a list), a malformed session date, a turn by an unknown speaker, or a session
            with turns but no date; the message names the item and the field.
    """
    Where("top level").check(data, list, "a JSON list of conversations")
    samples = []
    for index, item in enumerate(data):
        sample_id, conv, where = parse_conversation(index, item)
        samples.append(Sample(
            sample_id=sample_id,
            sessions=parse_sessions(sample_id, conv, where / "conversation"),
            questions=_questions(sample_id, where.get(item, "qa", list, required=False, default=[]),
                                 include_adversarial, where / "qa"),
            speakers=(conv["speaker_a"], conv["speaker_b"]),
        ))
    return samples


def load_locomo(path: str | os.PathLike[str], *, include_adversarial: bool = False) -> list[Sample]:
    """Load ``locomo10.json`` from disk (no hash check; see :func:`resolve_locomo_file`).

    Args:
        path: the JSON file.
        include_adversarial: see :func:`parse_locomo`.

    Returns:
        The samples; for the pinned file 10 samples, 5,882 turns, 1,986 questions (1,540 scorable).

    Raises:
        OSError: if the file cannot be read.
        DatasetFormatError: an empty file, invalid JSON or any error of :func:`parse_locomo`; the
            message names the file.
    """
    data = read_json(path, list, "a JSON list of conversations")
    with in_file(path):
        return parse_locomo(data, include_adversarial=include_adversarial)


def resolve_locomo_file(
    data: Path | None, *, cache_dir: Path, allow_hash_mismatch: bool = False
) -> Path:
    """Find a verified ``locomo10.json``: the given file, else the cache, else a fresh download.

    Args:
        data: a local copy passed by the operator (``--data PATH``), or None to use the cache. No
            local copy (such as ``../shared/datasets/locomo/locomo10.json``) is assumed.
        cache_dir: the dataset cache root; downloads go to ``cache_dir / "locomo/locomo10.json"``.
        allow_hash_mismatch: accept a file whose sha256 is not :data:`LOCOMO_SHA256`
            (``--allow-hash-mismatch``).

    Returns:
        The path of a file whose sha256 is :data:`LOCOMO_SHA256` (or any file, when allowed).

    Raises:
        DatasetHashMismatch: a file with another sha256, unless allowed.
        FileNotFoundError: ``data`` does not exist.
        DatasetDownloadError: no usable cached copy and the download failed; the message says to pass
            ``--data PATH``.
    """
    if data is not None:
        data = Path(data)
        if not data.is_file():
            raise FileNotFoundError(f"LoCoMo file {data} does not exist (--data PATH)")
        if not allow_hash_mismatch:
            verify_sha256(data, LOCOMO_SHA256)
        return data
    dest = Path(cache_dir) / LOCOMO_CACHE_NAME
    if dest.is_file():
        try:
            verify_sha256(dest, LOCOMO_SHA256)
            return dest
        except DatasetHashMismatch:
            if allow_hash_mismatch:
                return dest
            # a stale or damaged cache entry: download the pinned file again
    try:
        return fetch_to_cache(LOCOMO_URL, dest, LOCOMO_SHA256, allow_hash_mismatch=allow_hash_mismatch)
    except DatasetDownloadError as exc:
        raise DatasetDownloadError(
            LOCOMO_URL, f"{exc.reason}. No local copy is assumed (not even "
            "../shared/datasets/locomo/locomo10.json); pass --data PATH to a copy with sha256 "
            f"{LOCOMO_SHA256}"
        ) from exc
