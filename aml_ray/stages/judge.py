"""Judge stage: the judge model (or the offline lexical judge), plus token F1 and BLEU-1.

Judge robustness (DESIGN.md "Scoring contracts"): replies are parsed leniently
(:func:`aml_ray.scoring.parse_judge_label`); an explicit negative in any form ("The answer is
INCORRECT.") is WRONG at once, while an unparsable, conflicting or empty reply is asked again, bypassing
the reply cache, up to ``max_parse_retries`` times, then recorded as ``judge_error``. A run never aborts
on judge output and no question leaves the denominator. With ``judge_runs > 1`` every answer is judged
that many times (runs after the first bypass the cache); ``verdict`` is the first run's and
``judge_verdicts`` holds all of them, for a mean and standard deviation of accuracy.

Evidence of the replies (a re-ask once hid the negative reply it replaced): ``judge_raw`` is the
first run's last reply (the one ``verdict`` was read from), ``judge_raw_all`` every reply text of every
ask of every run, in the order asked, an empty reply as ``""``; a failed call adds no text
(``judge_attempts`` counts every call).

The Ray Data stage that calls the dataset's scoring contract is :class:`aml_ray.stages.judge_stage.JudgeStage`.
"""

from __future__ import annotations

import json
from typing import Any

from aml_ray.config import ModelEndpoint
from aml_ray.prompts import Prompt
from aml_ray.scoring import bleu1, lexical_verdict, locomo_f1, parse_judge_label, token_f1
from aml_ray.stages.asking import ask_until_parsed

JUDGE_MAX_TOKENS = 256
F1_RULES = ("locomo", "token")


def golds_of(gold_json: str) -> list[str]:
    """The acceptable gold answers of a row as text (numbers rendered as text)."""
    gold = json.loads(gold_json)
    return [str(g) for g in gold] if isinstance(gold, list) else [str(gold)]


async def _judge_once(rows: list[dict[str, Any]], model, prompt: Prompt, max_parse_retries: int,
                      first_uses_cache: bool) -> list[tuple[str | None, str | None, str | None, int, list[str]]]:
    """One judging run: ``(label, raw, error, attempts, replies)`` per row; ``replies`` holds every reply
    text that came back, in the order asked, an empty one as ``""``."""
    texts = [prompt.render(question=r["question"], gold=" | ".join(golds_of(r["gold"])), answer=r["answer"])
             for r in rows]
    got = await ask_until_parsed(model, texts, lambda text, _i: parse_judge_label(text), prompt_sha256=prompt.sha256,
                                 max_tokens=JUDGE_MAX_TOKENS, max_parse_retries=max_parse_retries,
                                 first_uses_cache=first_uses_cache)
    return [(g["value"], g["raw"], g["error"], g["attempts"], g["replies"]) for g in got]


async def judge_rows(rows: list[dict[str, Any]], *, endpoint: ModelEndpoint, model, prompt: Prompt,
                     f1_rule: str = "token", max_parse_retries: int = 2, judge_runs: int = 1) -> None:
    """Fill verdict, judge replies (``judge_raw``, ``judge_raw_all``), lexical metrics and the final
    ``status`` of question rows, in place.

    Args:
        rows: question rows after Answer.
        endpoint: the judge endpoint; offline uses :func:`aml_ray.scoring.lexical_verdict`.
        model: an object with ``async complete_batch(batch, **kw)``; None when offline.
        prompt: the judge prompt template.
        f1_rule: ``"locomo"`` (official per-category F1) or ``"token"`` (best token F1 over the golds).
        max_parse_retries: extra asks after an unparsable or empty reply.
        judge_runs: how many times each answer is judged (>= 1).

    Raises:
        ValueError: unknown ``f1_rule`` or ``judge_runs < 1``.
    """
    if f1_rule not in F1_RULES:
        raise ValueError(f"f1_rule must be one of {F1_RULES}, got {f1_rule!r}")
    if judge_runs < 1:
        raise ValueError(f"judge_runs must be >= 1, got {judge_runs}")
    answered = [r for r in rows if r["answer_status"] == "ok"]
    if endpoint.offline:
        for r in answered:
            label, why = lexical_verdict(r["answer"], json.loads(r["gold"]))
            r.update(verdict=label, judge_raw=why, judge_raw_all=[why], judge_status="ok", judge_attempts=1,
                     judge_error=None, judge_verdicts=[label])
    elif answered:
        runs = [await _judge_once(answered, model, prompt, max_parse_retries, first_uses_cache=(n == 0))
                for n in range(judge_runs)]
        for i, r in enumerate(answered):
            label, raw, error, _, _ = runs[0][i]
            r.update(verdict=label, judge_raw=raw, judge_error=error, judge_status="ok" if label else "error",
                     judge_attempts=sum(run[i][3] for run in runs),
                     judge_verdicts=[run[i][0] or "judge_error" for run in runs],
                     judge_raw_all=[reply for run in runs for reply in run[i][4]])
    for r in rows:
        if r["answer_status"] == "ok":
            golds = golds_of(r["gold"])
            r["f1"] = (locomo_f1(r["answer"], json.loads(r["gold"]), r["category"]) if f1_rule == "locomo"
                       else max(token_f1(r["answer"], g) for g in golds))
            r["bleu1"] = max(bleu1(r["answer"], g) for g in golds)
        r["status"] = ("search_error" if r["search_status"] != "ok" else
                       "answer_error" if r["answer_status"] != "ok" else
                       "judge_error" if r["judge_status"] != "ok" else "scored")
