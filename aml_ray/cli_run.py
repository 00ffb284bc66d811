"""``aml-ray run``: its options as one value, each group of them checked in one place, then the run.

:class:`RunOptions` holds what the command line gave; :func:`execute` resolves them in order (a resumed
run's settings from its run.json, :func:`resumed`; the model endpoints; the participant; the dataset
file and prompts, :func:`check_dataset`), then runs a whole suite (:func:`run_suite`) or one dataset
(:func:`run_dataset`) and prints the tables (:func:`print_result`). Every option and the dataset file are
checked before the run directory is created or the reference system started; a usage
error removes what this command created (:func:`remove_unused_run_dir`). Exit codes:
:data:`aml_ray.cli_common.EXIT_OK` / ``EXIT_RUN_FAILED`` / ``EXIT_USAGE``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from aml_ray.cli_common import (EXIT_INTERRUPTED, EXIT_RUN_FAILED, EXIT_USAGE, REFERENCE_PREFIX, console, err, fail,
                                open_participant, participant_spec)
from aml_ray.cli_tables import ms, render_recall_table, render_retrieval_table, render_table

STAGES = ("add", "search", "answer", "judge")


@dataclass(frozen=True)
class RunOptions:
    """The options of ``aml-ray run`` as given (``aml-ray run --help`` describes each)."""

    dataset: str = "locomo"
    data: Path | None = None
    participant: str = "reference:bm25"
    add_url: str | None = None
    search_url: str | None = None
    auth: str = "none"
    secret_env: str | None = None
    top_k: int = 100
    limit_samples: int | None = None
    out: Path | None = None
    run_label: str | None = None
    max_in_flight: int = 64
    rps: float | None = None
    allow_hash_mismatch: bool = False
    num_cpus: int | None = None
    judge_runs: int = 1
    context_budget: int = 16_000
    answer_prompt: str | None = None
    answer_prompt_sha256: str | None = None
    judge_prompt: str | None = None
    judge_prompt_sha256: str | None = None
    suite: str | None = None
    bundles_at_once: int | None = None
    datasets_dir: Path | None = None
    resume: Path | None = None
    stream_checkpoints: str | list[float] | None = None
    retrieval_only: bool = False
    verbose: bool = False
    run_id: str | None = None


def checkpoints(value: str | list[float] | None) -> list[float] | None:
    """``--stream-checkpoints`` as fractions (a resumed run's list is taken as recorded).

    Raises:
        typer.Exit: code 2, naming the option, when a value is not a number in (0, 1].
    """
    if not value:
        return None
    if isinstance(value, list):
        return value
    try:
        values = [float(x) for x in value.split(",") if x.strip()]
    except ValueError:
        fail(f"--stream-checkpoints {value!r}: give fractions of each sample's sessions, e.g. '0.5,1'")
    if not values or any(not 0 < v <= 1 for v in values):
        fail(f"--stream-checkpoints {value!r}: every fraction must be in (0, 1]")
    return values


def resumed(opts: RunOptions) -> RunOptions:
    """``opts`` with the settings of the run in ``opts.resume`` (its run.json), or ``opts`` unchanged.

    The participant's secret is not in run.json: ``--secret-env`` still comes from the command line.

    Raises:
        typer.Exit: code 2 when run.json is missing or damaged, or its run is completed (nothing is changed,
            nothing is sent to the participant).
    """
    if opts.resume is None:
        return opts
    path = opts.resume / "run.json"
    if not path.is_file():
        fail(f"--resume {opts.resume}: no run.json there; pass a directory made by 'aml-ray run'")
    try:
        previous = json.loads(path.read_text())
    except ValueError:
        fail(f"--resume {opts.resume}: run.json is damaged; nothing was changed")
    if previous.get("status") == "completed":  # before the pre-flight, which run_dataset starts early
        fail(f"--resume {opts.resume}: run {previous.get('run_id')} is already completed; nothing to resume")
    p, prompts = previous["participant"], previous["prompts"]
    urls = {} if p["label"].startswith(REFERENCE_PREFIX) else {"add_url": p["add_url"], "search_url": p["search_url"]}
    return dataclasses.replace(
        opts, out=opts.resume, run_id=previous["run_id"], dataset=previous["dataset"]["name"],
        data=Path(previous["dataset"]["file"]), top_k=previous["top_k"], limit_samples=previous["limit_samples"],
        judge_runs=previous["judge_runs"], context_budget=previous["context_budget_tokens"],
        stream_checkpoints=previous.get("stream_checkpoints"), run_label=previous.get("run_label"),
        retrieval_only=previous.get("retrieval_only", False),
        allow_hash_mismatch=previous["dataset"].get("hash_mismatch_allowed", False),
        participant=p["label"], auth=p["auth"], **urls,
        answer_prompt=prompts["answer"]["source"], answer_prompt_sha256=prompts["answer"]["sha256"],
        judge_prompt=prompts["judge"]["source"], judge_prompt_sha256=prompts["judge"]["sha256"])


def missing_top(path: Path) -> Path | None:
    """The highest folder of ``path`` that does not exist yet (what ``mkdir(parents=True)`` creates), or None."""
    top = None
    for folder in (path, *path.parents):
        if folder.exists():
            break
        top = folder
    return top


def remove_unused_run_dir(out: Path, top: Path | None) -> None:
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


def check_dataset(opts: RunOptions):
    """The dataset, its file, its counts and both prompts, checked before anything is created.

    A file that leaves the run no scorable question (none at all, or none in the first ``--limit-samples``
    samples) is refused too (:func:`aml_ray.datasets.validate.require_scorable`).

    The file is loaded once: :func:`aml_ray.run.evaluation.evaluate` takes the samples checked here
    (``DatasetSpec.check`` keeps them in the registry).

    Returns:
        The dataset's :class:`~aml_ray.datasets.base.DatasetSpec`.

    Raises:
        typer.Exit: code 2 naming the dataset, file, count or prompt that is wrong, or the file when the run
            would have no scorable question.
    """
    from aml_ray.config import cache_dir
    from aml_ray.datasets.fetch import DatasetError
    from aml_ray.datasets.registry import check_data_path, get_dataset
    from aml_ray.datasets.validate import require_scorable
    from aml_ray.prompts import load_prompt
    from aml_ray.suite import verify_loaded_bundle

    try:
        declared = get_dataset(opts.dataset)
        check_data_path(declared, opts.data)
        for prompt, pin in ((opts.answer_prompt or declared.answer_prompt, opts.answer_prompt_sha256),
                            (opts.judge_prompt or declared.judge_prompt, opts.judge_prompt_sha256)):
            load_prompt(prompt, pin)
        file, samples = declared.check(opts.data, cache_dir(), opts.allow_hash_mismatch)
        # the suite's count check, as evaluate() makes it (its default suite): a bundle that differs is refused here
        verify_loaded_bundle(declared.name, opts.data or file, samples, allow_hash_mismatch=opts.allow_hash_mismatch)
        # a run that could score nothing would end 'completed' having measured nothing: an input error
        require_scorable(samples, opts.data or file, limit_samples=opts.limit_samples)
    except (DatasetError, OSError, ValueError) as exc:
        fail(str(exc))
    return declared


def execute(opts: RunOptions) -> None:
    """Check every option, run the suite or the dataset, print the tables; exit 1 unless it completed.

    Raises:
        typer.Exit: :data:`~aml_ray.cli_common.EXIT_USAGE` for a usage or input error (the run directory this
            command created is removed again), :data:`~aml_ray.cli_common.EXIT_RUN_FAILED` when the run
            stopped, ended partial, or a bundle of the suite failed.
    """
    from aml_ray.config import model_endpoint_from_env
    from aml_ray.ids import new_run_id
    from aml_ray.run.ray_runtime import set_verbose

    set_verbose(opts.verbose)
    opts = resumed(opts)
    run_id = opts.run_id or new_run_id()
    opts = dataclasses.replace(opts, run_id=run_id, out=opts.out or Path("runs") / run_id,
                               stream_checkpoints=checkpoints(opts.stream_checkpoints))
    if opts.resume is None and (opts.out / "run.json").exists():
        fail(f"--out {opts.out}: a run is already there; choose a new directory, or continue it with "
             f"--resume {opts.out}")
    try:
        answer, judge = model_endpoint_from_env("answer"), model_endpoint_from_env("judge")
    except ValueError as exc:
        fail(str(exc))
    participant_spec(opts.participant, opts.add_url, opts.search_url, opts.auth, opts.secret_env, opts.max_in_flight,
                     opts.rps)
    if opts.suite is None and opts.bundles_at_once is not None:
        fail("--bundles-at-once sets how many bundles of a suite run at a time: give --suite, or drop it")
    if opts.suite is not None:
        if opts.retrieval_only:
            fail("--retrieval-only runs one dataset (--dataset); a suite's Overall needs scored bundles: drop --suite")
        if opts.data is not None or opts.answer_prompt or opts.judge_prompt:
            fail("--suite fixes the dataset files and prompts: drop --data / --answer-prompt / --judge-prompt")
    declared = None if opts.suite is not None else check_dataset(opts)
    if declared is not None and declared.track == "multimodal":  # before the pre-flight, which run_dataset starts early
        from aml_ray.stages.answer import require_vision

        try:
            require_vision(answer, declared.track)
        except ValueError as exc:
            fail(str(exc))
    created = missing_top(opts.out)  # what out.mkdir creates, removed again after a usage error that recorded no run
    try:
        if declared is None:
            run_suite(opts, answer, judge)
        else:
            run_dataset(opts, declared, answer, judge)
    except typer.Exit as exc:
        if exc.exit_code == EXIT_USAGE:
            remove_unused_run_dir(opts.out, created)
        raise


def run_suite(opts: RunOptions, answer, judge) -> None:
    """Every present bundle of ``opts.suite`` (:func:`aml_ray.suite_cli.run_suite` prints its tables).

    Raises:
        typer.Exit: code 2 for an unknown suite or a bad input, 1 when a bundle failed.
    """
    from aml_ray.suite import load_suite
    from aml_ray.suite_cli import run_suite as run_each_bundle

    try:
        multimodal = load_suite(opts.suite).track == "multimodal"
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    if opts.participant == "reference:oracle":
        fail("--participant reference:oracle answers one dataset's questions: run it with --dataset, not --suite")
    opts.out.mkdir(parents=True, exist_ok=True)
    with open_participant(opts.participant, opts.add_url, opts.search_url, opts.auth, opts.secret_env, opts.out,
                          opts.max_in_flight, opts.rps, multimodal=multimodal,
                          baseline={"context_budget": opts.context_budget, "answer_model": answer.model}) as (label, spec):
        try:
            result = run_each_bundle(
                opts.suite, participant=spec, participant_label=label, answer=answer, judge=judge, out=opts.out,
                run_id=opts.run_id, run_label=opts.run_label, datasets_dir=opts.datasets_dir, top_k=opts.top_k,
                context_budget=opts.context_budget, judge_runs=opts.judge_runs, limit_samples=opts.limit_samples,
                allow_hash_mismatch=opts.allow_hash_mismatch, num_cpus=opts.num_cpus,
                bundles_at_once=opts.bundles_at_once, console=console)
        except (FileNotFoundError, FileExistsError, ValueError) as exc:
            fail(str(exc))
        except Exception as exc:  # noqa: BLE001 - Ray's start, an internal error: one line, not a traceback
            fail_internal(exc, opts.out, opts.secret_env)
    if any(o.status == "failed" for o in result.outcomes):
        raise typer.Exit(EXIT_RUN_FAILED)


def run_dataset(opts: RunOptions, declared, answer, judge) -> None:
    """One dataset with a live progress bar per stage, then :func:`print_result`.

    Raises:
        typer.Exit: code 1 when the run stopped or ended partial, 2 for an input error found while loading.
    """
    from aml_ray import interrupts
    from aml_ray.run.preflight import start_preflight
    from aml_ray.run.provenance import start_code_provenance

    from aml_ray.reference.baselines import baseline_options

    opts.out.mkdir(parents=True, exist_ok=True)
    with open_participant(opts.participant, opts.add_url, opts.search_url, opts.auth, opts.secret_env, opts.out,
                          opts.max_in_flight, opts.rps, multimodal=declared.track == "multimodal",
                          baseline=baseline_options(opts.participant, declared, opts.data, opts.context_budget,
                                                    answer.model, opts.allow_hash_mismatch)) as (label, spec):
        # every option and the dataset are checked (execute): the pre-flight's round trips go beside the
        # evaluation's imports below and the run's preparation
        preflight = start_preflight(spec, run_id=opts.run_id, dataset=declared.name, top_k=opts.top_k)
        start_code_provenance()  # run.json's git commit and code hash, off the path to the first Add
        from aml_ray.datasets.fetch import DatasetError
        from aml_ray.run.evaluation import EvaluationConfig, evaluate
        from aml_ray.run.evidence import EvidenceError
        from aml_ray.run.outcome import StageFailed

        cfg = EvaluationConfig(
            dataset=opts.dataset, participant=spec, answer=answer, judge=judge, out_dir=opts.out, data_path=opts.data,
            allow_hash_mismatch=opts.allow_hash_mismatch, top_k=opts.top_k, limit_samples=opts.limit_samples,
            run_id=opts.run_id, run_label=opts.run_label, participant_label=label, judge_runs=opts.judge_runs,
            context_budget_tokens=opts.context_budget, answer_prompt=opts.answer_prompt,
            answer_prompt_sha256=opts.answer_prompt_sha256, judge_prompt=opts.judge_prompt,
            judge_prompt_sha256=opts.judge_prompt_sha256, stream_checkpoints=opts.stream_checkpoints,
            resume=opts.resume is not None, retrieval_only=opts.retrieval_only)
        console.print(f"[bold]aml-ray[/] run [cyan]{opts.run_id}[/]: {opts.dataset} x {label} -> {opts.out}")
        if opts.retrieval_only:
            console.print("[yellow]Retrieval only: Add and Search; no answer or judge model is called.[/]")
        elif answer.offline or judge.offline:
            console.print("[yellow]No ANSWER_API_BASE / JUDGE_API_BASE set: using the OFFLINE extractive "
                          "answerer and lexical judge (not official models).[/]")
        # redrawn once a second, as often as the counts arrive (run_pipeline.PROGRESS_POLL_S): rich's default
        # 10 redraws a second cost the driver CPU beside the participant client (docs/benchmarks.md)
        with Progress(TextColumn("{task.description:>8}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=False, refresh_per_second=1) as progress:
            tasks: dict[str, int] = {}

            def on_progress(kind: str, values: dict[str, int]) -> None:
                if kind == "totals":  # a retrieval-only run calls no model: no answer or judge bar
                    for stage in STAGES[:2] if opts.retrieval_only else STAGES:
                        tasks[stage] = progress.add_task(stage, total=values.get(stage, 0))
                else:
                    for stage, done in values.items():
                        if stage in tasks:
                            progress.update(tasks[stage], completed=done)

            try:
                result = evaluate(cfg, on_progress=on_progress, num_cpus=opts.num_cpus, preflight=preflight)
                if interrupts.came():  # one Python dropped (raised in a finaliser): the run ended meanwhile
                    raise KeyboardInterrupt
            except StageFailed as exc:
                progress.stop()
                fail(f"run stopped: {exc.summary}\n  evidence so far and run.json (status=failed) are in "
                     f"{opts.out}", EXIT_RUN_FAILED)
            except KeyboardInterrupt:
                progress.stop()
                fail(interrupted_message(opts.out), EXIT_INTERRUPTED)
            except (DatasetError, EvidenceError, FileExistsError, FileNotFoundError, ValueError) as exc:
                progress.stop()
                fail(str(exc))
            except Exception as exc:  # noqa: BLE001 - Ray's start, a lost actor, an internal error: one line
                progress.stop()
                fail_internal(exc, opts.out, opts.secret_env)
    try:
        print_result(opts, result, label, declared.category_names)
    except KeyboardInterrupt:
        fail(interrupted_message(opts.out), EXIT_INTERRUPTED)


def fail_internal(exc: BaseException, out: Path, secret_env: str | None = None) -> None:
    """Exit :data:`~aml_ray.cli_common.EXIT_RUN_FAILED` on an error of the platform's own (not the participant's
    nor the input's): one line with its cause; the traceback goes to ``out/error.log`` for a bug report. The
    Memory System Key (the value of ``secret_env``) is replaced by ``***`` in both.

    Raises:
        typer.Exit: always.
    """
    import traceback

    from aml_ray.run.pipeline import error_cause

    secret = os.environ.get(secret_env or "") or None

    def redacted(text: str) -> str:
        return text.replace(secret, "***") if secret else text

    log_path = out / "error.log"
    try:
        log_path.write_text(redacted("".join(traceback.format_exception(exc))))
    except OSError:
        log_path = None
    cause = redacted(" ".join(error_cause(exc).split()))[:500]
    fail(f"run failed: {cause}" + (f" (traceback: {log_path})" if log_path else ""), EXIT_RUN_FAILED)


def interrupted_message(out: Path) -> str:
    """What ``aml-ray run`` says when Ctrl-C stopped it, from run.json's status in ``out``.

    ``interrupted`` (:func:`aml_ray.run.evaluation.mark_interrupted`): the evidence so far and the
    ``--resume`` command. A Ctrl-C that came once the run had ended (run.json already ``completed``,
    ``partial`` or ``failed``) stopped only the printing: the results are there, and a resume would be refused.
    """
    from aml_ray.run.evidence import RunDir

    try:
        status = json.loads(RunDir(out).run_json.read_text()).get("status")
    except (OSError, ValueError):
        status = None
    if status in (None, "interrupted", "running"):
        return (f"interrupted: the evidence so far and run.json (status=interrupted) are in {out}; "
                f"continue with: aml-ray run --resume {out}")
    return f"interrupted after the run had ended: run.json (status={status}) and its results are in {out}"


def print_result(opts: RunOptions, result, label: str, category_names: dict[str, str]) -> None:
    """The run's tables (scores or retrieval, each Streaming checkpoint's, evidence recall) and its summary.

    Raises:
        typer.Exit: code 1 when the run ended partial (the table covers fewer Adds or questions).
    """
    info = result.run_info
    ds = info["dataset"]
    title = f"{opts.dataset}: {label} (top_k={opts.top_k}, run {opts.run_id})"

    def table(rows, title: str):
        return (render_retrieval_table(rows, title=title, category_names=category_names) if opts.retrieval_only
                else render_table(rows, offline=info["offline_models"], title=title, category_names=category_names))

    console.print(table(result.table, title + (", every checkpoint pooled" if info.get("by_checkpoint") else "")))
    for checkpoint in info.get("by_checkpoint", []):  # Streaming: each checkpoint's own table (the one above pools them)
        import polars as pl

        when = f"after {checkpoint['fraction']:.0%} of each sample's sessions"
        console.print(table(pl.DataFrame(checkpoint["table"]), f"{title}, {when}"))
    if any(r["n"] for r in info["evidence_recall"]["table"]):
        console.print(render_recall_table(info["evidence_recall"]["table"], category_names=category_names))
    console.print(f"samples {ds['samples']}, chunks {ds['chunks']}, messages {ds['messages']}, questions "
                  f"{ds['questions']} ({ds['scorable_questions']} scorable, {ds['excluded_questions']} excluded"
                  f" and reported, never scored)")
    a, s = info["adds"], info["search"]
    # time at the participant includes queueing there behind the run's own other requests: the unloaded latency
    # beside it (ParticipantClient.concurrency), so 70 ms at two in flight reads as 35 ms of service
    limit = info.get("participant_concurrency") or {}
    unloaded = limit.get("unloaded_ms") or {}

    def beside(kind: str) -> str:
        if kind not in unloaded or not limit.get("max"):
            return ""
        return f"; {ms(unloaded[kind])} unloaded, at most {limit['max']} in flight"

    console.print(f"Add latency p50 {ms(a['latency_ms']['p50'])} / p95 {ms(a['latency_ms']['p95'])} "
                  f"({a['ok']} ok, {a['failed']} failed, {a['retried']} retried{beside('add')}); Search latency p50 "
                  f"{ms(s['latency_ms']['p50'])} / p95 {ms(s['latency_ms']['p95'])} ({s['failed']} failed"
                  f"{beside('search')}); wall {info['wall_s']:.1f} s")
    console.print(f"evidence: {opts.out}/evidence ({info['evidence']['add_rows']} Add rows, "
                  f"{info['evidence']['question_rows']} question rows); run.json and results.json in {opts.out}")
    if (integrity := info.get("integrity") or {}).get("flagged_questions"):
        console.print(f"[yellow]integrity:[/] {integrity['flagged_memories']} memories and "
                      f"{integrity['flagged_answers']} answers of {integrity['flagged_questions']} questions address "
                      "the model (rules "
                      f"{', '.join(sorted(integrity['by_rule']))}): flagged in {opts.out}/evidence/injections.parquet, "
                      "passed to Answer unchanged")
    if (cap := info.get("answer_cap") or {}).get("capped"):
        console.print(f"[yellow]answer cap:[/] {cap['capped']} of {cap['answers']} answers ({cap['share']:.1%}) were "
                      f"over {cap['cap_tokens']} tokens and cut to it before judging (whole answers: answer_full "
                      f"in {opts.out}/evidence/questions)")
    if info["status"] != "completed":
        err.print(f"[bold yellow]run {info['status']}:[/] ", end="")
        err.print(f"{info.get('error')} (run.json status={info['status']}; the evidence names each failed request)",
                  markup=False)
        raise typer.Exit(EXIT_RUN_FAILED)
