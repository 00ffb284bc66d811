"""Scoring contract ``atmbench_qs``: ATM-Bench's question score, by the row's ``qtype`` (its category).

Source: ATM-Bench's public evaluator, ``memqa/utils/evaluator/evaluate_qa.py`` ``run_atm`` (JingbiaoMei/ATM-Bench
@ ``c24d06ca11cf7f83d2d0f11c04f7795bb33d1a01``); the rules are :mod:`aml_ray.scoring.atmbench_qs`:

- ``number``: :func:`~aml_ray.scoring.atmbench_qs.number_score` of the answer against the gold *string*,
  with the question for its reference date (credit 1.0 or 0.0);
- ``list_recall``: :func:`~aml_ray.scoring.atmbench_qs.list_recall_score`, Jaccard of the ids (credit in
  [0, 1]); the gold items come from the answer string, not from ``evidence_ids``;
- ``open_end``: the judge model with the ``atmbench_judge`` prompt (upstream's ``LLM_JUDGE_PROMPT``),
  up to :data:`JUDGE_MAX_TOKENS` tokens, read by :func:`~aml_ray.scoring.atmbench_qs.judge_accuracy`
  (credit 1.0 iff ``"accuracy"`` is true). A reply is never re-asked for its wording: one without JSON is
  read by upstream's keyword fallback, and ``score_detail`` says so (``"parse_fallback": true``). A
  failed call (no reply) is asked again up to ``max_parse_retries`` times, then the row is
  ``judge_error`` (kept in the denominator).

With the offline judge, ``open_end`` credit is Mem-Gallery's token F1 against the gold (a labelled
stand-in, ``open_end_offline_token_f1``, never an official score). ``verdict`` is CORRECT only for a
credit of 1. The dataset score is the mean credit over questions (:func:`aml_ray.scoring.aggregate`), as
upstream's ``summarize_atm``.
"""

from __future__ import annotations

import json
from typing import Any

from aml_ray.scoring.atmbench_qs import judge_accuracy, list_recall_score, number_score
from aml_ray.scoring.memgallery_f1 import memgallery_f1
from aml_ray.stages.memgallery_scorer import row_status
from aml_ray.stages.scorers import register_scorer

#: The judge's reply budget in tokens: upstream ``EVALUATOR_CONFIG["llm_judge"]["max_tokens"]`` (600); its
#: reply carries a short explanation before the accuracy.
JUDGE_MAX_TOKENS = 600


def gold_text(gold_json: str) -> str:
    """The gold answer string of a row: the QA file's ``answer`` (a list is joined by ``", "``).

    Examples:
        >>> gold_text('"20220430_132212, email0007"'), gold_text('["a1", "b2"]'), gold_text("3")
        ('20220430_132212, email0007', 'a1, b2', '3')
    """
    gold = json.loads(gold_json)
    return ", ".join(str(g) for g in gold) if isinstance(gold, list) else str(gold)


def _set(r: dict[str, Any], score: float, detail: dict[str, Any], raw: str | None = None, attempts: int = 0) -> None:
    verdict = "CORRECT" if score == 1.0 else "WRONG"
    r.update(verdict=verdict, score=score, judge_status="ok", judge_error=None, judge_attempts=attempts,
             judge_verdicts=[verdict], judge_raw=raw, score_detail=json.dumps(detail))


@register_scorer("atmbench_qs")
async def atmbench_qs(rows: list[dict[str, Any]], *, endpoint=None, model=None, prompt=None,
                      f1_rule: str = "token", max_parse_retries: int = 2, judge_runs: int = 1) -> None:
    """Score ATM-Bench rows in place (see the module docstring).

    Args:
        rows: question rows after Answer; ``category`` is the qtype (``number``, ``list_recall`` or
            ``open_end``), ``gold`` the JSON of the answer string, ``question`` the question text.
        endpoint / model / prompt: the judge (``open_end`` only); offline when ``endpoint.offline``.
        max_parse_retries: asks again of a judge call that returned no reply.
    """
    open_rows = []
    for r in rows:
        if r["answer_status"] != "ok":
            continue
        answer, gold = r["answer"] or "", gold_text(r["gold"])
        if r["category"] == "number":
            _set(r, number_score(answer, gold, r.get("question") or ""), {"rule": "number"})
        elif r["category"] == "list_recall":
            _set(r, list_recall_score(answer, gold), {"rule": "list_recall"})
        elif endpoint is None or endpoint.offline or model is None:
            _set(r, memgallery_f1(answer, gold), {"rule": "open_end_offline_token_f1"})
        else:
            open_rows.append(r)
    todo = open_rows
    for attempt in range(1, max_parse_retries + 2):
        if not todo:
            break
        batch = [[{"role": "user", "content": prompt.render(question=r["question"], gold=gold_text(r["gold"]),
                                                             answer=r["answer"] or "")}] for r in todo]
        outcomes = await model.complete_batch(batch, max_tokens=JUDGE_MAX_TOKENS, prompt_sha256=prompt.sha256)
        again = []
        for r, o in zip(todo, outcomes):
            if o["status"] == "ok" and o.get("text") is not None:
                score, fallback = judge_accuracy(o["text"])
                _set(r, score, {"rule": "open_end_judge", "parse_fallback": fallback}, o["text"], attempt)
            else:
                r.update(judge_status="error", judge_attempts=attempt, judge_raw=o.get("text"),
                         judge_error=o.get("error") or "the judge returned no reply", judge_verdicts=["judge_error"])
                again.append(r)
        todo = again
    for r in rows:
        if r["answer_status"] == "ok" and r["judge_status"] is None:
            r.update(judge_status="error", judge_error="not judged")
        r["status"] = row_status(r) if r["answer_status"] == "ok" else (
            "search_error" if r["search_status"] != "ok" else "answer_error")
