"""The ``aml-ray`` command line (typer + rich).

``aml-ray run`` evaluates one participant on one dataset and prints the score table;
``aml-ray reference`` serves the reference BM25 memory system on its own.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from aml_ray.cli_common import (EXIT_RUN_FAILED, EXIT_USAGE, REFERENCE_PREFIX, console, err, fail,
                               open_participant, participant_spec)

app = typer.Typer(help="aml-ray: evaluate agent memory systems through the AML Add/Search contract.",
                  pretty_exceptions_enable=False,  # rich tracebacks print locals, which may hold secrets
                  no_args_is_help=True, add_completion=False,
                  rich_markup_mode=None)  # click's plain help: wraps at 80 columns without cutting option names

STAGES = ("add", "search", "answer", "judge")


def accuracy_cell(r: dict) -> str:
    """``0.512 [0.473, 0.551]``: a table row's accuracy and its 95 % bootstrap interval (``-`` when none)."""
    if r.get("accuracy") is None:
        return "-"
    if r.get("accuracy_ci_low") is None:  # a table from before the interval columns
        return f"{r['accuracy']:.3f} ± {r['accuracy_se']:.3f}"
    return f"{r['accuracy']:.3f} [{r['accuracy_ci_low']:.3f}, {r['accuracy_ci_high']:.3f}]"


def render_table(result_table, *, offline: bool, title: str, category_names: dict[str, str] | None = None) -> Table:
    """A rich table of the aggregated scores (one row per category, then overall); accuracy with its 95 %
    bootstrap interval (:mod:`aml_ray.scoring.bootstrap`; ``accuracy_se`` stays in results.json)."""
    from aml_ray.scoring.bootstrap import RESAMPLES, SEED

    t = Table(title=title, caption=f"accuracy [95 % percentile bootstrap interval: {RESAMPLES:,} question "
              f"resamples, seed {SEED}]; coverage = scored / total; "
              + ("OFFLINE answerer and judge: not official scores" if offline else "judge: LLM"))
    for col in ("category", "n", "scored", "errors", "excluded", "coverage", "accuracy", "F1", "BLEU-1"):
        t.add_column(col, justify="left" if col == "category" else "right")

    def pct(x):
        return "-" if x is None else f"{x:.3f}"

    for r in result_table.to_dicts():
        acc = accuracy_cell(r)
        name = r["category"] + (f" {category_names[r['category']]}" if r["category"] in (category_names or {}) else "")
        t.add_row(name, str(r["n_total"]), str(r["n_scored"]), str(r["n_errors"]),
                  str(r["n_excluded"]), pct(r["coverage"]), acc, pct(r["f1"]), pct(r["bleu1"]),
                  style="bold" if r["category"] == "overall" else None)
    return t


def render_recall_table(rows: list[dict], *, category_names: dict[str, str] | None = None) -> Table:
    """A rich table of evidence recall (:func:`aml_ray.scoring.evidence_recall.recall_table`): fuzzy rule,
    R@10 and R@100 with their 95 % bootstrap intervals, the exact rule's recall@10 beside them."""
    t = Table(title="evidence recall", caption="recall@K = evidence turns covered by the first K memories (fuzzy: "
              ">= half the turn's content words; exact: the turn's text); n = questions with evidence; "
              "[low, high] = 95 % bootstrap interval")
    for col in ("category", "n", "R@1", "R@5", "R@10", "R@25", "R@100", "exact R@10", "hit", "first rank"):
        t.add_column(col, justify="left" if col == "category" else "right")

    def f(x, digits=3):
        return "-" if x is None else f"{x:.{digits}f}"

    for r in rows:
        name = r["category"] + (f" {category_names[r['category']]}" if r["category"] in (category_names or {}) else "")
        def ci(k):
            low, high = r.get(f"recall@{k}_ci_low"), r.get(f"recall@{k}_ci_high")
            return f(r[f"recall@{k}"]) + ("" if low is None else f" [{low:.2f}, {high:.2f}]")

        t.add_row(name, str(r["n"]), *(ci(k) if k in (10, 100) else f(r[f"recall@{k}"]) for k in (1, 5, 10, 25, 100)),
                  f(r["recall_exact@10"]),
                  f(r["hit_share"]), f(r["median_first_rank"], 1), style="bold" if r["category"] == "overall" else None)
    return t


