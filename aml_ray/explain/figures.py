"""What ``aml-ray report`` shows of the explanations: baselines beside each score, the attribution bar, the
context-budget curve.

Only what is on disk is shown: the reference baselines are runs given to the report (participants
``reference:none``, ``reference:oracle``...), the attribution and the curve are read from
``RUN_DIR/explain/`` as ``aml-ray explain`` left them (:mod:`aml_ray.explain.attribution`,
:mod:`aml_ray.explain.budget`); the report calls no model.

**Gap closed** (beside each score): where a run's overall accuracy lies between the ``none`` and ``oracle``
baselines of its dataset, ``(accuracy - none) / (oracle - none)``: below 0 the memory system hurts the
answer model, near 1 retrieval is saturated.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from aml_ray.explain.attribution import CLASSES

#: Colours of the attribution classes, in :data:`CLASSES` order.
CLASS_COLOURS = ("#7f7f7f", "#bcbd22", "#c7c7c7", "#9467bd", "#ff7f0e", "#d62728")


def _overall(run) -> dict[str, Any] | None:
    if not run.table.height:
        return None
    rows = [r for r in run.table.to_dicts() if r["category"] == "overall"]
    return rows[0] if rows and rows[0]["accuracy"] is not None else None


def _participant(run) -> str:
    return str(run.info.get("participant", {}).get("label") or "")


def baseline_rows(runs: list) -> list[dict[str, Any]]:
    """One row per scored run that is not a baseline and has a baseline of its dataset among ``runs``.

    Returns:
        ``[{"label", "colour", "accuracy", "baselines": {"none": "0.001", ...}, "gap_closed": "0.46" or "-"}]``.
    """
    from aml_ray.reference.baselines import BASELINES

    refs: dict[tuple[str, str], float] = {}
    for r in runs:
        name = _participant(r).removeprefix("reference:")
        if name in BASELINES and (o := _overall(r)):
            refs[(r.dataset, name)] = o["accuracy"]
    out = []
    for r in runs:
        o = _overall(r)
        if o is None or _participant(r).removeprefix("reference:") in BASELINES:
            continue
        mine = {b: refs[(r.dataset, b)] for b in BASELINES if (r.dataset, b) in refs}
        if not mine:
            continue
        gap = (mine["oracle"] - mine["none"]) if {"none", "oracle"} <= mine.keys() else None
        out.append({"label": r.label, "colour": r.colour, "accuracy": f"{o['accuracy']:.3f}",
                    "baselines": {b: f"{mine[b]:.3f}" if b in mine else "-" for b in BASELINES},
                    "gap_closed": f"{(o['accuracy'] - mine['none']) / gap:.2f}" if gap else "-"})
    return out


def _read(run, name: str) -> dict[str, Any] | None:
    path = run.root / "explain" / f"{name}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def attribution_figure(runs: list) -> dict[str, Any] | None:
    """Stacked horizontal bars, one per run with an attribution: the share of its wrong questions per class.

    Returns:
        ``{"id", "png", "caption", "wide"}``, or None when no run has one.
    """
    from aml_ray.report import new_figure, png_of

    found = [(r, a) for r in runs if (a := _read(r, "attribution")) and a.get("wrong")]
    if not found:
        return None
    fig, ax = new_figure(9.0, max(1.9, 0.6 + 0.45 * len(found)))
    y = np.arange(len(found))
    left = np.zeros(len(found))
    for cls, colour in zip(CLASSES, CLASS_COLOURS):
        shares = np.array([a["shares"][cls] or 0.0 for _, a in found])
        ax.barh(y, shares, left=left, color=colour, label=cls.replace("_", " "), height=0.6)
        left += shares
    ax.set_yticks(y, [f"{r.label} ({a['wrong']} wrong)" for r, a in found])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of the wrong questions")
    ax.grid(axis="y", visible=False)
    ax.legend(frameon=False, fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    return {"id": "attribution", "png": png_of(fig), "wide": True,
            "caption": "Why questions were wrong (aml-ray explain): each wrong question answered again with its gold "
                       "evidence alone; retrieval miss = gold not returned and correct with it, synthesis miss = gold "
                       "returned yet wrong, unanswerable with gold = wrong even with it."}


def budget_figures(runs: list) -> list[dict[str, Any]]:
    """One figure per dataset with a budget curve: accuracy vs context budget (log2 axis), each run's line with
    its 95 % bootstrap band.

    Returns:
        ``[{"id", "png", "caption"}]``, datasets in the order the runs give them.
    """
    from aml_ray.report import new_figure, png_of

    by_dataset: dict[str, list] = {}
    for r in runs:
        if (curve := _read(r, "budget_curve")) and curve.get("points"):
            by_dataset.setdefault(r.dataset, []).append((r, curve))
    out = []
    for dataset, found in by_dataset.items():
        fig, ax = new_figure(4.4, 2.8)
        for r, curve in found:
            pts = sorted(curve["points"], key=lambda p: p["budget"])
            x = [p["budget"] for p in pts]
            ax.plot(x, [p["accuracy"] for p in pts], marker="o", color=r.colour, label=r.label, linewidth=1.4)
            ax.fill_between(x, [p["ci_low"] for p in pts], [p["ci_high"] for p in pts], color=r.colour, alpha=0.15,
                            linewidth=0)
        ax.set_xscale("log", base=2)
        budgets = sorted({p["budget"] for _, curve in found for p in curve["points"]})
        ax.set_xticks(budgets, [f"{b / 1000:g}k" if b >= 1000 else str(b) for b in budgets])
        ax.minorticks_off()
        ax.set_xlabel("context budget (tokens)")
        ax.set_ylabel("accuracy")
        ax.set_ylim(0, 1)
        ax.legend(frameon=False, fontsize="small")
        out.append({"id": f"budget-{dataset}", "png": png_of(fig),
                    "caption": f"{dataset}: accuracy vs context budget (aml-ray explain): the stored memories cut "
                               "to each budget, answered and judged again; band: 95 % bootstrap interval."})
    return out
