"""Scoring contract ``rubric_all_or_nothing``: a task counts only when every rubric item is met (CL-bench).

Source: CL-bench ``eval.py`` and paper (Tencent-Hunyuan/CL-bench): the grader checks the response
against every rubric requirement and gives 1 only when all are satisfied, 0 when any is missing,
malformed or violated; the solving rate is the mean of those 0/1 scores. DESIGN.md "Scoring contracts":
"CL-bench: all-or-nothing rubric judge".

How it is done here:

- One judge call per question: the prompt (``clbench_judge``) lists the numbered rubric items and asks
  for one true/false per item, as the last line ``{"met": [true, false, ...]}``. The all-or-nothing
  rule is applied in code (:func:`all_or_nothing`), not left to the judge, so the per-item verdicts are
  kept in ``score_detail`` and the credit follows from them.
- Reply reading (:func:`parse_met`): the last JSON object with a ``met`` list in the reply; items may be
  booleans, ``"yes"/"no"``, ``"true"/"false"``, ``"met"/"not met"`` or 1/0. A reply without one, or with
  a list whose length is not the number of rubric items, is asked again (bypassing the reply cache) up
  to ``max_parse_retries`` times, then recorded as ``judge_error`` (0 credit, still in the denominator;
  upstream also scores a failed grading 0).
- ``judge_runs > 1`` judges every answer that many times; ``verdict``/``score`` are the first run's and
  ``judge_verdicts`` holds all of them.
- Offline (no judge model configured, never an official score): an item counts as met when at least half
  of its content words (:func:`aml_ray.scoring.normalize.normalize_answer` tokens, minus a stop list)
  occur in the answer.
"""

from __future__ import annotations

import json
from typing import Any

from aml_ray.config import ModelEndpoint
from aml_ray.prompts import Prompt
from aml_ray.scoring.judge_parse import ReplyParseError
from aml_ray.scoring.normalize import normalize_answer
from aml_ray.stages.asking import ask_until_parsed
from aml_ray.stages.scorers import register_scorer

#: Completion limit of the rubric judge (one reasoning line per item, then the JSON line).
RUBRIC_JUDGE_MAX_TOKENS = 2048
#: Offline rule: share of an item's content words that must occur in the answer.
OFFLINE_ITEM_RECALL = 0.5

_DECODER = json.JSONDecoder()
_TRUE = {"true", "yes", "met", "1", "satisfied", "pass"}
_FALSE = {"false", "no", "not met", "0", "unmet", "not satisfied", "fail"}
_STOP = frozenset("the a an and or of to in on for with by is are be should response must that this it as at "
                  "from its their any all each not".split())


class MetParseError(ReplyParseError):
    """The judge reply holds no usable ``{"met": [...]}`` list for the rubric."""


def _as_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        v = value.strip().strip(".").lower()
        return True if v in _TRUE else False if v in _FALSE else None
    return None


def parse_met(text: str | None, n_items: int) -> list[bool]:
    """Read the per-item verdicts from a rubric judge reply.

    Examples:
        >>> parse_met('1. yes\\n2. no\\n{"met": [true, false]}', 2)
        [True, False]
        >>> parse_met('{"met": ["yes", "yes", "no"]}', 3)
        [True, True, False]

    Args:
        text: the judge's reply.
        n_items: how many rubric items the question has.

    Returns:
        One bool per item, in rubric order.

    Raises:
        MetParseError: no JSON object with a ``met`` list, a value that is not a yes/no, or a list of
            another length; the message quotes the start of the reply.
    """
    if not text or not text.strip():
        raise MetParseError("empty judge reply", text)
    found = None
    i = text.find("{")
    while i != -1:
        try:
            obj, end = _DECODER.raw_decode(text, i)
        except ValueError:
            i = text.find("{", i + 1)
            continue
        if isinstance(obj, dict):
            key = next((k for k in obj if isinstance(k, str) and k.strip().lower() == "met"), None)
            if key is not None:
                found = obj[key]
        i = text.find("{", end)
    if not isinstance(found, list):
        raise MetParseError('no {"met": [...]} object in the reply', text)
    values = [_as_bool(v) for v in found]
    if None in values:
        raise MetParseError(f"a met value is not true/false: {found!r}", text)
    if len(values) != n_items:
        raise MetParseError(f"{len(values)} verdicts for {n_items} rubric items", text)
    return values  # type: ignore[return-value]


