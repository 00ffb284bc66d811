"""PersonaMem v1 adapter: ``questions_<size>.csv`` + ``shared_contexts_<size>.jsonl`` -> samples.

Source: bowen-upenn/PersonaMem (COLM 2025), released on Hugging Face (``bowen-upenn/PersonaMem``); the
files were not obtainable here, so the layout is the one MANIFEST.md section 2 records from code that
reads the release:

- ``questions_<size>.csv`` (``32k``, ``128k``, ``1M``), one multiple-choice question per row, with at
  least the columns ``persona_id, question_id, question_type, topic, shared_context_id,
  end_index_in_shared_context, user_question_or_message, correct_answer, all_options`` (more columns are
  ignored). ``correct_answer`` is an option label like ``"(c)"``; ``all_options`` is a JSON (or Python
  literal) list of options, each starting with its label: ``"(a) ..."``.
- ``shared_contexts_<size>.jsonl``, one context per line: ``{"<shared_context_id>": [{role, content},
  ...]}`` (the form ``{"shared_context_id": ..., "messages": [...]}`` is accepted too). Lines are split on
  ``\\n`` only, never on other Unicode line breaks that may sit inside JSON strings.

Mapping decisions:

- A question sees the context only up to ``end_index_in_shared_context`` (``messages[:end]``, the
  slicing of the upstream loaders): anything later would leak the future. Questions that share a
  context *and* an end index share one sample (one user_id, ``sample_id = "<context>-<end>"``);
  questions at other end indexes get their own sample, so no sample ever holds later messages. (A
  Streaming variant would add one context incrementally and search each question at its step.)
- The context prefix is one session (key ``"context"``); the source has no dates, so messages carry no
  timestamp and ``started_at_ms`` is 0. Roles ``user``, ``assistant`` and ``system`` are kept as they
  are (the leading system message holds the persona, which upstream also shows the model); a message
  with empty content is dropped (the contract requires non-empty content).
- The question text is ``user_question_or_message``; the options go to Search as ``options`` and into
  the answer prompt; the gold is the label (``"(c)"``); category = ``question_type``; ``question_id``
  is the CSV's ``question_id``.

Scoring (deterministic option match, :mod:`aml_ray.stages.single_choice`): the one label the answer
gives must be the gold label.
"""

from __future__ import annotations

import ast
import csv
import io
import json
import os
import re
from pathlib import Path
from typing import Any

from aml_ray.contract import Message
from aml_ray.datasets.jsonl import iter_jsonl
from aml_ray.datasets.base import Question, Sample, Session
from aml_ray.datasets.validate import Where, describe, in_file, read_text

#: Columns every questions CSV must have (MANIFEST.md section 2).
REQUIRED_COLUMNS = ("persona_id", "question_id", "question_type", "topic", "shared_context_id",
                    "end_index_in_shared_context", "user_question_or_message", "correct_answer", "all_options")
_LABEL = re.compile(r"^\s*\(([A-Za-z])\)")
_ROLES = ("user", "assistant", "system")


def contexts_file_for(questions_csv: str | os.PathLike[str]) -> Path:
    """The contexts file beside a questions file: ``questions_32k.csv`` -> ``shared_contexts_32k.jsonl``.

    Raises:
        ValueError: the file name is not ``questions_<size>.csv``.
    """
    p = Path(questions_csv)
    m = re.fullmatch(r"questions_(.+)\.csv", p.name)
    if not m:
        raise ValueError(f"PersonaMem questions file must be named questions_<size>.csv, got {p.name!r}")
    return p.with_name(f"shared_contexts_{m.group(1)}.jsonl")


