"""The ``aml-ray`` command line (typer + rich).

``aml-ray run`` evaluates one participant on one dataset and prints the score table;
``aml-ray reference`` serves the reference BM25 memory system on its own; ``aml-ray explain`` says why a
run scored what it did (failure attribution, the context-budget curve).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from aml_ray.cli_common import CommandGroup, console, err, fail

app = typer.Typer(help="aml-ray: evaluate agent memory systems through the AML Add/Search contract.",
                  cls=CommandGroup,  # an unknown option is named with the command's --help, no far-off guesses
                  pretty_exceptions_enable=False,  # rich tracebacks print locals, which may hold secrets
                  no_args_is_help=True, add_completion=False,
                  rich_markup_mode=None)  # click's plain help: wraps at 80 columns without cutting option names


@app.command()
def run(
    dataset: Annotated[str, typer.Option(help="Benchmark to run.")] = "locomo",
    data: Annotated[Optional[Path], typer.Option(help="Local dataset file; without it the pinned file is "
                                                 "downloaded into the cache and its sha256 checked.")] = None,
    participant: Annotated[str, typer.Option(help="Participant base URL (POST {url}/add, {url}/search) or "
                                             "'reference:bm25' to start the reference system.")] = "reference:bm25",
    add_url: Annotated[Optional[str], typer.Option(help="Add endpoint, overriding {participant}/add.")] = None,
    search_url: Annotated[Optional[str], typer.Option(help="Search endpoint, overriding {participant}/search.")] = None,
    auth: Annotated[str, typer.Option(help="none | Token | Bearer | X-Api-Key")] = "none",
    secret_env: Annotated[Optional[str], typer.Option(help="Environment variable holding the Memory System Key "
                                                      "(never pass the secret itself).")] = None,
    top_k: Annotated[int, typer.Option(min=1, help="Top K for Search (formal: 100).")] = 100,
    limit_samples: Annotated[Optional[int], typer.Option(min=1, help="Only the first N samples.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Run directory (default ./runs/<run_id>).")] = None,
    run_label: Annotated[Optional[str], typer.Option(help="A label recorded in run.json.")] = None,
    max_in_flight: Annotated[int, typer.Option(min=1, help="Participant's declared max in-flight requests.")] = 64,
    rps: Annotated[Optional[float], typer.Option(help="Participant's declared requests/s limit.")] = None,
    allow_hash_mismatch: Annotated[bool, typer.Option(help="Accept a dataset file whose sha256 differs from "
                                                      "the pin (recorded in run.json).")] = False,
    num_cpus: Annotated[Optional[int], typer.Option(help="CPUs for the local Ray cluster.")] = None,
    judge_runs: Annotated[int, typer.Option(min=1, help="Judge each answer N times (mean and std).")] = 1,
    context_budget: Annotated[int, typer.Option(min=1, help="Token budget of the answer context.")] = 16_000,
    answer_prompt: Annotated[Optional[str], typer.Option(help="Answer prompt override (name, path or URL).")] = None,
    answer_prompt_sha256: Annotated[Optional[str], typer.Option(help="Pin for --answer-prompt.")] = None,
    judge_prompt: Annotated[Optional[str], typer.Option(help="Judge prompt override (name, path or URL).")] = None,
    judge_prompt_sha256: Annotated[Optional[str], typer.Option(help="Pin for --judge-prompt.")] = None,
    suite: Annotated[Optional[str], typer.Option(help="Run every bundle of this suite (e.g. 'textual') present "
                                                 "under the datasets directory, instead of --dataset.")] = None,
    bundles_at_once: Annotated[Optional[int], typer.Option(
        min=1, help="With --suite: how many bundles run at a time, sharing the participant's declared limits and "
                    "the models' (default: all; 1: one after another).")] = None,
    datasets_dir: Annotated[Optional[Path], typer.Option("--datasets-dir", "--data-dir", help="Datasets directory "
                                                         "for --suite (default $AML_DATASETS_DIR, else "
                                                         "~/.aml-ray/datasets).")] = None,
    resume: Annotated[Optional[Path], typer.Option(help="Continue the stopped run in this directory.")] = None,
    stream_checkpoints: Annotated[Optional[str], typer.Option(
        help="Streaming mode: fractions of each sample's sessions after which every question is searched, "
             "e.g. '0.5,1'.")] = None,
    retrieval_only: Annotated[bool, typer.Option(
        "--retrieval-only", help="Add and Search only: no answer or judge model is called; the table says "
                                 "what Search returned (coverage, memories per question), with no accuracy.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="Show Ray's own log lines (kept off the console "
                                          "by default).")] = False,
) -> None:
    """Evaluate a memory system on a benchmark (or a whole suite) and print the score tables.

    With --resume RUN_DIR, continue a stopped run: its settings come from RUN_DIR/run.json (pass
    --secret-env again for an authenticated participant); finished Adds and questions are not sent again.

    Every option and the dataset file are checked before the run directory is created or the reference
    system started. Exit codes: 0 the run completed; 1 the run failed (the participant or the contract
    stopped it, it ended partial, or a bundle of the suite failed); 2 a usage or input error.
    """
    from aml_ray.cli_run import RunOptions, execute

    execute(RunOptions(dataset=dataset, data=data, participant=participant, add_url=add_url, search_url=search_url,
                       auth=auth, secret_env=secret_env, top_k=top_k, limit_samples=limit_samples, out=out,
                       run_label=run_label, max_in_flight=max_in_flight, rps=rps,
                       allow_hash_mismatch=allow_hash_mismatch, num_cpus=num_cpus, judge_runs=judge_runs,
                       context_budget=context_budget, answer_prompt=answer_prompt,
                       answer_prompt_sha256=answer_prompt_sha256, judge_prompt=judge_prompt,
                       judge_prompt_sha256=judge_prompt_sha256, suite=suite, bundles_at_once=bundles_at_once,
                       datasets_dir=datasets_dir, resume=resume,
                       stream_checkpoints=stream_checkpoints, retrieval_only=retrieval_only, verbose=verbose))


@app.command()
def rejudge(
    run_dirs: Annotated[list[Path], typer.Argument(help="A completed run directory (with --panel, one or more: "
                                                   "a board of runs of one dataset).")],
    label: Annotated[Optional[str], typer.Option(help="Folder name under RUN_DIR/rejudge/.")] = None,
    judge_prompt: Annotated[Optional[str], typer.Option(help="Judge prompt override (name, path or URL).")] = None,
    judge_prompt_sha256: Annotated[Optional[str], typer.Option(help="Pin for --judge-prompt.")] = None,
    errata: Annotated[Optional[Path], typer.Option(help="An errata file of the run's bundle (corrected gold answers "
                                                   "or excluded questions, aml_ray/errata/ ships locomo.json), applied "
                                                   "first and recorded.")] = None,
    panel: Annotated[bool, typer.Option("--panel", help="Judge under every protocol of the judge panel (the "
                                        "run's own, LongMemEval upstream, strict): accuracy, agreement, Cohen's "
                                        "kappa, and each run's rank under each protocol.")] = False,
    calibration: Annotated[Optional[Path], typer.Option(help="With --panel: a JSON Lines file of answers with "
                                                        "human verdicts (aml_ray/scoring/calibration.py).")] = None,
) -> None:
    """Re-score a finished run with the judge configured now (JUDGE_* variables); answers are reused.
    'aml-ray compare RUN_DIR RUN_DIR/rejudge/LABEL' shows what it changed."""
    from aml_ray.config import model_endpoint_from_env

    if panel and errata is not None:
        fail("--errata re-scores one run with the configured judge: run it first, then --panel on RUN_DIR/rejudge/LABEL")
    if panel:
        return _rejudge_panel(run_dirs, label=label, calibration=calibration, judge_prompt=judge_prompt)
    if len(run_dirs) != 1 or calibration is not None:
        fail("pass one RUN_DIR (several, and --calibration, need --panel)")
    from aml_ray.cli_tables import render_table
    from aml_ray.run.rejudge import rejudge as do_rejudge

    try:
        judge = model_endpoint_from_env("judge")
        result = do_rejudge(run_dirs[0], judge, label=label, prompt=judge_prompt, prompt_sha256=judge_prompt_sha256,
                            errata=errata)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    console.print(render_table(result.table, offline=judge.offline, title=f"re-judged by {judge.model}"))
    console.print(f"written to {result.out_dir}")


def _rejudge_panel(run_dirs: list[Path], *, label: Optional[str], calibration: Optional[Path],
                   judge_prompt: Optional[str]) -> None:
    """``aml-ray rejudge --panel``: :func:`aml_ray.run.panel.rejudge_panel` and its tables."""
    from aml_ray.cli_panel import panel_tables
    from aml_ray.config import model_endpoint_from_env
    from aml_ray.run.panel import rejudge_panel
    from aml_ray.scoring.calibration import load_calibration

    if judge_prompt is not None:
        fail("--judge-prompt does not apply with --panel: the panel's protocols pin their own prompts")
    try:
        judge = model_endpoint_from_env("judge")
        items = load_calibration(calibration) if calibration is not None else None
        result = rejudge_panel(run_dirs, judge, label=label, calibration=items)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    for table in panel_tables(result):
        console.print(table)
    console.print("written to " + ", ".join(str(run.out_dir) for run in result.runs))


@app.command()
def reference(
    db: Annotated[Path, typer.Option(help="SQLite file for the memories.")] = Path("reference.sqlite3"),
    host: Annotated[str, typer.Option(help="Bind address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0 picks a free one).")] = 8000,
    auth: Annotated[str, typer.Option(help="none | Token | Bearer | X-Api-Key")] = "none",
    secret_env: Annotated[Optional[str], typer.Option(help="Environment variable holding the secret.")] = None,
) -> None:
    """Serve the reference BM25 memory system (POST /add, POST /search, GET /health)."""
    from aml_ray.reference.server import main

    argv = ["--db", str(db), "--host", host, "--port", str(port), "--auth", auth]
    if secret_env:
        argv += ["--secret-env", secret_env]
    sys.exit(main(argv))


@app.command()
def compare(
    runs: Annotated[list[Path], typer.Argument(metavar="RUN_DIR", help="Two or more run directories; each is "
                                               "compared with the first.")],
    json_output: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON (with the ids of the "
                                              "questions that flipped) instead of tables.")] = False,
    allow_different_size: Annotated[bool, typer.Option(
        "--allow-different-size", help="Compare runs of different sizes (samples, scorable questions) on the "
                                       "questions both hold; the output marks it.")] = False,
) -> None:
    """Compare runs question by question: per category the accuracy difference with a paired bootstrap
    interval, McNemar's exact test and the questions that flipped (aml_ray.compare).

    Refuses (exit 2), naming each differing entry, runs whose dataset, prompts, models, Top K, judge runs,
    context budget or stream checkpoints differ, and runs of different sizes (samples or scorable
    questions, both named) unless --allow-different-size.
    """
    import json

    from aml_ray.compare import compare_runs, different_size_note, render_comparison
    from aml_ray.run.evidence import EvidenceError

    try:
        result = compare_runs(runs, allow_different_size=allow_different_size)
    except (FileNotFoundError, ValueError, EvidenceError) as exc:
        fail(str(exc))
    for comparison in result["comparisons"]:  # allowed, and said on stderr too (JSON says "different_size")
        if comparison["different_size"]:
            err.print("[bold yellow]warning:[/] ", end="")
            err.print(f"{comparison['other']['label']} against {comparison['base']['label']}: "
                      f"{different_size_note(comparison)}", markup=False, highlight=False)
    if json_output:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
        return
    try:
        from aml_ray.datasets.registry import get_dataset

        names = get_dataset(result["dataset"]).category_names
    except (KeyError, ValueError):
        names = None
    for comparison in result["comparisons"]:
        console.print(render_comparison(comparison, category_names=names))


@app.command()
def report(
    runs: Annotated[list[Path], typer.Argument(metavar="RUN_DIR", help="Run directories (or suite run directories); "
                                               "several are overlaid, one colour each.")],
    out: Annotated[Path, typer.Option(help="The HTML file to write.")] = Path("report.html"),
    title: Annotated[str, typer.Option(help="The report's title.")] = "aml-ray report",
) -> None:
    """Write one self-contained HTML file (no CDN, figures inline) with per-category accuracy and its bootstrap
    intervals, Add and Search latency and context-token histograms (aml_ray.report)."""
    from aml_ray.run.evidence import EvidenceError
    from aml_ray.report import write_report

    try:
        path = write_report(runs, out, title=title)
    except (FileNotFoundError, ValueError, EvidenceError) as exc:
        fail(str(exc))
    console.print(f"report written to {path} ({path.stat().st_size / 1024:,.0f} KiB)")


from aml_ray.explain.cli import explain_command  # noqa: E402
app.command("explain")(explain_command)

from aml_ray.conformance.cli import check_command  # noqa: E402
app.command("check")(check_command)


from aml_ray.serve_app.cli import serve_command  # noqa: E402
app.command("serve")(serve_command)
from aml_ray.serve_app.purge import purge_command; app.command("purge")(purge_command)  # noqa: E402,E702

from aml_ray.coding.cli import coding_app  # noqa: E402
app.add_typer(coding_app, name="coding")

from aml_ray.datasets.cli import datasets_app; app.add_typer(datasets_app, name="datasets")  # noqa: E402,E702
from aml_ray.cluster_cli import cluster_app; app.add_typer(cluster_app, name="cluster")  # noqa: E402,E702



def main() -> None:
    """The ``aml-ray`` command (pyproject's script): :data:`app` with :func:`aml_ray.interrupts.install`'s
    Ctrl-C handler.

    A Ray cluster this process started and still holds is shut down before the process exits
    (:func:`aml_ray.run.ray_runtime.shutdown_ray`), also after an error or a Ctrl-C. A command a Ctrl-C
    reached exits with 130 (:data:`aml_ray.interrupts.EXIT_INTERRUPTED`), also when click turned the
    interrupt into its "Aborted!" or Python dropped it inside a finaliser.
    """
    from aml_ray import interrupts

    interrupts.install()
    code: int | str | None = 0
    try:
        app()
    except SystemExit as exc:
        code = exc.code
    finally:
        _shutdown_own_ray()
    if interrupts.came() and code in (0, 1, None):
        code = interrupts.EXIT_INTERRUPTED
    sys.exit(code)


def _shutdown_own_ray() -> None:
    """Shut down the local cluster this process started, if it still runs; a Ctrl-C during it is let go."""
    if "ray" not in sys.modules:
        return
    from aml_ray.run.ray_runtime import shutdown_ray, started_here

    try:
        if started_here():
            shutdown_ray()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
