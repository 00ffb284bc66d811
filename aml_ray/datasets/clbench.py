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
from aml_ray.datasets.validate import Where, describe, in_file

#: Longest final paragraph still treated as the task question when splitting the last user message.
MAX_QUESTION_CHARS = 4000
_ROLES = ("system", "user", "assistant")


def rubric_items(raw: Any, *, task_id: str, where: Where | None = None) -> tuple[str, ...]:
    """Rubric items as text: strings as they are, objects by their ``rubric_criteria``.

    Examples:
        >>> rubric_items(["Names the card.", {"rubric_criteria": "Cites rule 4."}], task_id="t1")
        ('Names the card.', 'Cites rule 4.')

    Args:
        raw: the task's ``rubrics``.
        task_id: the task, for the error message.
        where: the field's place in the file (default: task ``task_id``, field ``rubrics``).

    Raises:
        DatasetFormatError: not a non-empty list, or an item that is neither; the message names the task.
    """
    where = where or Where(f"task {task_id!r}", "rubrics")
    where.check(raw, list, "a non-empty list of rubric items", nonempty=True)
    items = []
    for i, item in enumerate(raw):
        text = item.get("rubric_criteria") if isinstance(item, dict) else item
        if not isinstance(text, str) or not text.strip():
            raise (where / i).error(f"expected text or {{rubric_criteria: text}}, got {describe(item)}")
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


def parse_task(obj: Any, *, line: int = 0) -> Sample:
    """One CL-bench task -> one sample (rules in the module docstring).

    Args:
        obj: the decoded line.
        line: its line number in the file, for error messages.

    Raises:
        DatasetFormatError: a missing field or one of the wrong type, a bad role, an empty message, or a
            last message that is not the user's; the message names the line, the task and the field.
    """
    where = Where.item_of(line, obj.get("metadata") if isinstance(obj, dict) else None, "task_id", noun="line")
    where.check(obj, dict, "a task object {messages, rubrics, metadata}")
    meta = where.get(obj, "metadata", dict, "an object {task_id, context_id, context_category, sub_category}")
    tid = str((where / "metadata").get(meta, "task_id", (str, int), nonempty=True))
    category = (where / "metadata").get(meta, "context_category", str, nonempty=True)
    messages = where.get(obj, "messages", list, "a non-empty list of messages {role, content}", nonempty=True)
    for i, m in enumerate(messages):
        here = where / "messages" / i
        here.check(m, dict, f"a message {{role: {'|'.join(_ROLES)}, content}}")
        if m.get("role") not in _ROLES:
            raise (here / "role").error(f"role {m.get('role')!r}; expected one of {list(_ROLES)}")
        here.get(m, "content", str, "non-empty text", nonempty=True)
    if messages[-1]["role"] != "user":
        raise (where / "messages" / (len(messages) - 1) / "role").error(
            f"the last message is {messages[-1]['role']!r}, not the user's task")
    material, question = split_task(messages[-1]["content"])
    context = [Message(role=m["role"], content=m["content"]) for m in messages[:-1]]
    if material is not None:
        context.append(Message(role="user", content=material))
    sessions = (Session(key="context", index=1, started_at_ms=0, messages=tuple(context)),) if context else ()
    q = Question(question_id=tid, sample_id=tid, question=question, answer=None, category=category.strip(),
                 rubric=rubric_items(obj.get("rubrics"), task_id=tid, where=where / "rubrics"),
                 evidence=tuple(str(meta[k]) for k in ("context_id", "sub_category") if meta.get(k)))
    return Sample(sample_id=tid, sessions=sessions, questions=(q,))


def load_clbench(path: str | os.PathLike[str]) -> list[Sample]:
    """Load ``CL-bench.jsonl`` (one task per line; blank lines skipped).

    Returns:
        One sample per task, in file order (1,899 for the release, per its dataset card).

    Raises:
        OSError: the file cannot be read.
        DatasetFormatError: an empty file, a line that is not JSON, a repeated task_id, or any error of
            :func:`parse_task`; the message names the file and the line.
    """
    samples, seen = [], set()
    with in_file(path):
        for n, obj in iter_jsonl(path, "one CL-bench task object per line"):
            sample = parse_task(obj, line=n)
            if sample.sample_id in seen:
                raise Where(f"line {n}", "metadata.task_id").error(f"task_id {sample.sample_id!r} occurs twice")
            seen.add(sample.sample_id)
            samples.append(sample)
    return samples
