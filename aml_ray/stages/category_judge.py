"""Scoring contract ``category_judge``: the binary LLM judge, with the question's category in its prompt.

Source: LongMemEval's ``src/evaluation/evaluate_qa.py`` grades with a prompt that depends on the
question type (temporal reasoning tolerates off-by-one day counts, knowledge updates accept older
information next to the updated answer, preference questions are graded against a rubric, abstention
questions are correct when the reply declines). The judge prompt file holds those variants and picks one
with the ``category`` variable; everything else is :func:`aml_ray.stages.judge.judge_rows` unchanged
(lenient label parsing, bounded re-asks, ``judge_error`` kept in the denominator, lexical F1/BLEU-1,
the offline lexical judge when no judge model is configured).

The variant of a row is its ``category`` (the LongMemEval question type), except that an abstention
question (an id holding ``"_abs"``, :func:`aml_ray.datasets.longmemeval.is_abstention`) gets the
``"abstention"`` variant whatever its type, as upstream's ``get_anscheck_prompt(..., abstention='_abs' in
question_id)``.

A prompt that declares the ``longmemeval-upstream`` protocol (:mod:`aml_ray.scoring.judge_protocols`,
e.g. ``longmemeval_judge_upstream``) is judged as upstream judges: its replies are read by
:func:`aml_ray.stages.scorers_upstream.yes_no_rows` (``'yes'`` in the lower-cased reply).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aml_ray.config import ModelEndpoint
from aml_ray.datasets.longmemeval import ABSTENTION, is_abstention
from aml_ray.prompts import Prompt
from aml_ray.scoring.judge_protocols import protocol_of
from aml_ray.stages.judge import judge_rows
from aml_ray.stages.scorers_upstream import yes_no_rows
from aml_ray.stages.scorers import register_scorer


@dataclass(frozen=True)
class BoundPrompt(Prompt):
    """A loaded prompt with some template values fixed (the hash stays the file's).

    Attributes:
        bound: values added to every :meth:`render` call (a call's own values win).
    """

    bound: dict[str, Any] = field(default_factory=dict)

    def render(self, **values: object) -> str:
        return super().render(**{**self.bound, **values})


def bind(prompt: Prompt, **values: Any) -> BoundPrompt:
    """``prompt`` with ``values`` fixed for every render.

    Examples:
        >>> from aml_ray.prompts import load_prompt
        >>> p = bind(load_prompt("longmemeval_judge"), category="abstention")
        >>> "cannot be answered" in p.render(question="Q", gold="G", answer="A")
        True
    """
    return BoundPrompt(name=prompt.name, text=prompt.text, sha256=prompt.sha256, path=prompt.path, bound=values)


@register_scorer("category_judge")
async def category_judge(rows: list[dict[str, Any]], *, endpoint: ModelEndpoint, model, prompt: Prompt,
                         f1_rule: str = "token", max_parse_retries: int = 2, judge_runs: int = 1) -> None:
    """Judge rows with the prompt rendered for each row's category; fills the rows in place.

    The rows are grouped by variant (their ``category``, or ``"abstention"`` for an abstention question)
    and each group goes to :func:`judge_rows` (or, for a ``longmemeval-upstream`` prompt,
    :func:`~aml_ray.stages.scorers_upstream.yes_no_rows`) with the prompt bound to
    ``category=<that variant>``; the groups are judged concurrently.

    Args:
        rows: question rows after Answer.
        endpoint: the judge endpoint (offline: the lexical judge, the category is not used).
        model: the judge model handle, or None when offline.
        prompt: the judge prompt; its template reads ``category`` (e.g. ``longmemeval_judge``).
        f1_rule: the lexical F1 rule (see :func:`judge_rows`).
        max_parse_retries: extra asks after an unparsable reply.
        judge_runs: how many times each answer is judged.

    Raises:
        ValueError: the prompt declares a protocol of another scorer.
    """
    protocol = protocol_of(prompt)
    if protocol.scorer not in (None, "category_judge"):
        raise ValueError(f"prompt {prompt.name!r} declares judge protocol {protocol.name!r}, which is for the "
                         f"{protocol.scorer!r} scorer, not category_judge")
    judge = yes_no_rows if protocol.reply == "yes_in_lowercase" else judge_rows
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(ABSTENTION if is_abstention(r["question_id"]) else r["category"], []).append(r)
    await asyncio.gather(*(
        judge(group, endpoint=endpoint, model=model, prompt=bind(prompt, category=category), f1_rule=f1_rule,
                   max_parse_retries=max_parse_retries, judge_runs=judge_runs)
        for category, group in groups.items()))
