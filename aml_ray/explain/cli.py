"""``aml-ray explain RUN_DIR``: failure attribution and the context-budget curve of a finished run."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from aml_ray.cli_common import console, fail


def parse_budgets(value: str) -> tuple[int, ...]:
    """``"1000,2000,4k"`` -> ``(1000, 2000, 4000)`` (a ``k`` suffix is thousands).

    Raises:
        typer.Exit: code 2 naming ``--budgets`` when a value is not a positive whole number.
    """
    out = []
    for raw in (v.strip().lower() for v in value.split(",") if v.strip()):
        try:
            n = int(float(raw[:-1]) * 1000) if raw.endswith("k") else int(raw)
        except ValueError:
            n = 0
        if n < 1:
            fail(f"--budgets {value!r}: each budget is a positive number of tokens, e.g. '1k,2k,4k,8k,16k'")
        out.append(n)
    if not out:
        fail(f"--budgets {value!r}: give at least one budget, e.g. '1k,2k,4k,8k,16k'")
    return tuple(out)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def explain_command(
    run_dir: Annotated[Path, typer.Argument(help="A run directory made by 'aml-ray run'.")],
    budgets: Annotated[str, typer.Option(help="Context budgets of the curve, in tokens ('k' = thousands).")] =
        "1k,2k,4k,8k,16k",
    no_curve: Annotated[bool, typer.Option("--no-curve", help="Failure attribution only.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
) -> None:
    """Why the run scored what it did, from its stored evidence (the participant is not called again).

    Failure attribution: each wrong question is answered again with its gold evidence as the only memories
    (the run's answer model and judge, ANSWER_* / JUDGE_* as for the run) and classed as a retrieval miss,
    a synthesis miss, unanswerable with gold, a judge disagreement, no gold evidence or an error; with
    P(correct | gold retrieved in top K). The budget curve: the stored memories cut to each budget, answered
    and judged again. Both are cached under RUN_DIR/explain/: a second call calls no model.
    """
    from rich.table import Table

    from aml_ray.explain.attribution import CLASSES, explain_failures
    from aml_ray.explain.budget import budget_curve
    from aml_ray.explain.reanswer import RunModels
    from aml_ray.run.evidence import EvidenceError

    chosen = parse_budgets(budgets)
    try:
        models = RunModels(run_dir)
        attribution = explain_failures(run_dir, models)
        curve = None if no_curve else budget_curve(run_dir, chosen, models)
    except (FileNotFoundError, ValueError, EvidenceError) as exc:
        fail(str(exc))
    if json_output:
        sys.stdout.write(json.dumps({"attribution": {k: v for k, v in attribution.items() if k != "rows"},
                                     "budget_curve": curve}, indent=2) + "\n")
        return
    table = Table(title=f"why {attribution['wrong']} of {attribution['questions']} questions were wrong"
                        + (" (cached)" if attribution["cached"] else ""))
    table.add_column("class")
    table.add_column("questions", justify="right")
    table.add_column("share", justify="right")
    for c in CLASSES:
        table.add_row(c.replace("_", " "), str(attribution["counts"][c]), _pct(attribution["shares"][c]))
    console.print(table)
    p = attribution["p_correct_given_gold_in_top"]
    console.print("P(correct | gold retrieved in top K): " + ", ".join(f"K={k} {_pct(v)}" for k, v in p.items())
                  + f"; gold not retrieved {_pct(attribution['p_correct_given_gold_not_retrieved'])} "
                  f"({attribution['with_gold_evidence']} questions with gold evidence)")
    if curve is not None:
        t = Table(title="accuracy vs context budget" + (" (cached)" if curve["cached"] else ""))
        for name in ("budget", "accuracy", "95 % interval", "context tokens mean", "p95", "questions cut"):
            t.add_column(name, justify="right")
        for pt in curve["points"]:
            t.add_row(f"{pt['budget']:,}", _pct(pt["accuracy"]), f"{_pct(pt['ci_low'])} - {_pct(pt['ci_high'])}",
                      "-" if pt["context_tokens"]["mean"] is None else f"{pt['context_tokens']['mean']:,.0f}",
                      "-" if pt["context_tokens"]["p95"] is None else f"{pt['context_tokens']['p95']:,.0f}",
                      str(pt["questions_cut"]))
        console.print(t)
        console.print("monotone within its intervals: " + ("yes" if curve["monotone_within_intervals"] else "NO"))
