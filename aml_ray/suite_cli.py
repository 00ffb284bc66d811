"""``aml-ray run --suite NAME``: run every present bundle of a suite and print one table per dataset and Overall.

The tables (rich): per dataset, one row per category then the dataset's overall row, each with its
coverage, plus the bundle's secondary metrics (task averages); then the Overall table, one row per
bundle of the suite (ran, skipped or failed, with the reason) and the Overall row computed by the
suite's aggregation rule, whose text is the caption.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

STAGES = ("add", "search", "answer", "judge")
#: Scorers whose rows carry lexical F1 / BLEU-1 (the others leave them null).
LEXICAL_SCORERS = ("binary_judge", "category_judge")


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _category_label(category: str, names: dict[str, str]) -> str:
    """``"1 multi-hop"`` for LoCoMo; a name that only respells the code (``event_ordering``) is not repeated."""
    name = names.get(category)
    if not name or name.replace(" ", "_").replace("-", "_") == category.replace("-", "_"):
        return category
    return f"{category} {name}"


def _with_ci(value: float | None, low: float | None, high: float | None, se: float | None = None) -> str:
    """``0.512 [0.473, 0.551]``: a score and its 95 % bootstrap interval; ``± se`` when no interval is known."""
    if value is None:
        return "-"
    if low is None or high is None:
        return f"{value:.3f}" + ("" if se is None else f" ± {se:.3f}")
    return f"{value:.3f} [{low:.3f}, {high:.3f}]"


def _ci_caption() -> str:
    from aml_ray.scoring.bootstrap import RESAMPLES, SEED

    return f"[95 % percentile bootstrap interval: {RESAMPLES:,} question resamples, seed {SEED}]"


def dataset_table(outcome, bundle, category_names: dict[str, str], *, offline: bool) -> Table:
    """One dataset's table: a row per category and the dataset row, each with coverage.

    Args:
        outcome: the bundle's :class:`~aml_ray.run.suite_run.BundleOutcome` (status ``ran``).
        bundle: its :class:`~aml_ray.suite.Bundle`.
        category_names: display names of the categories.
        offline: the offline answerer/judge was used (said in the caption).
    """
    lexical = bundle.scorer in LEXICAL_SCORERS
    t = Table(title=f"{bundle.name}: {bundle.title} ({bundle.scorer})",
              caption=f"score = mean credit over all non-excluded questions (errors count 0) {_ci_caption()}; "
                      f"coverage = scored / total; {bundle.judge_protocol_label}"
                      + ("; OFFLINE answerer and judge: not official scores" if offline else ""))
    cols = ["category", "n", "scored", "errors", "excluded", "coverage", "score"] + (["F1", "BLEU-1"] if lexical else [])
    for c in cols:
        t.add_column(c, justify="left" if c == "category" else "right")
    for r in outcome.result.table.to_dicts():
        name = _category_label(r["category"], category_names)
        score = _with_ci(r["accuracy"], r.get("accuracy_ci_low"), r.get("accuracy_ci_high"), r["accuracy_se"])
        cells = [name, str(r["n_total"]), str(r["n_scored"]), str(r["n_errors"]), str(r["n_excluded"]),
                 _num(r["coverage"]), score] + ([_num(r["f1"]), _num(r["bleu1"])] if lexical else [])
        t.add_row(*cells, style="bold" if r["category"] == "overall" else None)
    for name, value in outcome.task_averages.items():
        t.add_row(name, "", "", "", "", _num(outcome.coverage), _num(value), *([""] * (2 if lexical else 0)),
                  style="italic")
    return t


def overall_table(result, *, offline: bool) -> Table:
    """The Overall table: every bundle of the suite run, then Overall by the suite's rule."""
    suite = result.suite
    t = Table(title=f"Overall: suite {suite.name} {suite.version}",
              caption=f"{suite.aggregation.rule} Scores {_ci_caption()}; Overall's interval resamples each "
                      "dataset's questions within the dataset, then takes the unweighted mean."
                      + (" OFFLINE answerer and judge: not official scores." if offline else ""))
    for c in ("dataset", "status", "questions", "scored", "coverage", "score", "note"):
        t.add_column(c, justify="right" if c in ("questions", "scored", "coverage", "score") else "left",
                     overflow="fold")
    for o in result.outcomes:
        # the whole reason (the column folds it): it is the user's next step, and an absent bundle's names the
        # file looked for and the fetch command
        note = o.reason or ""
        if o.status == "ran":
            extra = [f"{k} {_num(v)}" for k, v in o.task_averages.items()]
            if o.substitute_for:
                extra.append(f"stands in for {o.substitute_for}")
            note = "; ".join(extra)
        t.add_row(o.name, o.status, str(o.n_total) if o.status == "ran" else "-",
                  str(o.n_scored) if o.status == "ran" else "-", _num(o.coverage),
                  _with_ci(o.score, *o.score_ci, o.score_se), note,
                  style=None if o.status == "ran" else "dim")
    ov = result.overall
    lacks = ov.get("lacks") or []
    t.add_row("Overall", f"{ov['datasets']} dataset(s)" + (", incomplete" if lacks else ""), str(ov["n_total"]),
              str(ov["n_scored"]), _num(ov["coverage"]), _with_ci(ov["score"], ov.get("score_ci_low"),
                                                                   ov.get("score_ci_high")),
              "unweighted mean of the dataset scores" + (f"; INCOMPLETE, lacks: {', '.join(lacks)}" if lacks else ""),
              style="bold")
    return t