def parse_options(raw: str, *, question_id: str, where: Where | None = None) -> tuple[str, ...]:
    """Parse ``all_options``: a JSON or Python-literal list of ``"(x) ..."`` strings.

    Examples:
        >>> parse_options('["(a) tea", "(b) coffee"]', question_id="q1")
        ('(a) tea', '(b) coffee')

    Args:
        raw: the cell's text.
        question_id: the question, for the error message.
        where: the cell's place in the file (default: question ``question_id``, field ``all_options``).

    Raises:
        DatasetFormatError: not a list of labelled strings, or a label repeats; the message names the
            question.
    """
    here = where or Where(f"question {question_id!r}", "all_options")
    value: Any = None
    for parse in (json.loads, ast.literal_eval):
        try:
            value = parse(raw)
            break
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
    if not isinstance(value, list) or not value or not all(isinstance(o, str) for o in value):
        raise here.error(f"all_options is not a list of strings: {raw[:120]!r}; expected a JSON list like "
                         "'[\"(a) ...\", \"(b) ...\"]'")
    labels = [option_label(o) for o in value]
    if None in labels:
        raise here.error(f"an option lacks its '(x)' label: {raw[:120]!r}")
    if len(set(labels)) != len(labels):
        raise here.error(f"option labels repeat: {labels}")
    return tuple(o.strip() for o in value)


def option_label(text: str) -> str | None:
    """The lowercase letter of an option or answer that starts with ``(x)``, else None.

    Examples:
        >>> option_label("(C) I remember you prefer tea.")
        'c'
    """
    m = _LABEL.match(text or "")
    return m.group(1).lower() if m else None


def read_contexts(path: str | os.PathLike[str]) -> dict[str, list[dict[str, Any]]]:
    """Read ``shared_contexts_<size>.jsonl`` into ``{shared_context_id: messages}``.

    Raises:
        DatasetFormatError: an empty file, a line that is not JSON or not one of the two accepted forms,
            a message that is not ``{role, content}``, or a repeated id; the message names the file and
            the line.
    """
    out: dict[str, list[dict[str, Any]]] = {}
    with in_file(path):
        for n, obj in iter_jsonl(path, 'one {"<shared_context_id>": [messages]} object per line'):
            where = Where(f"line {n}")
            if isinstance(obj, dict) and "shared_context_id" in obj and isinstance(obj.get("messages"), list):
                key, messages, where = str(obj["shared_context_id"]), obj["messages"], where / "messages"
            elif isinstance(obj, dict) and len(obj) == 1 and isinstance(next(iter(obj.values())), list):
                key, messages = next(iter(obj.items()))
                where = where / key
            else:
                raise where.error(f'expected {{"<shared_context_id>": [messages]}}, got {describe(obj)}')
            if key in out:
                raise where.error(f"shared_context_id {key!r} occurs twice")
            _check_messages(messages, where)
            out[key] = messages
    return out


def _check_messages(messages: list[Any], where: Where) -> None:
    for i, m in enumerate(messages):
        (where / i).check(m, dict, f"a message {{role: {'|'.join(_ROLES)}, content}}")
        if m.get("role") not in _ROLES:
            raise (where / i / "role").error(f"role {m.get('role')!r}; expected one of {list(_ROLES)}")
        (where / i).get(m, "content", str, required=False)


def _messages(context_id: str, messages: list[Any]) -> tuple[Message, ...]:
    _check_messages(messages, Where(f"context {context_id!r}"))
    return tuple(Message(role=m["role"], content=m["content"]) for m in messages
                 if isinstance(m.get("content"), str) and m["content"].strip())


def _check_columns(columns: Any) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in (columns or ())]
    if missing:
        raise Where("header").error(f"lacks columns {missing}; required: {list(REQUIRED_COLUMNS)}")