def render_retrieval_table(result_table, *, title: str, category_names: dict[str, str] | None = None) -> Table:
    """A rich table of a retrieval-only run (:func:`aml_ray.scoring.retrieval.retrieval_table`)."""
    t = Table(title=f"{title}, retrieval only", caption="no answer or judge model was called: coverage = "
              "questions whose Search succeeded / total; memories = mean returned per such question")
    for col in ("category", "n", "retrieved", "errors", "excluded", "coverage", "memories", "empty"):
        t.add_column(col, justify="left" if col == "category" else "right")
    for r in result_table.to_dicts():
        name = r["category"] + (f" {category_names[r['category']]}" if r["category"] in (category_names or {}) else "")
        t.add_row(name, str(r["n_total"]), str(r["n_retrieved"]), str(r["n_errors"]), str(r["n_excluded"]),
                  "-" if r["coverage"] is None else f"{r['coverage']:.3f}",
                  "-" if r["memories_mean"] is None else f"{r['memories_mean']:.1f}", str(r["n_empty"]),
                  style="bold" if r["category"] == "overall" else None)
    return t


def _checkpoints(text: str | None) -> list[float] | None:
    if not text:
        return None
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(f"--stream-checkpoints {text!r}: give fractions separated by commas, e.g. '0.5,1'")
    if not values or any(not 0 < v <= 1 for v in values):
        fail(f"--stream-checkpoints {text!r}: every fraction must be in (0, 1]")
    return values


def _previous_run(run_dir: Path) -> dict:
    import json

    path = run_dir / "run.json"
    if not path.is_file():
        fail(f"--resume {run_dir}: no run.json there; pass a directory made by 'aml-ray run'")
    try:
        return json.loads(path.read_text())
    except ValueError:
        fail(f"--resume {run_dir}: run.json is damaged; nothing was changed")


def _missing_top(path: Path) -> Path | None:
    """The highest folder of ``path`` that does not exist yet (what ``mkdir(parents=True)`` creates), or None."""
    top = None
    for folder in (path, *path.parents):
        if folder.exists():
            break
        top = folder
    return top


