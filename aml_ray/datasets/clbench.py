"""CL-bench adapter: ``CL-bench.jsonl`` -> :class:`~aml_ray.datasets.base.Sample` objects.

Source: Tencent-Hunyuan/CL-bench (context learning; data on Hugging Face ``tencent/CL-bench``, 1,899
tasks, not obtainable here). Layout (MANIFEST.md section 2 and the upstream README): one task per JSONL
line, ``{"messages": [{role, content}, ...], "rubrics": [...], "metadata": {"task_id", "context_id",
"context_category", "sub_category"}}``. A rubric item is a string or an object with ``rubric_criteria``
(upstream ``eval.py`` accepts both). Lines are split on ``\\n`` only: a JSON string may hold U+2028,
which ``str.splitlines()`` would treat as a line break.

Mapping decisions (the memory reading of a context-learning task):

- One sample (= one user_id) per task; ``sample_id`` = ``question_id`` = ``metadata.task_id``. Tasks
  that share a ``context_id`` still get their own memory, because their earlier turns differ.
- The last message must be the user's task turn. Everything before it (the system prompt, earlier user
  and assistant turns) is added, in order, as one session (key ``"context"``; no dates in the source, so
  no timestamps).
- The last user message usually holds the reference material followed by the task. It is split at its
  last blank line (``"\\n\\n"``): the text before goes to memory as a final user message, the last
  paragraph is the question sent to Search. When there is no blank line, or the last paragraph is
  longer than :data:`MAX_QUESTION_CHARS`, the message is not split: it is the question as a whole and
  nothing of it is added. This rule is ours and must be checked against the released file.
- Category = ``metadata.context_category`` (four upstream categories); ``rubric`` = the rubric items
  as text; the answer is None (CL-bench grades by rubric only); ``evidence`` = (``context_id``,
  ``sub_category``) for audit.

Scoring: the all-or-nothing rubric judge (:mod:`aml_ray.stages.rubric_all_or_nothing`): a task is
solved only when every rubric item is met (upstream ``eval.py``: score 1 iff all requirements hold).
"""

from __future__ import annotations

import os
from typing import Any

from aml_ray.contract import Message
from aml_ray.datasets.jsonl import iter_jsonl
from aml_ray.datasets.base import Question, Sample, Session

#: Longest final paragraph still treated as the task question when splitting the last user message.
MAX_QUESTION_CHARS = 4000
_ROLES = ("system", "user", "assistant")


def rubric_items(raw: Any, *, task_id: str) -> tuple[str, ...]:
    """Rubric items as text: strings as they are, objects by their ``rubric_criteria``.

    Examples:
        >>> rubric_items(["Names the card.", {"rubric_criteria": "Cites rule 4."}], task_id="t1")
        ('Names the card.', 'Cites rule 4.')

    Raises:
        ValueError: not a non-empty list, or an item that is neither; the message names the task.
    """
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"CL-bench task {task_id!r}: rubrics must be a non-empty list, got {str(raw)[:80]!r}")
    items = []
    for i, item in enumerate(raw):
        text = item.get("rubric_criteria") if isinstance(item, dict) else item
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"CL-bench task {task_id!r}: rubrics[{i}] is not text or {{rubric_criteria}}")
        items.append(text.strip())
    return tuple(items)


def split_task(content: str) -> tuple[str | None, str]:
    """Split the final user message into (material to memorise, question) by the module's rule.

    Examples:
        >>> split_task("RULE BOOK\\n\\nRule 1: gronks beat snarfs.\\n\\nWho wins, a gronk or a snarf?")
        ('RULE BOOK\\n\\nRule 1: gronks beat snarfs.', 'Who wins, a gronk or a snarf?')
        >>> split_task("Who wins?")
        (None, 'Who wins?')
    """
    text = content.strip()
    head, sep, tail = text.rpartition("\n\n")
    if not sep or not head.strip() or not tail.strip() or len(tail.strip()) > MAX_QUESTION_CHARS:
        return None, text
    return head.rstrip(), tail.strip()


def parse_task(obj: dict[str, Any], *, line: int = 0) -> Sample:
    """One CL-bench task -> one sample (rules in the module docstring).

    Raises:
        ValueError: a missing field, a bad role, an empty message, or a last message that is not the
            user's; the message names the task (or the line).
    """
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict) or not meta.get("task_id"):
        raise ValueError(f"CL-bench line {line}: no metadata.task_id")
    tid = str(meta["task_id"])
    category = meta.get("context_category")
    if not isinstance(category, str) or not category.strip():
        raise ValueError(f"CL-bench task {tid!r}: metadata.context_category is missing")
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"CL-bench task {tid!r}: messages must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str) \
                or not m["content"].strip():
            raise ValueError(f"CL-bench task {tid!r}: messages[{i}] must be {{role: {'|'.join(_ROLES)}, "
                             "content: non-empty text}")
    if messages[-1]["role"] != "user":
        raise ValueError(f"CL-bench task {tid!r}: the last message is {messages[-1]['role']!r}, not the user's task")
    material, question = split_task(messages[-1]["content"])
    context = [Message(role=m["role"], content=m["content"]) for m in messages[:-1]]
    if material is not None:
        context.append(Message(role="user", content=material))
    sessions = (Session(key="context", index=1, started_at_ms=0, messages=tuple(context)),) if context else ()
    q = Question(question_id=tid, sample_id=tid, question=question, answer=None, category=category.strip(),
                 rubric=rubric_items(obj.get("rubrics"), task_id=tid),
                 evidence=tuple(str(meta[k]) for k in ("context_id", "sub_category") if meta.get(k)))
    return Sample(sample_id=tid, sessions=sessions, questions=(q,))


def load_clbench(path: str | os.PathLike[str]) -> list[Sample]:
    """Load ``CL-bench.jsonl`` (one task per line; blank lines skipped).

    Returns:
        One sample per task, in file order (1,899 for the release, per its dataset card).

    Raises:
        OSError: the file cannot be read.
        ValueError: a line that is not JSON, a repeated task_id, or any error of :func:`parse_task`.
    """
    samples, seen = [], set()
    for n, obj in iter_jsonl(path):
        sample = parse_task(obj, line=n)
        if sample.sample_id in seen:
            raise ValueError(f"{path}:{n}: task_id {sample.sample_id!r} occurs twice")
        seen.add(sample.sample_id)
        samples.append(sample)
    return samples
