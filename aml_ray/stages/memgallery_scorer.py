"""Scoring contract ``memgallery_f1``: Mem-Gallery's token F1 as the question's credit (no model is called).

Source: Mem-Gallery ``benchmark/memengine/evaluate/evaluation.py`` ``main`` (YuanchenBei/Mem-Gallery @
``09d49b578bb1d32ac473776311e14b3d8d53faf0``): each QA's F1 is ``f1_score(str(system_answer),
str(original_answer))``, averaged over the questions of a category and over all questions. Here the
credit of a question is :func:`aml_ray.scoring.memgallery_f1.memgallery_f1` of the answer (``""`` when
there is none, as upstream's failed answers) against the gold string; a gold given as a list (not the
published layout) takes the best of its entries. ``verdict`` is CORRECT only for F1 = 1.
"""

from __future__ import annotations

import json
from typing import Any

from aml_ray.scoring.memgallery_f1 import memgallery_f1
from aml_ray.stages.scorers import register_scorer


def row_status(r: dict[str, Any]) -> str:
    """The final status of a row from its stage statuses."""
    return ("search_error" if r["search_status"] != "ok" else
            "answer_error" if r["answer_status"] != "ok" else
            "judge_error" if r["judge_status"] != "ok" else "scored")


@register_scorer("memgallery_f1")
async def memgallery_scorer(rows: list[dict[str, Any]], *, endpoint=None, model=None, prompt=None,
                            f1_rule: str = "token", max_parse_retries: int = 2, judge_runs: int = 1) -> None:
    """Score rows in place: ``score`` = ``f1`` = token F1, ``verdict`` CORRECT iff F1 = 1.

    Args:
        rows: question rows after Answer (``gold`` = JSON of the answer string, or of a list of answers).
    """
    for r in rows:
        if r["answer_status"] == "ok":
            gold = json.loads(r["gold"])
            golds = [str(g) for g in gold] if isinstance(gold, list) else [str(gold)]
            score = max(memgallery_f1(r["answer"] or "", g) for g in golds)
            verdict = "CORRECT" if score == 1.0 else "WRONG"
            r.update(verdict=verdict, score=score, f1=score, judge_status="ok", judge_error=None,
                     judge_attempts=0, judge_verdicts=[verdict], judge_raw=None,
                     score_detail=json.dumps({"rule": "memgallery_f1", "gold": golds}))
        r["status"] = row_status(r)