def _remove_unused_run_dir(out: Path, top: Path | None) -> None:
    """After a usage error: remove the run directory this command created if no run was recorded in it
    (no run.json), and the empty folders above it that it created. Nothing that existed before is touched."""
    if top is None or not out.is_dir() or (out / "run.json").exists():
        return
    shutil.rmtree(out, ignore_errors=True)
    for folder in out.parents:
        if top != folder and top not in folder.parents:
            break
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty


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
    from aml_ray.config import cache_dir, model_endpoint_from_env
    from aml_ray.datasets.fetch import DatasetError
    from aml_ray.evidence import EvidenceError
    from aml_ray.datasets.registry import check_data_path, get_dataset
    from aml_ray.evaluation import EvaluationConfig, evaluate
    from aml_ray.ids import new_run_id
    from aml_ray.pipeline import StageFailed
    from aml_ray.prompts import load_prompt
    from aml_ray.ray_runtime import set_verbose
    from aml_ray.suite import verify_loaded_bundle

    set_verbose(verbose)
    run_id = new_run_id()
    stream = _checkpoints(stream_checkpoints)
    if resume is not None:
        previous = _previous_run(resume)
        out, run_id, dataset = resume, previous["run_id"], previous["dataset"]["name"]
        data, top_k, limit_samples = Path(previous["dataset"]["file"]), previous["top_k"], previous["limit_samples"]
        judge_runs, context_budget = previous["judge_runs"], previous["context_budget_tokens"]
        stream, run_label = previous.get("stream_checkpoints"), previous.get("run_label")
        retrieval_only = previous.get("retrieval_only", False)
        allow_hash_mismatch = previous["dataset"].get("hash_mismatch_allowed", False)
        p = previous["participant"]
        participant, auth = p["label"], p["auth"]
        if not participant.startswith(REFERENCE_PREFIX):
            add_url, search_url = p["add_url"], p["search_url"]
        answer_prompt, answer_prompt_sha256 = previous["prompts"]["answer"]["source"], previous["prompts"]["answer"]["sha256"]
        judge_prompt, judge_prompt_sha256 = previous["prompts"]["judge"]["source"], previous["prompts"]["judge"]["sha256"]
    out = out or Path("runs") / run_id
    if resume is None and (out / "run.json").exists():
        fail(f"--out {out}: a run is already there; choose a new directory, or continue it with --resume {out}")
    try:
        answer, judge = model_endpoint_from_env("answer"), model_endpoint_from_env("judge")
    except ValueError as exc:
        fail(str(exc))
    # every option, then the dataset file, is checked before anything is created (issue 24, item 7)
    participant_spec(participant, add_url, search_url, auth, secret_env, max_in_flight, rps)
    created = _missing_top(out)  # what out.mkdir creates, removed again after a usage error that recorded no run
    if suite is not None:  # every present bundle of the suite; the suite fixes dataset files and prompts
        if retrieval_only:
            fail("--retrieval-only runs one dataset (--dataset); a suite's Overall needs scored bundles: drop --suite")
        if data is not None or answer_prompt or judge_prompt:
            fail("--suite fixes the dataset files and prompts: drop --data / --answer-prompt / --judge-prompt")
        from aml_ray.suite import load_suite
        from aml_ray.suite_cli import run_suite

        try:
            multimodal = load_suite(suite).track == "multimodal"
        except (FileNotFoundError, ValueError) as exc:
            fail(str(exc))
        out.mkdir(parents=True, exist_ok=True)
        try:
            with open_participant(participant, add_url, search_url, auth, secret_env, out, max_in_flight, rps,
                              multimodal=multimodal) as (label, spec):
                try:
                    result = run_suite(suite, participant=spec, participant_label=label, answer=answer, judge=judge,
                                       out=out, run_id=run_id, run_label=run_label, datasets_dir=datasets_dir,
                                       top_k=top_k, context_budget=context_budget, judge_runs=judge_runs,
                                       limit_samples=limit_samples, allow_hash_mismatch=allow_hash_mismatch,
                                       num_cpus=num_cpus, console=console)
                except (FileNotFoundError, FileExistsError, ValueError) as exc:
                    fail(str(exc))
        except typer.Exit as exc:
            if exc.exit_code == EXIT_USAGE:
                _remove_unused_run_dir(out, created)
            raise
        if any(o.status == "failed" for o in result.outcomes):
            raise typer.Exit(EXIT_RUN_FAILED)
        return
    try:  # the file is loaded once: evaluate() takes the samples checked here (DatasetSpec.check / load)
        declared = get_dataset(dataset)
        check_data_path(declared, data)
        for prompt, pin in ((answer_prompt or declared.answer_prompt, answer_prompt_sha256),
                            (judge_prompt or declared.judge_prompt, judge_prompt_sha256)):
            load_prompt(prompt, pin)
        file, samples = declared.check(data, cache_dir(), allow_hash_mismatch)
        # the suite's count check, as evaluate() makes it (its default suite): a bundle that differs is refused here
        verify_loaded_bundle(declared.name, data or file, samples, allow_hash_mismatch=allow_hash_mismatch)
        del samples  # kept by the registry for evaluate()'s load of the same file
    except (DatasetError, OSError, ValueError) as exc:
        fail(str(exc))
    multimodal = declared.track == "multimodal"
    out.mkdir(parents=True, exist_ok=True)
    try:
        with open_participant(participant, add_url, search_url, auth, secret_env, out, max_in_flight, rps,
                          multimodal=multimodal) as (label, spec):
            cfg = EvaluationConfig(dataset=dataset, participant=spec, answer=answer, judge=judge, out_dir=out,
                                   data_path=data, allow_hash_mismatch=allow_hash_mismatch, top_k=top_k,
                                   limit_samples=limit_samples, run_id=run_id, run_label=run_label,
                                   participant_label=label, judge_runs=judge_runs, context_budget_tokens=context_budget,
                                   answer_prompt=answer_prompt, answer_prompt_sha256=answer_prompt_sha256,
                                   judge_prompt=judge_prompt, judge_prompt_sha256=judge_prompt_sha256,
                                   stream_checkpoints=stream, resume=resume is not None,
                                   retrieval_only=retrieval_only)
            console.print(f"[bold]aml-ray[/] run [cyan]{run_id}[/]: {dataset} x {label} -> {out}")
            if retrieval_only:
                console.print("[yellow]Retrieval only: Add and Search; no answer or judge model is called.[/]")
            elif answer.offline or judge.offline:
                console.print("[yellow]No ANSWER_API_BASE / JUDGE_API_BASE set: using the OFFLINE extractive "
                              "answerer and lexical judge (not official models).[/]")
            with Progress(TextColumn("{task.description:>8}"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), console=console, transient=False) as progress:
                tasks: dict[str, int] = {}

                def on_progress(kind: str, values: dict[str, int]) -> None:
                    if kind == "totals":
                        for stage in STAGES:
                            tasks[stage] = progress.add_task(stage, total=values.get(stage, 0))
                    else:
                        for stage, done in values.items():
                            if stage in tasks:
                                progress.update(tasks[stage], completed=done)

                try:
                    result = evaluate(cfg, on_progress=on_progress, num_cpus=num_cpus)
                except StageFailed as exc:
                    progress.stop()
                    fail(f"run stopped: {exc.summary}\n  evidence so far and run.json (status=failed) are in "
                          f"{out}", EXIT_RUN_FAILED)
                except (DatasetError, EvidenceError, FileExistsError, FileNotFoundError, ValueError) as exc:
                    progress.stop()
                    fail(str(exc))
    except typer.Exit as exc:
        if exc.exit_code == EXIT_USAGE:
            _remove_unused_run_dir(out, created)
        raise
    info = result.run_info
    ds = info["dataset"]
    title = f"{dataset}: {label} (top_k={top_k}, run {run_id})"
    pooled = ", every checkpoint pooled" if info.get("by_checkpoint") else ""
    names = get_dataset(dataset).category_names
    console.print(render_retrieval_table(result.table, title=title + pooled, category_names=names) if retrieval_only
                  else render_table(result.table, offline=info["offline_models"], title=title + pooled,
                                    category_names=names))
    for checkpoint in info.get("by_checkpoint", []):  # Streaming: each checkpoint's own table (the one above pools them)
        import polars as pl

        at = pl.DataFrame(checkpoint["table"])
        when = f"after {checkpoint['fraction']:.0%} of each sample's sessions"
        console.print(render_retrieval_table(at, title=f"{title}, {when}", category_names=names) if retrieval_only
                      else render_table(at, offline=info["offline_models"], title=f"{title}, {when}", category_names=names))
    if any(r["n"] for r in info["evidence_recall"]["table"]):
        console.print(render_recall_table(info["evidence_recall"]["table"], category_names=names))
    console.print(f"samples {ds['samples']}, chunks {ds['chunks']}, messages {ds['messages']}, questions "
                  f"{ds['questions']} ({ds['scorable_questions']} scorable, {ds['excluded_questions']} excluded"
                  f" and reported, never scored)")
    a, s = info["adds"], info["search"]
    console.print(f"Add latency p50 {_ms(a['latency_ms']['p50'])} / p95 {_ms(a['latency_ms']['p95'])} "
                  f"({a['ok']} ok, {a['failed']} failed, {a['retried']} retried); Search latency p50 "
                  f"{_ms(s['latency_ms']['p50'])} / p95 {_ms(s['latency_ms']['p95'])} ({s['failed']} failed); "
                  f"wall {info['wall_s']:.1f} s")
    console.print(f"evidence: {out}/evidence ({info['evidence']['add_rows']} Add rows, "
                  f"{info['evidence']['question_rows']} question rows); run.json and results.json in {out}")
    if info["status"] != "completed":  # partial: the table covers fewer Adds or questions than the dataset
        err.print(f"[bold yellow]run {info['status']}:[/] ", end="")
        err.print(f"{info.get('error')} (run.json status={info['status']}; the evidence names each failed request)",
                  markup=False)
        raise typer.Exit(1)


