"""Upstream yes/no judging: a benchmark's own judge prompt, its replies read as upstream reads them.

Source: xiaowu0162/LongMemEval ``src/evaluation/evaluate_qa.py`` (one user message per question, temperature
0, ``max_tokens=10``; ``label = 'yes' in eval_response.lower()``). Used by the ``category_judge`` scorer
when its prompt declares the ``longmemeval-upstream`` protocol (:mod:`aml_ray.scoring.judge_protocols`).

Rules (the row conventions of :func:`aml_ray.stages.judge.judge_rows`):

- Every answered row is judged ``judge_runs`` times (runs after the first bypass the reply cache);
  ``verdict`` is the first run's, ``judge_verdicts`` holds every run's, ``judge_raw`` the first run's
  reply and ``judge_raw_all`` every reply text.
- A reply is never unparsable (:func:`aml_ray.scoring.judge_protocols.read_yes_no`), so nothing is asked
  again for its content. A call that fails, or an empty reply (which the model client reports as a
  failure and re-asks ``max_parse_retries`` times), is a ``judge_error`` and stays in the denominator
  with credit 0; upstream reads an empty reply as "no", which also credits 0.
- Offline (no judge endpoint) the rows go to :func:`~aml_ray.stages.judge.judge_rows`' lexical judge.
- Lexical ``f1``/``bleu1`` and the final ``status`` are filled as by ``judge_rows``.
"""

from __future__ import annotations

import json
from typing import Any

from aml_ray.scoring import bleu1, locomo_f1, token_f1
from aml_ray.scoring.judge_protocols import protocol_of, read_yes_no
from aml_ray.stages.asking import ask_until_parsed
from aml_ray.stages.judge import JUDGE_MAX_TOKENS, golds_of, judge_rows


async def yes_no_rows(rows: list[dict[str, Any]], *, endpoint, model, prompt, f1_rule: str = "token",
                      max_parse_retries: int = 2, judge_runs: int = 1) -> None:
    """Judge rows with an upstream yes/no prompt (rules in the module docstring); fills the rows in place.

    Args:
        rows: question rows after Answer (``question``, ``gold`` as JSON, ``answer``, statuses).
        endpoint: the judge endpoint; offline uses the lexical judge of ``judge_rows``.
        model: an object with ``async complete_batch(batch, **kw)``; None when offline.
        prompt: the judge prompt (values such as ``category`` already bound); rendered with ``question``,
            ``gold`` (acceptable answers joined by ``" | "``) and ``answer``.
        f1_rule: ``"locomo"`` or ``"token"`` (lexical F1, as ``judge_rows``).
        max_parse_retries: extra asks after an empty reply.
        judge_runs: how many times each answer is judged (>= 1).

    Raises:
        ValueError: ``judge_runs < 1``.
    """
    if judge_runs < 1:
        raise ValueError(f"judge_runs must be >= 1, got {judge_runs}")
    answered = [r for r in rows if r["answer_status"] == "ok"]
    if endpoint.offline or not answered:
        await judge_rows(rows, endpoint=endpoint, model=model, prompt=prompt, f1_rule=f1_rule,
                         max_parse_retries=max_parse_retries, judge_runs=judge_runs)
        return
    max_tokens = protocol_of(prompt).max_tokens or JUDGE_MAX_TOKENS
    texts = [prompt.render(question=r["question"], gold=" | ".join(golds_of(r["gold"])), answer=r["answer"])
             for r in answered]
    runs = [await ask_until_parsed(model, texts, lambda text, _: read_yes_no(text), prompt_sha256=prompt.sha256,
                                   max_tokens=max_tokens, max_parse_retries=max_parse_retries,
                                   first_uses_cache=(n == 0)) for n in range(judge_runs)]
    for i, r in enumerate(answered):
        first = runs[0][i]
        r.update(verdict=first["value"], judge_raw=first["raw"], judge_error=first["error"],
                 judge_status="ok" if first["value"] else "error",
                 judge_attempts=sum(run[i]["attempts"] for run in runs),
                 judge_verdicts=[run[i]["value"] or "judge_error" for run in runs],
                 judge_raw_all=[reply for run in runs for reply in run[i]["replies"]])
    for r in rows:
        if r["answer_status"] == "ok":
            golds = golds_of(r["gold"])
            r["f1"] = (locomo_f1(r["answer"], json.loads(r["gold"]), r["category"]) if f1_rule == "locomo"
                       else max(token_f1(r["answer"], g) for g in golds))
            r["bleu1"] = max(bleu1(r["answer"], g) for g in golds)
        r["status"] = ("search_error" if r["search_status"] != "ok" else
                       "answer_error" if r["answer_status"] != "ok" else
                       "judge_error" if r["judge_status"] != "ok" else "scored")