def all_or_nothing(met: list[bool]) -> float:
    """1.0 when every item is met, else 0.0 (CL-bench's task score).

    Examples:
        >>> all_or_nothing([True, True, True]), all_or_nothing([True, False, True])
        (1.0, 0.0)
    """
    return 1.0 if met and all(met) else 0.0


def offline_item_met(answer: str, item: str) -> bool:
    """The offline stand-in for the judge (see the module docstring); never an official verdict."""
    words = [w for w in normalize_answer(item).split() if w not in _STOP]
    if not words:
        return True
    have = set(normalize_answer(answer or "").split())
    return sum(w in have for w in words) / len(words) >= OFFLINE_ITEM_RECALL


async def _judge_run(rows: list[dict[str, Any]], model, prompt: Prompt, max_parse_retries: int,
                     use_cache: bool) -> list[tuple[list[bool] | None, str | None, str | None, int]]:
    """One judging run: ``(met, raw, error, attempts)`` per row."""
    texts = [prompt.render(question=r["question"], answer=r["answer"], rubric=list(r["rubric"] or [])) for r in rows]
    got = await ask_until_parsed(model, texts, lambda text, i: parse_met(text, len(rows[i]["rubric"] or [])),
                                 prompt_sha256=prompt.sha256, max_tokens=RUBRIC_JUDGE_MAX_TOKENS,
                                 max_parse_retries=max_parse_retries, first_uses_cache=use_cache)
    return [(g["value"], g["raw"], g["error"], g["attempts"]) for g in got]


@register_scorer("rubric_all_or_nothing")
async def rubric_all_or_nothing(rows: list[dict[str, Any]], *, endpoint: ModelEndpoint, model, prompt: Prompt,
                                f1_rule: str = "token", max_parse_retries: int = 2, judge_runs: int = 1) -> None:
    """Judge rubric rows all-or-nothing, in place (rules in the module docstring).

    Args:
        rows: question rows after Answer; ``rubric`` holds the items.
        endpoint: the judge endpoint (offline: the word-recall stand-in).
        model: the judge model handle, or None when offline.
        prompt: the rubric judge prompt (``clbench_judge``: reads ``question``, ``answer``, ``rubric``).
        f1_rule: unused (no lexical metrics for rubric tasks; ``f1``/``bleu1`` stay null).
        max_parse_retries: extra asks after an unusable reply.
        judge_runs: how many times each answer is judged (>= 1).

    Raises:
        ValueError: ``judge_runs < 1``.
    """
    if judge_runs < 1:
        raise ValueError(f"judge_runs must be >= 1, got {judge_runs}")
    answered = [r for r in rows if r["answer_status"] == "ok"]
    for r in answered:
        if not r["rubric"]:
            r.update(verdict=None, score=None, judge_status="error", judge_error="question has no rubric items",
                     judge_attempts=0, judge_verdicts=["judge_error"])
    answered = [r for r in answered if r["rubric"]]
    if endpoint.offline:
        for r in answered:
            met = [offline_item_met(r["answer"], item) for item in r["rubric"]]
            label = "CORRECT" if all_or_nothing(met) else "WRONG"
            r.update(verdict=label, score=all_or_nothing(met), judge_status="ok", judge_error=None, judge_attempts=1,
                     judge_verdicts=[label], judge_raw="offline word-recall stand-in (not an official judge)",
                     score_detail=json.dumps({"met": met, "n_met": sum(met), "n_items": len(met)}))
    elif answered:
        runs = [await _judge_run(answered, model, prompt, max_parse_retries, use_cache=(n == 0))
                for n in range(judge_runs)]
        for i, r in enumerate(answered):
            met, raw, error, _ = runs[0][i]
            verdicts = ["judge_error" if run[i][0] is None else "CORRECT" if all_or_nothing(run[i][0]) else "WRONG"
                        for run in runs]
            r.update(judge_raw=raw, judge_error=error, judge_status="ok" if met is not None else "error",
                     judge_attempts=sum(run[i][3] for run in runs), judge_verdicts=verdicts,
                     verdict=None if met is None else verdicts[0],
                     score=None if met is None else all_or_nothing(met),
                     score_detail=None if met is None else json.dumps(
                         {"met": met, "n_met": sum(met), "n_items": len(met)}))
    for r in rows:
        r["status"] = ("search_error" if r["search_status"] != "ok" else
                       "answer_error" if r["answer_status"] != "ok" else
                       "judge_error" if r["judge_status"] != "ok" else "scored")