def _ms(value: float | None) -> str:
    """A latency in milliseconds for the console (``-`` when no request of the kind succeeded)."""
    return "-" if value is None else f"{value:.1f} ms"


@app.command()
def rejudge(
    run_dir: Annotated[Path, typer.Argument(help="A completed run directory.")],
    label: Annotated[Optional[str], typer.Option(help="Folder name under RUN_DIR/rejudge/.")] = None,
    judge_prompt: Annotated[Optional[str], typer.Option(help="Judge prompt override (name, path or URL).")] = None,
    judge_prompt_sha256: Annotated[Optional[str], typer.Option(help="Pin for --judge-prompt.")] = None,
) -> None:
    """Re-score a finished run with the judge configured now (JUDGE_* variables); answers are reused."""
    from aml_ray.config import model_endpoint_from_env
    from aml_ray.rejudge import rejudge as do_rejudge

    try:
        judge = model_endpoint_from_env("judge")
        result = do_rejudge(run_dir, judge, label=label, prompt=judge_prompt, prompt_sha256=judge_prompt_sha256)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    console.print(render_table(result.table, offline=judge.offline, title=f"re-judged by {judge.model}"))
    console.print(f"written to {result.out_dir}")


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
) -> None:
    """Compare runs question by question: per category the accuracy difference with a paired bootstrap
    interval, McNemar's exact test and the questions that flipped (aml_ray.compare).

    Refuses (exit 2), naming each differing entry, runs whose dataset, prompts, models, Top K, judge runs,
    context budget or stream checkpoints differ.
    """
    import json

    from aml_ray.compare import compare_runs, render_comparison
    from aml_ray.evidence import EvidenceError

    try:
        result = compare_runs(runs)
    except (FileNotFoundError, ValueError, EvidenceError) as exc:
        fail(str(exc))
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
    from aml_ray.evidence import EvidenceError
    from aml_ray.report import write_report

    try:
        path = write_report(runs, out, title=title)
    except (FileNotFoundError, ValueError, EvidenceError) as exc:
        fail(str(exc))
    console.print(f"report written to {path} ({path.stat().st_size / 1024:,.0f} KiB)")


from aml_ray.conformance.cli import check_command  # noqa: E402
app.command("check")(check_command)


from aml_ray.serve_app.cli import serve_command  # noqa: E402
app.command("serve")(serve_command)
from aml_ray.serve_app.purge import purge_command; app.command("purge")(purge_command)  # noqa: E402,E702

from aml_ray.coding.cli import coding_app  # noqa: E402
app.add_typer(coding_app, name="coding")

from aml_ray.datasets.cli import datasets_app; app.add_typer(datasets_app, name="datasets")  # noqa: E402,E702

if __name__ == "__main__":
    app()