def run_suite(name: str, *, participant, participant_label: str, answer, judge, out: Path, run_id: str,
              run_label: str | None, datasets_dir: Path | None, top_k: int, context_budget: int, judge_runs: int,
              limit_samples: int | None, allow_hash_mismatch: bool, num_cpus: int | None,
              bundles: list[str] | None = None, bundles_at_once: int | None = None,
              console: Console | None = None) -> Any:
    """Run a suite and print its tables (what ``aml-ray run --suite`` does after starting the participant).

    Args:
        name: the suite name or file.
        participant / participant_label: the started participant and how outputs name it.
        answer / judge: the model endpoints (offline ones are flagged in every table).
        out / run_id / run_label: the suite run directory and ids.
        datasets_dir: the datasets directory (None: ``$AML_DATASETS_DIR`` or the default).
        top_k / context_budget / judge_runs: the run's values; those that differ from the suite's are
            reported as deviations from the release baseline.
        limit_samples / allow_hash_mismatch / num_cpus / bundles / bundles_at_once: see
            :class:`~aml_ray.run.suite_run.SuiteConfig`.
        console: where to print (default: stdout at the command line's width, ``COLUMNS`` when set).

    Returns:
        The :class:`~aml_ray.run.suite_run.SuiteResult`.

    Raises:
        FileNotFoundError: unknown suite.
        FileExistsError: ``out`` already holds a suite run.
        ValueError: an unknown bundle name.
    """
    from aml_ray.cli_common import make_console
    from aml_ray.datasets.registry import DATASETS
    from aml_ray.run.suite_run import SuiteConfig, evaluate_suite
    from aml_ray.suite import datasets_dir as resolve_datasets_dir
    from aml_ray.suite import load_suite

    console = console or make_console()
    suite = load_suite(name)
    root = resolve_datasets_dir(datasets_dir)
    offline = answer.offline or judge.offline
    console.print(f"[bold]aml-ray[/] suite [cyan]{suite.name} {suite.version}[/] run [cyan]{run_id}[/] x "
                  f"{participant_label} -> {out} (datasets: {root})")
    if offline:
        console.print("[yellow]No ANSWER_API_BASE / JUDGE_API_BASE set: using the OFFLINE extractive answerer and "
                      "lexical judge (not official models).[/]")
    cfg = SuiteConfig(participant=participant, answer=answer, judge=judge, out_dir=out, suite=name,
                      datasets_dir=root, top_k=top_k, context_budget_tokens=context_budget, judge_runs=judge_runs,
                      limit_samples=limit_samples, allow_hash_mismatch=allow_hash_mismatch, bundles=bundles,
                      bundles_at_once=bundles_at_once, run_id=run_id, run_label=run_label, participant_label=participant_label)
    # one live display for the bundles that run at once: a bar per bundle and stage, removed as the bundle ends
    state: dict[str, Any] = {"progress": None, "tasks": {}}

    def on_bundle(kind: str, value) -> None:
        if kind == "start":
            console.print(f"[bold]>[/] {value['name']}: {value['title']} ({value['path']})")
            if state["progress"] is None:
                state["progress"] = Progress(TextColumn("{task.description:>25}"), BarColumn(), MofNCompleteColumn(),
                                             TimeElapsedColumn(), console=console, transient=True)
                state["progress"].start()
            return
        o = value
        for key in [k for k in state["tasks"] if k[0] == o.name]:
            state["progress"].remove_task(state["tasks"].pop(key))
        if o.status == "ran":
            console.print(f"  {o.name}: score {_num(o.score)}, coverage {_num(o.coverage)} "
                          f"({o.n_scored}/{o.n_total} scored) in {o.wall_s:.1f} s")
        else:
            console.print(f"  [yellow]{o.status}[/] {o.name}: {o.reason}"
                          + (f" (after {o.wall_s:.1f} s)" if o.wall_s else ""))

    def on_progress(bundle: str, kind: str, values: dict[str, int]) -> None:
        progress = state["progress"]
        if progress is None:
            return
        if kind == "totals":
            for stage in STAGES:
                if values.get(stage):  # a stage with nothing to do (a retrieval-only run's answers) has no bar
                    state["tasks"][(bundle, stage)] = progress.add_task(f"{bundle} {stage}", total=values[stage])
        else:
            for stage, done in values.items():
                if (bundle, stage) in state["tasks"]:
                    progress.update(state["tasks"][(bundle, stage)], completed=done)

    try:
        result = evaluate_suite(cfg, on_bundle=on_bundle, on_progress=on_progress, num_cpus=num_cpus)
    finally:
        if state["progress"] is not None:
            state["progress"].stop()
    for o in result.outcomes:
        if o.status == "ran":
            bundle = suite.bundle(o.name)
            console.print(dataset_table(o, bundle, DATASETS[bundle.dataset].category_names, offline=offline))
    console.print(overall_table(result, offline=offline))
    if result.info["differences_from_release_baseline"]:
        not_run = [o.name for o in result.outcomes if o.status != "ran"]
        devs = sorted({d for o in result.outcomes for d in o.deviations})
        console.print("[yellow]Not comparable with the release baseline:[/] "
                      + (f"not run: {', '.join(not_run)}" if not_run else "")
                      + ("; " if not_run and devs else "")
                      + (f"deviations: {'; '.join(devs[:5])}{' ...' if len(devs) > 5 else ''}" if devs else "")
                      + f" (all in {out / 'suite.json'})")
    else:
        console.print("[green]Matches the release baseline.[/]")
    console.print(f"wall {result.info['wall_s']:.1f} s; suite.json and one run directory per dataset in {out}")
    return result
