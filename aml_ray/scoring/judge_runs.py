"""Repeated judging (``--judge-runs``): each run's accuracy with the credit the score table gives.

Rule: run 1 of a question is what the table scores (:mod:`aml_ray.scoring.aggregate`:
the scorer's ``score`` when it gives one, partial credit included, else 1 for a CORRECT ``verdict``; 0 for
any status other than ``scored``; excluded questions left out). A later run ``i`` is read from the
question's ``judge_verdicts[i]`` (:func:`verdict_credit`): ``CORRECT`` 1, a decimal string its value (the
partial credit of a rubric run, :func:`aml_ray.stages.rubric.run_verdict`), anything else 0, and 0 when the
question has no such run (it was not judged). A scorer that judges once (deterministic option or F1
scoring) gives one run whatever ``judge_runs`` says.
"""

from __future__ import annotations

import math
from typing import Any


def verdict_credit(entry: Any) -> float:
    """The credit of one ``judge_verdicts`` entry.

    Examples:
        >>> [verdict_credit(v) for v in ("CORRECT", "WRONG", "judge_error", "0.625", None)]
        [1.0, 0.0, 0.0, 0.625, 0.0]

    Returns:
        A credit in [0, 1]; a number outside it, or not finite, counts 0.
    """
    if entry == "CORRECT":
        return 1.0
    try:
        value = float(entry)
    except (TypeError, ValueError):
        return 0.0
    return value if math.isfinite(value) and 0.0 <= value <= 1.0 else 0.0


def table_credit(status: str | None, score: float | None, verdict: str | None) -> float:
    """One non-excluded question's credit as the score table gives it (run 1).

    Examples:
        >>> table_credit("scored", 0.5, "WRONG"), table_credit("scored", None, "CORRECT"), table_credit("judge_error", None, None)
        (0.5, 1.0, 0.0)
    """
    if status != "scored":
        return 0.0
    if score is not None:
        return float(score)
    return 1.0 if verdict == "CORRECT" else 0.0


def run_credits(rows: list[dict[str, Any]]) -> list[float]:
    """Accuracy of each judging run over the non-excluded questions (module rules).

    Examples:
        >>> run_credits([{"excluded": False, "status": "scored", "score": 0.5, "verdict": "WRONG",
        ...               "judge_verdicts": ["WRONG", "CORRECT"]},
        ...              {"excluded": False, "status": "judge_error", "score": None, "verdict": None,
        ...               "judge_verdicts": ["judge_error", "0.5"]}])
        [0.25, 0.75]

    Args:
        rows: question rows with ``excluded``, ``status``, ``score`` (may be absent), ``verdict`` and
            ``judge_verdicts`` (a list, or None for a question never judged).

    Returns:
        One accuracy per run, in [0, 1]; empty when no non-excluded question was judged.
    """
    scored = [r for r in rows if not r.get("excluded")]
    n_runs = max((len(r.get("judge_verdicts") or []) for r in scored), default=0)
    if not scored or n_runs == 0:
        return []
    out = [sum(table_credit(r.get("status"), r.get("score"), r.get("verdict")) for r in scored) / len(scored)]
    for i in range(1, n_runs):
        out.append(sum(verdict_credit(v[i]) if (v := r.get("judge_verdicts")) and len(v) > i else 0.0
                       for r in scored) / len(scored))
    return out
