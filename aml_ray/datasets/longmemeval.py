"""LongMemEval adapter: LongMemEval-S (cleaned) and oracle instances -> :class:`~aml_ray.datasets.base.Sample`.

Source: xiaowu0162/LongMemEval (ICLR 2025); schema notes in ``shared/datasets/MANIFEST.md`` section 3.3.
A file is either a JSON list of instances (``longmemeval_s_cleaned.json``, the oracle file, our
reassembled oracle) or a directory of per-instance JSON objects (the ``s_sample/`` re-host files).

Mapping decisions:

- One sample (= one user_id) per question instance; ``sample_id`` is the ``question_id``
  (``"f685340e_abs"``). Upstream evaluates every question against its own haystack, so no two
  questions share a memory.
- Sessions are ``haystack_sessions`` with their ``haystack_session_ids`` (the session key) and
  ``haystack_dates``. They are added in time order (a stable sort by date and time): the oracle is
  not sorted (34 of its 500 instances are out of order) and S is sorted by day only (3 of the 7 sample
  instances have sessions of one day out of order), while a memory system should see a user's history
  as it happened and timestamps should never run backwards. 44 oracle instances hold a session dated
  after the ``question_date``; upstream keeps them, and so do we.
- Dates look like ``"2023/05/30 (Tue) 23:40"``; upstream gives no time zone, so the wall time is taken
  **as UTC** (as for LoCoMo). The weekday must agree with the date. A malformed date raises
  ``ValueError`` naming the instance, the field (``haystack_dates[3]`` or ``question_date``) and the value.
- Each turn becomes ``Message(role, content, timestamp)`` with the source role (``user`` /
  ``assistant``) and content unchanged; timestamp = session start (ms) + turn index, as for LoCoMo.
  ``has_answer`` (turn-level evidence) is not sent.
- The question: ``question_id`` and text unchanged; ``answer`` as text (32 oracle answers are ints);
  ``question_date`` is kept as the source text and goes into the answer prompt as the current date;
  ``evidence`` = ``answer_session_ids`` (audit only).
- Category: the ``question_type`` (six types), except that a question whose id ends in ``_abs`` is in the
  ``"abstention"`` category (upstream marks abstention only by that suffix; its judge asks whether the
  answer correctly refuses). Per-type accuracy in our tables therefore excludes the 30 abstention
  questions, which are reported on their own row.

Metrics (upstream ``src/evaluation/print_qa_metrics.py``): judge accuracy per category, the
task-averaged accuracy (unweighted mean over the six question types, declared in the suite file) and
overall accuracy (micro average).
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aml_ray.contract import Message
from aml_ray.datasets.base import Question, Sample, Session

#: The six upstream question types (MANIFEST.md 3.3), in upstream order.
QUESTION_TYPES = ("single-session-user", "single-session-assistant", "single-session-preference",
                  "multi-session", "temporal-reasoning", "knowledge-update")
#: Category of the questions whose id ends in ``_abs`` (upstream's abstention marker).
ABSTENTION = "abstention"
ABSTENTION_SUFFIX = "_abs"
#: Every category this adapter produces.
CATEGORIES = QUESTION_TYPES + (ABSTENTION,)

_DATE = re.compile(r"^(\d{4})/(\d{2})/(\d{2}) \((Mon|Tue|Wed|Thu|Fri|Sat|Sun)\) (\d{2}):(\d{2})$")
_WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_REQUIRED = ("question_id", "question_type", "question", "answer", "question_date", "haystack_dates",
             "haystack_session_ids", "haystack_sessions")


def parse_longmemeval_date(value: Any, *, question_id: str, field: str) -> int:
    """Parse a LongMemEval date into UTC Unix milliseconds.

    Examples:
        >>> parse_longmemeval_date("2023/05/30 (Tue) 23:40", question_id="q1", field="question_date")
        1685490000000

    Args:
        value: the field's value, e.g. ``"2023/05/30 (Tue) 23:40"``.
        question_id: the instance, for the error message.
        field: the field name (``"question_date"``, ``"haystack_dates[3]"``), for the error message.

    Returns:
        Milliseconds since the Unix epoch; the wall time is taken as UTC (the source has no zone).

    Raises:
        ValueError: not a string in that format, not a real date, or a weekday that disagrees with the
            date; the message names the instance, the field and the value.
    """
    def bad(why: str) -> ValueError:
        return ValueError(f"LongMemEval instance {question_id!r}: malformed {field}={value!r} ({why}); "
                          "expected a date like '2023/05/30 (Tue) 23:40'")

    if not isinstance(value, str):
        raise bad("not a string")
    m = _DATE.match(value)
    if not m:
        raise bad("does not match 'YYYY/MM/DD (Ddd) HH:MM'")
    year, month, day, weekday, hour, minute = m.groups()
    try:
        dt = datetime(int(year), int(month), int(day), int(hour), int(minute), tzinfo=timezone.utc)
    except ValueError as exc:
        raise bad(str(exc)) from None
    if _WEEKDAYS[dt.weekday()] != weekday:
        raise bad(f"{dt.date()} is a {_WEEKDAYS[dt.weekday()]}, not a {weekday}")
    return int(dt.timestamp()) * 1000


def category_of(question_id: str, question_type: str) -> str:
    """The category of a question: ``"abstention"`` for ``*_abs`` ids, else its question type.

    Examples:
        >>> category_of("f685340e_abs", "knowledge-update")
        'abstention'
        >>> category_of("001be529", "single-session-user")
        'single-session-user'

    Raises:
        ValueError: an unknown question type (the message lists the six known ones).
    """
    if question_type not in QUESTION_TYPES:
        raise ValueError(f"LongMemEval instance {question_id!r}: unknown question_type {question_type!r}; "
                         f"expected one of {list(QUESTION_TYPES)}")
    return ABSTENTION if question_id.endswith(ABSTENTION_SUFFIX) else question_type


def parse_instance(item: dict[str, Any]) -> Sample:
    """Turn one LongMemEval instance into a sample (mapping rules in the module docstring).

    Args:
        item: one decoded instance with the fields of MANIFEST.md 3.3.

    Returns:
        One sample with its sessions in time order and its single question.

    Raises:
        ValueError: a missing field, lists of different lengths, a malformed date, an unknown role or
            question type, or an empty turn; the message names the instance and the field.
    """
    if not isinstance(item, dict):
        raise ValueError(f"LongMemEval instance must be a JSON object, got {type(item).__name__}")
    qid = item.get("question_id")
    if not isinstance(qid, str) or not qid:
        raise ValueError(f"LongMemEval instance without a question_id: keys {sorted(item)[:12]}")
    missing = [k for k in _REQUIRED if k not in item]
    if missing:
        raise ValueError(f"LongMemEval instance {qid!r}: missing fields {missing}")
    dates, ids, sessions = item["haystack_dates"], item["haystack_session_ids"], item["haystack_sessions"]
    if not (isinstance(dates, list) and isinstance(ids, list) and isinstance(sessions, list)):
        raise ValueError(f"LongMemEval instance {qid!r}: haystack_dates, haystack_session_ids and "
                         "haystack_sessions must be lists")
    if not len(dates) == len(ids) == len(sessions):
        raise ValueError(f"LongMemEval instance {qid!r}: haystack_dates ({len(dates)}), haystack_session_ids "
                         f"({len(ids)}) and haystack_sessions ({len(sessions)}) differ in length")
    if len(set(map(str, ids))) != len(ids):
        raise ValueError(f"LongMemEval instance {qid!r}: haystack_session_ids are not unique")
    starts = [parse_longmemeval_date(d, question_id=qid, field=f"haystack_dates[{i}]") for i, d in enumerate(dates)]
    parse_longmemeval_date(item["question_date"], question_id=qid, field="question_date")
    order = sorted(range(len(sessions)), key=lambda i: starts[i])  # stable: same-date sessions keep file order
    out: list[Session] = []
    for i in order:
        messages = []
        for j, turn in enumerate(sessions[i]):
            role, content = turn.get("role"), turn.get("content")
            if role not in ("user", "assistant"):
                raise ValueError(f"LongMemEval instance {qid!r}: haystack_sessions[{i}][{j}] has role {role!r}, "
                                 "expected 'user' or 'assistant'")
            if not isinstance(content, str) or not content.strip():
                raise ValueError(f"LongMemEval instance {qid!r}: haystack_sessions[{i}][{j}] has empty content")
            messages.append(Message(role=role, content=content, timestamp=starts[i] + j))
        out.append(Session(key=str(ids[i]), index=len(out) + 1, started_at_ms=starts[i], messages=tuple(messages)))
    answer = item["answer"]
    question = Question(
        question_id=qid, sample_id=qid, question=str(item["question"]),
        answer=answer if isinstance(answer, str) else str(answer),
        category=category_of(qid, item["question_type"]),
        evidence=tuple(str(s) for s in item.get("answer_session_ids") or ()),
        question_date=item["question_date"],
    )
    return Sample(sample_id=qid, sessions=tuple(out), questions=(question,))


def parse_longmemeval(data: list[dict[str, Any]]) -> list[Sample]:
    """Turn a decoded LongMemEval file (a list of instances) into samples, in file order.

    Raises:
        ValueError: the data is not a list, a question_id repeats, or any error of :func:`parse_instance`.
    """
    if not isinstance(data, list):
        raise ValueError(f"LongMemEval file must hold a JSON list of instances, got {type(data).__name__}")
    samples = [parse_instance(item) for item in data]
    seen: set[str] = set()
    for s in samples:
        if s.sample_id in seen:
            raise ValueError(f"LongMemEval question_id {s.sample_id!r} occurs twice")
        seen.add(s.sample_id)
    return samples


def load_longmemeval(path: str | os.PathLike[str]) -> list[Sample]:
    """Load LongMemEval instances from a JSON list file or a directory of per-instance files.

    Args:
        path: ``longmemeval_s_cleaned.json`` / the oracle file (a JSON list), or a directory whose
            ``*.json`` files each hold one instance (read in sorted file-name order).

    Returns:
        One sample per instance: 500 for the full S or oracle files (MANIFEST.md 3.3), 7 for ``s_sample/``.

    Raises:
        OSError: the path cannot be read.
        ValueError: invalid JSON or any error of :func:`parse_longmemeval`.
    """
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.json"))
        if not files:
            raise ValueError(f"LongMemEval directory {path} holds no *.json instance files")
        data = []
        for f in files:
            with open(f, encoding="utf-8") as fh:
                obj = json.load(fh)
            data.extend(obj if isinstance(obj, list) else [obj])
    else:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    return parse_longmemeval(data)
