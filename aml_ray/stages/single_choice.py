"""Scoring contract ``single_choice``: one labelled option per question, matched deterministically (PersonaMem).

Source: PersonaMem's evaluation compares the option the model picks with ``correct_answer`` (a label
such as ``"(c)"``); DESIGN.md "Scoring contracts": "PersonaMem: option match". No model is called.

The reply is read as PersonaMem's own evaluation reads it (:func:`aml_ray.scoring.personamem_choice.is_correct`,
upstream ``Evaluation.extract_answer``): the text after ``<final_answer>`` (else the whole reply) must name
exactly the gold option, ``(x)`` or a standalone letter a-d (``<final_answer> b``, ``The answer is b``,
``(b)`` are read; ``(a) or (b)`` is not), else the whole reply must. A reply that names no option or
another one scores 0 and is still ``scored``. Every row uses this rule (PersonaMem's categories are its
question types, not scoring rules).
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

    Fills ``verdict`` (CORRECT iff the score is 1), ``score`` (1.0 / 0.0), ``score_detail`` (JSON: rule,
    gold, the final-answer text read and the letters it names), the ``judge_*`` columns (status ``ok``,
    0 model attempts) and the final ``status``; ``f1``/``bleu1`` stay null. A row that cannot be scored (no options, bad gold) is
    ``judge_error`` and stays in the denominator.

    Args:
        rows: question rows after Answer (``gold`` = JSON of the label, ``options`` = the options).
    """
    from aml_ray.scoring.personamem_choice import is_correct, named_options

    for r in rows:
        if r["answer_status"] == "ok":
            try:
                options = r.get("options") or []
                if not options:
                    raise ValueError(f"question {r.get('question_id')!r} has no options")
                gold = gold_letter(r["gold"])
                correct, predicted = is_correct(r["answer"], f"({gold.lower()})")
                verdict = "CORRECT" if correct else "WRONG"
                letters = sorted(c.upper() for c in named_options(predicted))
                r.update(verdict=verdict, score=1.0 if correct else 0.0, judge_status="ok", judge_error=None,
                         judge_attempts=0, judge_verdicts=[verdict], judge_raw=None,
                         score_detail=json.dumps({"rule": "personamem_extract_answer", "gold": [gold],
                                                  "final_answer": predicted, "letters": letters}))
            except ValueError as exc:
                r.update(verdict=None, score=None, judge_status="error", judge_error=str(exc), judge_attempts=0,
                         judge_verdicts=["judge_error"])
        r["status"] = ("search_error" if r["search_status"] != "ok" else
                       "answer_error" if r["answer_status"] != "ok" else
                       "judge_error" if r["judge_status"] != "ok" else "scored")
