"""The context-budget curve: a run's accuracy when the same stored memories are cut to smaller budgets.

For each budget (default :data:`BUDGETS`, tokens of the answer model's tokenizer, the suite's rule of
:mod:`aml_ray.models.context`), every non-excluded question whose Search succeeded is answered and judged
again from its stored memories cut to that budget (:meth:`~aml_ray.explain.reanswer.RunModels.reanswer`); a
question whose Search failed keeps credit 0, as in the score table. Per budget: accuracy (mean credit over
the non-excluded questions) with its 95 % bootstrap interval (:func:`aml_ray.scoring.bootstrap.mean_ci`) and
the context tokens per answered question (mean, p95). A budget above the run's own is allowed: it shows what
the run's cut cost.

A curve is **monotone within its intervals** (:func:`monotone_within_intervals`) when no budget's accuracy is
below a smaller budget's interval: more context never hurts beyond the noise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from aml_ray.explain.reanswer import RunModels, credit_of
from aml_ray.scoring.bootstrap import mean_ci

#: Budgets of the curve, in tokens (1k to 16k; 16k is the default context budget).
BUDGETS = (1_000, 2_000, 4_000, 8_000, 16_000)


def token_summary(tokens: list[int]) -> dict[str, float | None]:
    """``{"mean", "p95"}`` of context tokens per question (numpy's linear percentile); None when empty."""
    if not tokens:
        return {"mean": None, "p95": None}
    values = np.asarray(tokens, dtype=np.float64)
    return {"mean": float(values.mean()), "p95": float(np.percentile(values, 95))}


def curve(models: RunModels, budgets: tuple[int, ...] = BUDGETS) -> dict[str, Any]:
    """Accuracy vs budget for the run (module rules).

    Returns:
        ``{"questions": n, "points": [{"budget", "accuracy", "ci_low", "ci_high", "context_tokens": {"mean",
        "p95"}, "questions_cut"}], "monotone_within_intervals": bool}``, points in budget order.

    Raises:
        ValueError: a budget below 1 token.
    """
    if any(b < 1 for b in budgets):
        raise ValueError(f"budgets must be >= 1 token, got {list(budgets)}")
    rows = [r for r in models.rows() if not r["excluded"]]
    searched = [r for r in rows if r["search_status"] == "ok"]
    points = []
    for budget in sorted(budgets):
        answered = models.reanswer(searched, budget_tokens=budget)
        credits = np.asarray([credit_of(a) for a in answered] + [0.0] * (len(rows) - len(searched)))
        low, high = mean_ci(credits)
        points.append({"budget": budget, "accuracy": float(credits.mean()) if credits.size else None,
                       "ci_low": low, "ci_high": high,
                       "context_tokens": token_summary([a["context_tokens"] for a in answered
                                                        if a["context_tokens"] is not None]),
                       "questions_cut": sum(1 for a in answered if (a["memories_cut"] or 0) > 0)})
    return {"questions": len(rows), "points": points, "monotone_within_intervals": monotone_within_intervals(points)}


def monotone_within_intervals(points: list[dict[str, Any]]) -> bool:
    """True when no point's accuracy is below the interval of a point with a smaller budget.

    Examples:
        >>> monotone_within_intervals([{"budget": 1, "accuracy": .5, "ci_low": .4, "ci_high": .6},
        ...                            {"budget": 2, "accuracy": .45, "ci_low": .35, "ci_high": .55}])
        True
        >>> monotone_within_intervals([{"budget": 1, "accuracy": .5, "ci_low": .45, "ci_high": .55},
        ...                            {"budget": 2, "accuracy": .3, "ci_low": .25, "ci_high": .35}])
        False
    """
    ordered = sorted(points, key=lambda p: p["budget"])
    return all(later["accuracy"] >= earlier["ci_low"] for i, earlier in enumerate(ordered) for later in ordered[i + 1:]
               if later["accuracy"] is not None and earlier["ci_low"] is not None)


def budget_curve(run_root: Path, budgets: tuple[int, ...] = BUDGETS, models: RunModels | None = None) -> dict[str, Any]:
    """:func:`curve` for the run in ``run_root``, cached in ``RUN_DIR/explain/budget_curve.json`` (same models,
    prompts and budgets: read, no model called).

    Raises:
        FileNotFoundError / ValueError: as :class:`~aml_ray.explain.reanswer.RunModels`; a budget below 1.
    """
    models = models or RunModels(run_root)
    return models.cached("budget_curve", {"analysis": "budget_curve", "budgets": sorted(budgets)},
                         lambda: curve(models, tuple(budgets)))
