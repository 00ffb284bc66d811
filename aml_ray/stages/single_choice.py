"""Scoring contract ``single_choice``: one labelled option per question, matched deterministically (PersonaMem).

Source: PersonaMem's evaluation compares the option the model picks with ``correct_answer`` (a label
such as ``"(c)"``); DESIGN.md "Scoring contracts": "PersonaMem: option match". No model is called.

The letters are read by :func:`aml_ray.stages.options.extract_letters`, the reader ScriptMem uses (one
rule for every multiple-choice dataset: ``(b)``, ``B``, ``Answer: b.`` are read; prose, conflicting
letter groups, a letter that is not an option, or a repeated letter are malformed), and scored with its
``single_choice`` rule: 1 when exactly the gold letter is given, else 0. A malformed answer scores 0 and
is still ``scored``. Unlike ScriptMem, the rule does not come from the row's category (PersonaMem's
categories are its question types), so every row uses ``single_choice``.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from aml_ray.stages.scorers import register_scorer


def gold_letter(gold_json: str) -> str:
    """The gold label of a row as an upper-case letter: ``'"(c)"'`` -> ``"C"``.

    Raises:
        ValueError: the gold is not one letter, with or without parentheses.
    """
    gold = json.loads(gold_json)
    letter = str(gold).strip().strip("()").strip().upper() if isinstance(gold, str) else ""
    if len(letter) != 1 or not letter.isalpha():
        raise ValueError(f"gold {gold_json} is not one option label like '(c)'")
    return letter


@register_scorer("single_choice")
async def single_choice(rows: list[dict[str, Any]], *, endpoint=None, model=None, prompt=None,
                        f1_rule: str = "token", max_parse_retries: int = 2, judge_runs: int = 1) -> None:
    """Score single-choice rows in place (the judge arguments are accepted and unused).

    Fills ``verdict`` (CORRECT iff the score is 1), ``score`` (1.0 / 0.0), ``score_detail`` (JSON: gold,
    letters read, malformed, reason), the ``judge_*`` columns (status ``ok``, 0 model attempts) and the
    final ``status``; ``f1``/``bleu1`` stay null. A row that cannot be scored (no options, bad gold) is
    ``judge_error`` and stays in the denominator.

    Args:
        rows: question rows after Answer (``gold`` = JSON of the label, ``options`` = the options).
    """
    from aml_ray.stages.options import extract_letters, score_letters  # the ScriptMem letter reader

    for r in rows:
        if r["answer_status"] == "ok":
            try:
                options = r.get("options") or []
                if not options:
                    raise ValueError(f"question {r.get('question_id')!r} has no options")
                gold = gold_letter(r["gold"])
                extraction = extract_letters(r["answer"], len(options))
                score = score_letters("single_choice", [gold], extraction)
                verdict = "CORRECT" if score == 1.0 else "WRONG"
                r.update(verdict=verdict, score=score, judge_status="ok", judge_error=None, judge_attempts=0,
                         judge_verdicts=[verdict], judge_raw=None,
                         score_detail=json.dumps({"rule": "single_choice", "gold": [gold], **asdict(extraction)}))
            except ValueError as exc:
                r.update(verdict=None, score=None, judge_status="error", judge_error=str(exc), judge_attempts=0,
                         judge_verdicts=["judge_error"])
        r["status"] = ("search_error" if r["search_status"] != "ok" else
                       "answer_error" if r["answer_status"] != "ok" else
                       "judge_error" if r["judge_status"] != "ok" else "scored")