def parse_personamem(rows: list[dict[str, str]], contexts: dict[str, list[dict[str, Any]]],
                     lines: list[int] | None = None) -> list[Sample]:
    """Build samples from question rows and contexts (rules in the module docstring).

    Args:
        rows: the questions CSV as dicts (``csv.DictReader``), in file order.
        contexts: ``{shared_context_id: messages}`` (:func:`read_contexts`).
        lines: each row's line number in the file, for error messages (default: a row per line after
            the header).

    Returns:
        One sample per (context, end index), in order of first appearance.

    Raises:
        DatasetFormatError: a missing column or cell, an unknown context, an end index outside the
            context, a gold label that is not among the options, or a repeated question_id; the message
            names the row (its CSV line and question_id) and the column.
    """
    if rows:
        _check_columns(rows[0])
    groups: dict[tuple[str, int], list[Question]] = {}
    seen: set[str] = set()
    for i, row in enumerate(rows):
        where = Where.item_of(lines[i] if lines else i + 2, row, "question_id", noun="line")  # line 1: header
        cell = {c: where.get(row, c, str, "a cell (the row has fewer cells than the header)").strip()
                for c in REQUIRED_COLUMNS}
        qid = cell["question_id"]
        if not qid or qid in seen:
            raise (where / "question_id").error(f"question_id {qid!r} is empty or repeats")
        seen.add(qid)
        ctx = cell["shared_context_id"]
        if ctx not in contexts:
            raise (where / "shared_context_id").error(f"shared_context_id {ctx!r} is not in the contexts file")
        try:
            end = int(float(cell["end_index_in_shared_context"]))
        except (ValueError, OverflowError):
            raise (where / "end_index_in_shared_context").error(
                f"end_index_in_shared_context {cell['end_index_in_shared_context']!r} is not a number") from None
        if not 0 < end <= len(contexts[ctx]):
            raise (where / "end_index_in_shared_context").error(
                f"end_index_in_shared_context {end} is outside the context's {len(contexts[ctx])} messages")
        options = parse_options(cell["all_options"], question_id=qid, where=where / "all_options")
        gold = option_label(cell["correct_answer"]) or cell["correct_answer"].strip("()").lower()
        if gold not in {option_label(o) for o in options}:
            raise (where / "correct_answer").error(
                f"correct_answer {row['correct_answer']!r} is not one of the option labels "
                f"{[option_label(o) for o in options]}")
        sample_id = f"{ctx}-{end}"
        groups.setdefault((ctx, end), []).append(Question(
            question_id=qid, sample_id=sample_id, question=row["user_question_or_message"],
            answer=f"({gold})", category=cell["question_type"], options=options,
            evidence=(f"{ctx}[:{end}]",)))
    samples = []
    for (ctx, end), questions in groups.items():
        session = Session(key="context", index=1, started_at_ms=0, messages=_messages(ctx, contexts[ctx][:end]))
        samples.append(Sample(sample_id=f"{ctx}-{end}", sessions=(session,) if session.messages else (),
                              questions=tuple(questions)))
    return samples


def load_personamem(path: str | os.PathLike[str]) -> list[Sample]:
    """Load a PersonaMem v1 split from its questions CSV (the contexts file is found beside it).

    Args:
        path: ``questions_<size>.csv``; ``shared_contexts_<size>.jsonl`` must be in the same directory.

    Returns:
        The samples (see :func:`parse_personamem`).

    Raises:
        OSError: a file cannot be read.
        ValueError: a bad file name.
        DatasetFormatError: an empty questions file or any error of :func:`read_contexts` /
            :func:`parse_personamem`; the message names the file.
    """
    contexts_file = contexts_file_for(path)
    text = read_text(path, f"a CSV header with the columns {list(REQUIRED_COLUMNS)}, then one question per row")
    rows, lines = [], []
    with in_file(path):
        reader = csv.DictReader(io.StringIO(text, newline=""))
        end = 1  # the header's line
        try:
            for r in reader:  # a row starts on the line after the previous one ends (a cell may hold newlines)
                rows.append(r)
                lines.append(end + 1)
                end = reader.line_num
        except csv.Error as exc:
            raise Where(f"line {reader.line_num}").error(f"not CSV ({exc})") from None
        _check_columns(reader.fieldnames)
        if not rows:
            raise Where("header").error("no question rows after the header; expected one question per row")
    contexts = read_contexts(contexts_file)
    with in_file(path):
        return parse_personamem(rows, contexts, lines)
