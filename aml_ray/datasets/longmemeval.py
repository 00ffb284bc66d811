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
  ``DatasetFormatError`` naming the instance, the field (``haystack_dates[3]`` or ``question_date``) and the value.
- Each turn becomes ``Message(role, content, timestamp)`` with the source role (``user`` /
  ``assistant``) and content unchanged; timestamp = session start (ms) + turn index, as for LoCoMo.
  ``has_answer`` (turn-level evidence) is not sent.
- Oddities of the public S file (some instances hold a turn whose content is empty, or a session id
  twice) are loaded, as upstream loads every instance, and each is recorded in the sample's ``notes``
  (run.json ``dataset.load_notes``), so no question is dropped and nothing changes silently: an empty
  (blank) turn is skipped (an Add message needs text), a session left with no turn is skipped, and a
  repeated session id gets ``-2``, ``-3``, ... in file order (``"ultrachat_1"`` then ``"ultrachat_1-2"``), so
  every session keeps its own session_id.
- The question: ``question_id`` and text unchanged; ``answer`` as text (32 oracle answers are ints);
  ``question_date`` is kept as the source text and goes into the answer prompt as the current date;
  ``evidence`` = ``answer_session_ids`` (audit only).
- Category: the ``question_type`` (six types), for abstention questions too, as upstream groups them
  (``src/evaluation/print_qa_metrics.py`` puts each question in ``type2acc[question_type]``). An
  abstention question is one whose id holds ``_abs`` (:func:`is_abstention`; upstream's only marker, in
  ``evaluate_qa.py`` and ``print_qa_metrics.py``): the judge asks whether its answer correctly declines
  (:mod:`aml_ray.stages.category_judge`), and the suite reports it on its own line too.

