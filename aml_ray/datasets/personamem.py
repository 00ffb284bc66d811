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
import json
import os
import re
from pathlib import Path
from typing import Any

from aml_ray.contract import Message
from aml_ray.datasets.jsonl import iter_jsonl
from aml_ray.datasets.base import Question, Sample, Session

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


def parse_options(raw: str, *, question_id: str) -> tuple[str, ...]:
    """Parse ``all_options``: a JSON or Python-literal list of ``"(x) ..."`` strings.

    Examples:
        >>> parse_options('["(a) tea", "(b) coffee"]', question_id="q1")
        ('(a) tea', '(b) coffee')

    Raises:
        ValueError: not a list of labelled strings, or a label repeats; the message names the question.
    """
    value: Any = None
    for parse in (json.loads, ast.literal_eval):
        try:
            value = parse(raw)
            break
        except (ValueError, SyntaxError):
            continue
    if not isinstance(value, list) or not value or not all(isinstance(o, str) for o in value):
        raise ValueError(f"PersonaMem question {question_id!r}: all_options is not a list of strings: {raw[:120]!r}")
    labels = [option_label(o) for o in value]
    if None in labels:
        raise ValueError(f"PersonaMem question {question_id!r}: an option lacks its '(x)' label: {raw[:120]!r}")
    if len(set(labels)) != len(labels):
        raise ValueError(f"PersonaMem question {question_id!r}: option labels repeat: {labels}")
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
        ValueError: a line that is not JSON or not one of the two accepted forms, or a repeated id; the
            message names the line number.
    """
    out: dict[str, list[dict[str, Any]]] = {}
    for n, obj in iter_jsonl(path):
        if isinstance(obj, dict) and "shared_context_id" in obj and isinstance(obj.get("messages"), list):
            key, messages = str(obj["shared_context_id"]), obj["messages"]
        elif isinstance(obj, dict) and len(obj) == 1 and isinstance(next(iter(obj.values())), list):
            key, messages = next(iter(obj.items()))
        else:
            raise ValueError(f"{path}:{n}: expected {{\"<shared_context_id>\": [messages]}}")
        if key in out:
            raise ValueError(f"{path}:{n}: shared_context_id {key!r} occurs twice")
        out[key] = messages
    return out


def _messages(context_id: str, messages: list[Any]) -> tuple[Message, ...]:
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise ValueError(f"PersonaMem context {context_id!r} message {i}: expected {{role: "
                             f"{'|'.join(_ROLES)}, content}}, got {str(m)[:120]!r}")
        content = m.get("content")
        if isinstance(content, str) and content.strip():
            out.append(Message(role=m["role"], content=content))
    return tuple(out)


def parse_personamem(rows: list[dict[str, str]], contexts: dict[str, list[dict[str, Any]]]) -> list[Sample]:
    """Build samples from question rows and contexts (rules in the module docstring).

    Args:
        rows: the questions CSV as dicts (``csv.DictReader``), in file order.
        contexts: ``{shared_context_id: messages}`` (:func:`read_contexts`).

    Returns:
        One sample per (context, end index), in order of first appearance.

    Raises:
        ValueError: a missing column, an unknown context, an end index outside the context, a gold
            label that is not among the options, or a repeated question_id; the message names the row.
    """
    if rows:
        missing = [c for c in REQUIRED_COLUMNS if c not in rows[0]]
        if missing:
            raise ValueError(f"PersonaMem questions lack columns {missing}; required: {list(REQUIRED_COLUMNS)}")
    groups: dict[tuple[str, int], list[Question]] = {}
    seen: set[str] = set()
    for n, row in enumerate(rows, start=2):  # line 1 is the header
        qid = row["question_id"].strip()
        if not qid or qid in seen:
            raise ValueError(f"PersonaMem questions line {n}: question_id {qid!r} is empty or repeats")
        seen.add(qid)
        ctx = row["shared_context_id"].strip()
        if ctx not in contexts:
            raise ValueError(f"PersonaMem question {qid!r}: shared_context_id {ctx!r} is not in the contexts file")
        try:
            end = int(float(row["end_index_in_shared_context"]))
        except ValueError:
            raise ValueError(f"PersonaMem question {qid!r}: end_index_in_shared_context "
                             f"{row['end_index_in_shared_context']!r} is not a number") from None
        if not 0 < end <= len(contexts[ctx]):
            raise ValueError(f"PersonaMem question {qid!r}: end_index_in_shared_context {end} is outside the "
                             f"context's {len(contexts[ctx])} messages")
        options = parse_options(row["all_options"], question_id=qid)
        gold = option_label(row["correct_answer"]) or row["correct_answer"].strip().strip("()").lower()
        if gold not in {option_label(o) for o in options}:
            raise ValueError(f"PersonaMem question {qid!r}: correct_answer {row['correct_answer']!r} is not one of "
                             f"the option labels {[option_label(o) for o in options]}")
        sample_id = f"{ctx}-{end}"
        groups.setdefault((ctx, end), []).append(Question(
            question_id=qid, sample_id=sample_id, question=row["user_question_or_message"],
            answer=f"({gold})", category=row["question_type"].strip(), options=options,
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
        ValueError: a bad file name or any error of :func:`read_contexts` / :func:`parse_personamem`.
    """
    contexts = read_contexts(contexts_file_for(path))
    with open(path, encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    return parse_personamem(rows, contexts)