Metrics (upstream ``print_qa_metrics.py``): judge accuracy per question type (abstention questions
included), the task-averaged accuracy (unweighted mean over the six types), overall accuracy (micro
average over all questions) and abstention accuracy (mean over the ``_abs`` questions); the suite file
declares the last two secondary metrics (:func:`aml_ray.suite.secondary_metrics`).
"""

from __future__ import annotations

import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aml_ray.contract import Message
from aml_ray.datasets.base import Question, Sample, Session
from aml_ray.datasets.validate import DatasetFormatError, Where, in_file, read_json

#: The six upstream question types (MANIFEST.md 3.3), in upstream order.
QUESTION_TYPES = ("single-session-user", "single-session-assistant", "single-session-preference",
                  "multi-session", "temporal-reasoning", "knowledge-update")
#: Name of the abstention questions' judge variant and secondary metric (upstream: ids holding ``_abs``).
ABSTENTION = "abstention"
#: Upstream's abstention marker: ``'_abs' in question_id`` (evaluate_qa.py, print_qa_metrics.py).
ABSTENTION_MARKER = "_abs"
#: Every category this adapter produces (abstention questions stay in their type).
CATEGORIES = QUESTION_TYPES

_DATE = re.compile(r"^(\d{4})/(\d{2})/(\d{2}) \((Mon|Tue|Wed|Thu|Fri|Sat|Sun)\) (\d{2}):(\d{2})$")
_WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_REQUIRED = ("question_id", "question_type", "question", "answer", "question_date", "haystack_dates",
             "haystack_session_ids", "haystack_sessions")


def parse_longmemeval_date(value: Any, *, question_id: str, field: str, where: Where | None = None) -> int:
    """Parse a LongMemEval date into UTC Unix milliseconds.

    Examples:
        >>> parse_longmemeval_date("2023/05/30 (Tue) 23:40", question_id="q1", field="question_date")
        1685490000000

    Args:
        value: the field's value, e.g. ``"2023/05/30 (Tue) 23:40"``.
        question_id: the instance, for the error message.
        field: the field name (``"question_date"``, ``"haystack_dates[3]"``), for the error message.
        where: the field's place in the file (default: instance ``question_id``, field ``field``).

    Returns:
        Milliseconds since the Unix epoch; the wall time is taken as UTC (the source has no zone).

    Raises:
        DatasetFormatError: not a string in that format, not a real date, or a weekday that disagrees
            with the date; the message names the instance, the field and the value.
    """
    here = where or Where(f"instance {question_id!r}", field)

    def bad(why: str) -> DatasetFormatError:
        return here.error(f"malformed {field}={value!r} ({why}); expected a date like '2023/05/30 (Tue) 23:40'")

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


def is_abstention(question_id: str) -> bool:
    """Whether a question is an abstention question: its id holds ``"_abs"`` (upstream's test).

    Examples:
        >>> is_abstention("f685340e_abs"), is_abstention("001be529")
        (True, False)
    """
    return ABSTENTION_MARKER in question_id


def category_of(question_id: str, question_type: str, where: Where | None = None) -> str:
    """The category of a question: its question type (an abstention question stays in its type).

    Examples:
        >>> category_of("f685340e_abs", "knowledge-update")
        'knowledge-update'
        >>> category_of("001be529", "single-session-user")
        'single-session-user'

    Raises:
        DatasetFormatError: an unknown question type (the message lists the six known ones).
    """
    if question_type not in QUESTION_TYPES:
        raise (where or Where(f"instance {question_id!r}", "question_type")).error(
            f"unknown question_type {question_type!r}; expected one of {list(QUESTION_TYPES)}")
    return question_type


def parse_instance(item: dict[str, Any], index: int = 0) -> Sample:
    """Turn one LongMemEval instance into a sample (mapping rules in the module docstring).

    Args:
        item: one decoded instance with the fields of MANIFEST.md 3.3.
        index: its 0-based position in the file, for error messages.

    Returns:
        One sample with its sessions in time order and its single question.

    Raises:
        DatasetFormatError: a missing field or one of the wrong type, lists of different lengths, a
            malformed date, an unknown role or question type, or a turn whose content is not text; the
            message names the item (index and question_id) and the field.
    """
    where = Where.item_of(index, item, "question_id")
    where.check(item, dict, "a JSON object (one instance)")
    qid = where.get(item, "question_id", str, nonempty=True)
    for key in _REQUIRED:
        if key not in item:
            raise (where / key).error(f"missing; an instance needs {list(_REQUIRED)}")
    dates = where.get(item, "haystack_dates", list)
    ids = where.get(item, "haystack_session_ids", list)
    sessions = where.get(item, "haystack_sessions", list)
    if not len(dates) == len(ids) == len(sessions):
        raise where.error(f"haystack_dates ({len(dates)}), haystack_session_ids ({len(ids)}) and "
                          f"haystack_sessions ({len(sessions)}) differ in length")
    for i, sid in enumerate(ids):
        (where / "haystack_session_ids" / i).check(sid, (str, int), "a session id")
    notes: list[str] = []
    keys = _unique_keys([str(sid) for sid in ids], notes)
    starts = [parse_longmemeval_date(d, question_id=qid, field=f"haystack_dates[{i}]",
                                     where=where / "haystack_dates" / i) for i, d in enumerate(dates)]
    parse_longmemeval_date(item["question_date"], question_id=qid, field="question_date",
                           where=where / "question_date")
    order = sorted(range(len(sessions)), key=lambda i: starts[i])  # stable: same-date sessions keep file order
    out: list[Session] = []
    for i in order:
        messages = []
        turns = (where / "haystack_sessions" / i).check(sessions[i], list, "a list of turns {role, content}")
        for j, turn in enumerate(turns):
            here = where / "haystack_sessions" / i / j
            here.check(turn, dict, "a turn {role, content}")
            role, content = turn.get("role"), turn.get("content")
            if role not in ("user", "assistant"):
                raise (here / "role").error(f"role {role!r}; expected 'user' or 'assistant'")
            here.get(turn, "content", str, "text")
            if not content.strip():
                notes.append(f"haystack_sessions[{i}][{j}] (session {keys[i]!r}): empty {role} turn skipped")
                continue
            messages.append(Message(role=role, content=content, timestamp=starts[i] + j))
        if not messages:
            notes.append(f"haystack_sessions[{i}] (session {keys[i]!r}): no turn with text; session skipped")
            continue
        out.append(Session(key=keys[i], index=len(out) + 1, started_at_ms=starts[i], messages=tuple(messages)))
    answer = where.get(item, "answer", (str, int, float), "the gold answer as text or a number")
    question = Question(
        question_id=qid, sample_id=qid, question=where.get(item, "question", str, nonempty=True),
        answer=answer if isinstance(answer, str) else str(answer),
        category=category_of(qid, where.get(item, "question_type", str), where / "question_type"),
        evidence=tuple(str(s) for s in where.get(item, "answer_session_ids", list, required=False, default=[])),
        question_date=item["question_date"],
    )
    return Sample(sample_id=qid, sessions=tuple(out), questions=(question,), notes=tuple(notes))


def _unique_keys(ids: list[str], notes: list[str]) -> list[str]:
    """Session keys in file order: each id, a repeated one with ``-2``, ``-3``, ... (a note says so).

    Examples:
        >>> notes = []
        >>> _unique_keys(["a", "b", "a", "a-2"], notes)
        ['a', 'b', 'a-3', 'a-2']
        >>> notes
        ["haystack_session_ids[2]: session id 'a' repeats; loaded as 'a-3'"]
    """
    taken = set(ids)
    seen: set[str] = set()
    keys = []
    for i, sid in enumerate(ids):
        key = sid
        if sid in seen:
            n = 2
            while f"{sid}-{n}" in taken:
                n += 1
            key = f"{sid}-{n}"
            taken.add(key)
            notes.append(f"haystack_session_ids[{i}]: session id {sid!r} repeats; loaded as {key!r}")
        seen.add(sid)
        keys.append(key)
    return keys


def parse_longmemeval(data: list[dict[str, Any]]) -> list[Sample]:
    """Turn a decoded LongMemEval file (a list of instances) into samples, in file order.

    Raises:
        DatasetFormatError: the data is not a list, a question_id repeats, or any error of
            :func:`parse_instance`.
    """
    Where("top level").check(data, list, "a JSON list of instances")
    return _unique([parse_instance(item, i) for i, item in enumerate(data)])


def _unique(samples: list[Sample]) -> list[Sample]:
    seen: set[str] = set()
    for i, s in enumerate(samples):
        if s.sample_id in seen:
            raise Where(f"item {i}", "question_id").error(f"question_id {s.sample_id!r} occurs twice")
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
        DatasetFormatError: an empty directory, an empty file, invalid JSON or any error of
            :func:`parse_instance`; the message names the file.
    """
    path = Path(path)
    if not path.is_dir():
        data = read_json(path, list, "a JSON list of instances")
        with in_file(path):
            return parse_longmemeval(data)
    files = sorted(path.glob("*.json"))
    if not files:
        raise DatasetFormatError("holds no *.json instance files; expected one instance per file", file=path)
    samples = []
    for f in files:
        obj = read_json(f, (dict, list), "a JSON object (one instance) or a list of instances")
        with in_file(f):
            samples += [parse_instance(x, i) for i, x in enumerate(obj if isinstance(obj, list) else [obj])]
    with in_file(path):
        return _unique(samples)
