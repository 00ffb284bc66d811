"""One evaluation, end to end: resolve and verify the dataset, run the Ray pipeline, score, record.

:func:`evaluate` is what ``aml-ray run`` calls; it writes ``run.json`` (what ran), the evidence, and
``results.json`` / ``results.parquet`` (the score table), and returns an :class:`EvaluationResult`.

Importing this module pulls in only what a run needs before its first Add (the dataset, the inputs,
run.json, the pre-flight and the head start: pyarrow, no polars): on 2 cores, polars and the pipeline were
0.2 s of CPU between the pre-flight's probe and the run's first Add. The pipeline
is imported once Ray has started (without polars it takes 0.015 s); polars and the scoring are imported where
they are used, warmed while the pipeline runs (:func:`warm_tail`). Not beside the Ray start: on 2 cores a
thread importing them there made ``ray_start_s`` 0.15-0.3 s longer (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import ModelEndpoint, cache_dir
from aml_ray.datasets.base import load_notes
from aml_ray.datasets.registry import get_dataset
from aml_ray.datasets.validate import require_scorable
from aml_ray.run.evidence import RunDir, read_adds, read_questions, write_json_atomic, write_parquet_atomic
from aml_ray.ids import IdScheme, new_run_id
from aml_ray.run.inputs import PipelineInputs, build_inputs
from aml_ray.run.injection import integrity_summary
from aml_ray.run.memory_checks import RunningChecks, memory_checks
from aml_ray.run.options import PipelineOptions
from aml_ray.run.outcome import StageFailed, run_outcome
from aml_ray.run.progress import NeverLower
from aml_ray.run.preflight import PreflightFailed, StartedPreflight, start_preflight
from aml_ray.run.provenance import code_provenance
from aml_ray.run.reopen import plan_reopen
from aml_ray.prompts import load_prompt
from aml_ray.run.head_start import HeadStart
from aml_ray import command_clock, interrupts
from aml_ray.run.ray_runtime import init_ray, shutdown_ray, started_here
from aml_ray.warming import warm_in_background
from aml_ray.stages.answer import DEFAULT_CONTEXT_BUDGET
from aml_ray.suite import path_sha256, verify_loaded_bundle

if TYPE_CHECKING:  # imported where used (the module docstring)
    import polars as pl


@dataclass
class EvaluationConfig:
    """Everything one evaluation needs.

    Attributes:
        dataset: dataset name (``"locomo"``).
        participant: the participant version's spec.
        answer / judge: model endpoints (offline when they have no base_url).
        out_dir: the run directory (created; must not already hold a run).
        data_path: local dataset file; None downloads into the cache and verifies its sha256.
        allow_hash_mismatch: accept a dataset file whose sha256 differs from the pin (recorded).
        top_k: Top K for Search (formal: 100).
        limit_samples: evaluate only the first N samples (smoke-sized runs); None for all.
        run_id: the run's id (default: a fresh random one).
        run_label: a human label recorded in run.json.
        participant_label: how the participant is named in outputs (never holds a secret).
        options: pipeline throughput knobs.
        answer_prompt / judge_prompt: override the dataset's prompts (shipped name, path or URL).
        answer_prompt_sha256 / judge_prompt_sha256: pins for the overrides (required for URLs).
        context_budget_tokens: token budget of the answer context.
        answer_cap_tokens: the answer-length cap in tokens (:func:`aml_ray.stages.answer.cap_answers`); None
            takes ``suite``'s ``answer_cap_tokens`` (:func:`answer_cap`).
        judge_runs: how many times each answer is judged (mean and std reported when > 1).
        suite: the suite whose bundle for this dataset is count-checked (:func:`aml_ray.suite.verify_loaded_bundle`).
        retrieval_only: Add and Search only: no model is called, the table is
            :func:`aml_ray.scoring.retrieval.retrieval_table` (what Search returned, no accuracy).
        participant_key: the non-secret version key under which jobs of this driver running at once share
            one participant client and so the version's declared capacity (:mod:`aml_ray.actors.shared`);
            None derives it from the spec's non-secret fields. Never put a secret in it: it names an actor.
        head_start: send the first Adds from this process while the pipeline's actors start
            (:mod:`aml_ray.run.head_start`), with a client of its own holding the version's
            declared limits, until the Ingest stage takes over before its first request. None (default):
            on a local cluster the run starts itself (nobody else can reach it), and on a joined cluster
            when the client registry grants it (the run's lease starts the version's shared client, which
            then holds its slots until the handover: :mod:`aml_ray.actors.shared`). True: at once on any
            cluster, without asking (the service, which admits one active job per version:
            :func:`aml_ray.store.jobs.create_job`). False: never.
    """

    dataset: str
    participant: ParticipantSpec
    answer: ModelEndpoint
    judge: ModelEndpoint
    out_dir: Path
    data_path: Path | None = None
    allow_hash_mismatch: bool = False
    top_k: int = 100
    limit_samples: int | None = None
    run_id: str = field(default_factory=new_run_id)
    run_label: str | None = None
    participant_label: str = "participant"
    options: PipelineOptions = field(default_factory=PipelineOptions)
    answer_prompt: str | None = None
    judge_prompt: str | None = None
    answer_prompt_sha256: str | None = None
    judge_prompt_sha256: str | None = None
    context_budget_tokens: int = DEFAULT_CONTEXT_BUDGET
    answer_cap_tokens: int | None = None
    judge_runs: int = 1
    stream_checkpoints: list[float] | None = None
    resume: bool = False
    suite: str = "textual"
    retrieval_only: bool = False
    participant_key: str | None = None
    head_start: bool | None = None

    @property
    def job_key(self) -> str:
        """The key this run's requests carry to the shared clients: ``<run id>/<dataset>`` (never a secret).

        The model clients grant their in-flight slots round-robin across keys (:mod:`aml_ray.actors.fair`).
        A suite's bundles share one run id and run at once, so the dataset is part of the key: each bundle
        takes the slots in its turn. With the run id alone the bundles would be one job, served first come,
        first served: the bundle whose rows come first holds the models while the others' wait, and BEAM's
        judge-heavy rows reach the judge model late (docs/benchmarks.md). A resumed run keeps its key.
        """
        return f"{self.run_id}/{self.dataset}"


@dataclass
class EvaluationResult:
    """What an evaluation produced.

    Attributes:
        run_dir: the run directory.
        table: the aggregated score table (see :func:`aml_ray.scoring.aggregate`).
        run_info: the content of run.json.
    """

    run_dir: RunDir
    table: pl.DataFrame
    run_info: dict[str, Any]

    @property
    def questions(self) -> pl.DataFrame:
        """Every question evidence row with every column, read from ``run_dir`` at each access (not kept:
        a large run's memories, answers and judge texts stay on disk until asked for)."""
        return read_questions(self.run_dir)


def retries_by_status(statuses: pl.Series) -> dict[str, int]:
    """Count retried attempts by the status that caused them (``transport`` for timeouts/connection errors).

    Args:
        statuses: a list column of retried statuses per request (0 = transport error).
    """
    flat = statuses.explode().drop_nulls()
    counts = flat.value_counts(sort=True)
    return {("transport" if int(v) == 0 else str(int(v))): int(n) for v, n in counts.iter_rows()}


def usage_summary(questions: pl.DataFrame) -> dict[str, Any]:
    """Context tokens, model token usage, cost and the repeated-judging summary for run.json.

    ``judge_runs_summary``: per judging run, accuracy over the non-excluded questions with the credit the
    score table gives (partial credit included, errors 0; :func:`aml_ray.scoring.judge_runs.run_credits`:
    run 1 is the table's accuracy, later runs are read from ``judge_verdicts``); then their mean and
    sample standard deviation (0 with one run).
    """
    import polars as pl

    from aml_ray.scoring.judge_runs import run_credits

    scored = questions.filter(~pl.col("excluded"))
    ctx = scored["context_tokens"].drop_nulls()
    costs = scored["cost_usd"].drop_nulls()
    columns = [c for c in ("excluded", "status", "score", "verdict", "judge_verdicts") if c in scored.columns]
    per_run = run_credits(scored.select(columns).to_dicts())
    mean = sum(per_run) / len(per_run) if per_run else None
    std = (sum((a - mean) ** 2 for a in per_run) / (len(per_run) - 1)) ** 0.5 if len(per_run) > 1 else 0.0
    return {
        "context_tokens": {"mean": float(ctx.mean()) if ctx.len() else None,
                           "p95": float(ctx.quantile(0.95, "linear")) if ctx.len() else None,
                           "max": int(ctx.max()) if ctx.len() else None,
                           "questions_cut": int((scored["memories_cut"].fill_null(0) > 0).sum())},
        "tokens": {"prompt": int(scored["prompt_tokens"].fill_null(0).sum()),
                   "completion": int(scored["completion_tokens"].fill_null(0).sum()),
                   "answers_from_cache": int(scored["answer_cached"].fill_null(False).sum())},
        "cost_usd_estimate": float(costs.sum()) if costs.len() else None,
        "judge_runs_summary": {"accuracy_per_run": per_run, "mean": mean, "std": std if per_run else None},
    }


#: run.json entries that must be equal for a run to be resumed (a resumed run is the same run).
RESUME_INVARIANTS = (("dataset", "sha256"), ("dataset", "samples"), ("dataset", "chunks"), ("dataset", "questions"),
                     ("top_k",), ("prompts",), ("models", "answer", "model"), ("models", "judge", "model"),
                     ("participant", "label"), ("participant", "auth"), ("context_budget_tokens",), ("answer_cap_tokens",),
                     ("judge_runs",), ("stream_checkpoints",), ("limit_samples",), ("retrieval_only",))


def check_resumable(previous: dict[str, Any], current: dict[str, Any]) -> None:
    """Refuse to resume when what the run measures would change.

    Raises:
        ValueError: naming every differing entry of :data:`RESUME_INVARIANTS` with both values.
    """

    def get(d: dict[str, Any], path: tuple[str, ...]) -> Any:
        for k in path:
            d = d.get(k) if isinstance(d, dict) else None
        return d

    diffs = [f"{'.'.join(p)}: was {get(previous, p)!r}, now {get(current, p)!r}" for p in RESUME_INVARIANTS
             if get(previous, p) != get(current, p)]
    if not previous.get("participant", {}).get("label", "").startswith("reference:"):
        diffs += [f"participant.{k}: was {previous['participant'].get(k)!r}, now {current['participant'].get(k)!r}"
                  for k in ("add_url", "search_url") if previous["participant"].get(k) != current["participant"].get(k)]
    if diffs:
        raise ValueError("cannot resume: the run would change; " + "; ".join(diffs))


#: What run.json's ``wall_s`` covers.
WALL_COVERS = ("the whole command: from its start (aml_ray.command_clock: imports, dataset load and check, "
               "inputs, pre-flight, Ray start, actor pools, Adds and Searches, Answer and Judge, scoring) "
               "to the final run.json; timings splits it")


def answer_cap(cfg: EvaluationConfig) -> int | None:
    """The run's answer-length cap in tokens: ``cfg.answer_cap_tokens``, else its suite's
    ``answer_cap_tokens`` (None: the suite sets no cap, or ``cfg.suite`` is no suite file)."""
    if cfg.answer_cap_tokens is not None:
        return cfg.answer_cap_tokens
    from aml_ray.suite import load_suite

    try:
        return load_suite(cfg.suite).answer_cap_tokens
    except FileNotFoundError:
        return None


def answer_cap_summary(questions: pl.DataFrame, cap_tokens: int | None) -> dict[str, Any]:
    """run.json's and results.json's ``answer_cap``: how many answers of the non-excluded questions were over
    the cap and cut before judging (:func:`aml_ray.stages.answer.cap_answers`).

    Examples:
        >>> import polars as pl
        >>> answer_cap_summary(pl.DataFrame({"excluded": [False, False, False, True],
        ...                                  "answer_capped": [True, False, None, True]}), 64)
        {'cap_tokens': 64, 'answers': 2, 'capped': 1, 'share': 0.5}

    Returns:
        ``{"cap_tokens", "answers" (answers counted: those with an answer), "capped", "share" (capped /
        answers; None without an answer)}``.
    """
    import polars as pl

    flags = questions.filter(~pl.col("excluded"))["answer_capped"].drop_nulls()
    capped = int(flags.sum()) if flags.len() else 0
    return {"cap_tokens": cap_tokens, "answers": flags.len(), "capped": capped,
            "share": capped / flags.len() if flags.len() else None}


def _media_limits(track: str, cfg: EvaluationConfig):
    """The media limits of a multimodal dataset's run (None for Textual and Coding).

    Taken from ``cfg.suite`` when that suite is a multimodal one, else from the shipped ``multimodal``
    suite; defaults of :class:`aml_ray.media.MediaLimits` when the suite sets none.

    Raises:
        ValueError: the track is multimodal and the online answer model is not vision-capable.
    """
    if track != "multimodal":
        return None
    from aml_ray.media import MediaLimits
    from aml_ray.stages.answer import require_vision
    from aml_ray.suite import load_suite

    require_vision(cfg.answer, track)
    suite = load_suite(cfg.suite)
    if suite.track != "multimodal":
        suite = load_suite("multimodal")
    return suite.media or MediaLimits()


def evaluate(cfg: EvaluationConfig, *, on_progress: Callable[[str, dict[str, int]], None] | None = None,
             num_cpus: int | None = None, preflight: StartedPreflight | None = None,
             own_cluster: bool = False) -> EvaluationResult:
    """Run one evaluation, or resume one.

    Resume (``cfg.resume``): the run keeps its run_id, so every request_id and body is the same; questions
    already in the evidence are not built again, each sample's Add journal skips finished Adds
    (:class:`aml_ray.stages.ingest.IngestStage`), nothing is deleted, and the final tables are computed
    from all the evidence, old and new.

    Args:
        cfg: the evaluation's configuration.
        on_progress: called with ``("totals", {...})`` once, then ``("done", {stage: n})`` as work finishes;
            a stage's done count is never lower than one handed on before (:class:`aml_ray.run.progress.NeverLower`).
        num_cpus: CPUs for a local Ray cluster started here (ignored when Ray is already running).
        preflight: the run's pre-flight, already started by the caller
            (:func:`aml_ray.run.preflight.start_preflight` with ``cfg.run_id`` and the dataset's name: the
            command line starts it before its heavy imports); None: started here, beside the Ray start.
        own_cluster: the caller started the local cluster Ray runs on, for this process alone (a suite's
            driver, :func:`aml_ray.run.suite_run.evaluate_suite`): the run's client actors are its own, as
            when this call starts the cluster, rather than leased through the cluster's shared registry.

    Returns:
        The :class:`EvaluationResult`.

    Raises:
        FileExistsError: ``out_dir`` already holds a run.json and ``resume`` is off (never overwritten).
        FileNotFoundError: ``resume`` is on and ``out_dir`` holds no run.json.
        ValueError: resuming a completed run, or one whose dataset, prompts, models, Top K or
            participant differ (:func:`check_resumable`); a ``preflight`` started for another run id or
            dataset.
        aml_ray.run.evidence.EvidenceError: resuming from a damaged evidence file (never a silent restart).
        aml_ray.datasets.fetch.DatasetError: the dataset file is missing, unreachable or has another hash.
        aml_ray.datasets.validate.DatasetFormatError: the samples the run would take hold no scorable question
            (:func:`aml_ray.datasets.validate.require_scorable`); nothing is written.
        StageFailed: the run failed (:mod:`aml_ray.run.outcome`): the pre-flight failed, a contract error, a
            non-retryable participant status or the failure budget stopped it, or its evidence shows a
            memory of another user_id or no scored question; run.json is written first with
            ``status="failed"``, the error summary and the structured ``failure``.

    A run that ends without failing has ``run_info["status"]`` ``completed`` or ``partial`` (some Adds
    failed or some questions have no result, within the failure budget), derived from the evidence by
    :func:`aml_ray.run.outcome.run_outcome`. A run stopped by Ctrl-C (``KeyboardInterrupt``, re-raised) has
    ``interrupted`` in run.json (:func:`mark_interrupted`) and can be resumed. Any other error once run.json
    says ``running`` (Ray's start timing out, a lost actor, an internal error) is re-raised after run.json
    says ``failed`` with its one-line cause (:func:`mark_failed`): no run is left ``running`` by its process.
    """
    command_t0 = command_clock.started_at()  # wall_s covers the whole command (WALL_COVERS)
    if on_progress is not None:
        on_progress = NeverLower(on_progress)
    try:
        return _evaluate(cfg, on_progress=on_progress, num_cpus=num_cpus, command_t0=command_t0, preflight=preflight,
                         own_cluster=own_cluster)
    except KeyboardInterrupt:
        mark_interrupted(RunDir(cfg.out_dir), cfg.run_id, wall_s=round(time.time() - command_t0, 3))
        raise
    except Exception as exc:  # StageFailed wrote its own run.json (status failed): left as it is
        from aml_ray.run.pipeline import error_cause

        mark_failed(RunDir(cfg.out_dir), cfg.run_id, cause=error_cause(exc), wall_s=round(time.time() - command_t0, 3))
        raise


def _evaluate(cfg: EvaluationConfig, *, on_progress: Callable[[str, dict[str, int]], None] | None,
              num_cpus: int | None, command_t0: float, preflight: StartedPreflight | None,
              own_cluster: bool = False) -> EvaluationResult:
    """:func:`evaluate`'s work (``command_t0``: the command's start, :func:`aml_ray.command_clock.started_at`).

    Its start, in order: the run's preparation in this thread (:func:`_prepare`: dataset, inputs, prompts,
    run.json), while the pre-flight's round trips go on in theirs; then Ray, started or joined in this
    thread; then the pre-flight's result; then the head start, which sends the first Adds while the
    pipeline's actors start (on a joined cluster, once the client registry grants it). No thread of this
    process sends or reads samples while ``ray.init`` runs, so a Ctrl-C there is an ordinary
    ``KeyboardInterrupt``.
    """
    timings: dict[str, float] = {}
    t_prepare = time.perf_counter()
    spec, run_dir, media, samples, inputs, answer_prompt, judge_prompt, info, probed = _prepare(cfg, started=preflight)
    timings["prepare_s"] = round(time.perf_counter() - t_prepare, 3)
    started_ray = _start_ray(num_cpus=num_cpus, timings=timings, command_t0=command_t0)
    try:
        info["preflight"] = _preflight_passed(probed, info, run_dir, command_t0=command_t0)
    except BaseException:
        if started_ray:
            shutdown_ray()
        raise
    own_cluster = (started_ray or own_cluster) and started_here()  # nobody else can reach it: nothing to share
    info["ray_cluster"] = _cluster_of_run(own_cluster)
    # the first Adds go from here while the pipeline's actors start (aml_ray.run.head_start); on a joined
    # cluster, once the registry grants it (run_pipeline releases it)
    head = HeadStart(samples_at_once=cfg.options.ingest_parallelism,
                     on_adds=(lambda n: on_progress("done", {"add": n})) if on_progress else None) \
        if cfg.head_start is not False else None
    if head is not None:
        lone = probed.result().lone_latencies()
        if own_cluster or cfg.head_start:
            head.start(_with_media(cfg.participant, media), inputs, run_dir, lone_latencies=lone)
        else:
            head.prepare(_with_media(cfg.participant, media), inputs, run_dir, lone_latencies=lone)
    if on_progress is not None:
        on_progress("totals", _progress_totals(cfg, inputs))
    from aml_ray.run.pipeline import run_pipeline  # after the Ray start, not beside it (the module docstring)

    def warm_after_head_start() -> None:
        # after the head start's thread ends: its Adds' turnarounds wait for the interpreter while the imports
        # hold it (46-63 ms idle at a one-at-a-time participant, 3 runs, against none without them)
        if head is not None:
            head.wait()
        warm_tail()

    warming = warm_in_background(warm_after_head_start, "aml-ray-warm-tail")
    # the memories' checks go along with the pipeline (aml_ray.run.memory_checks); a resumed run's evidence also
    # holds earlier attempts' rows: its checks read the files after the pipeline
    running = None if "resumed_at" in info else RunningChecks(samples, inputs)
    t0 = time.perf_counter()
    pipeline_report: dict[str, Any] = {}
    try:
        questions = run_pipeline(
            inputs, run_dir=run_dir, answer=cfg.answer, judge=cfg.judge,
            participant=_with_media(cfg.participant, media),
            media_root=str(run_dir.media) if media else None,
            image_tokens=media.image_tokens if media else "openai_tiles",
            answer_prompt=answer_prompt, judge_prompt=judge_prompt, f1_rule=spec.f1_rule,
            top_k=cfg.top_k, options=cfg.options, context_budget_tokens=cfg.context_budget_tokens,
            answer_cap_tokens=info["answer_cap_tokens"], judge_runs=cfg.judge_runs, scorer=spec.scorer, job_key=cfg.job_key,
            participant_key=cfg.participant_key,
            retrieval_only=cfg.retrieval_only, report=pipeline_report,
            private_cluster=own_cluster,
            head_start=head, on_rows=running.feed if running is not None else None,
            on_progress=(lambda snap: on_progress("done", snap)) if on_progress else None)
    except StageFailed as exc:
        timings["pipeline_s"] = round(time.perf_counter() - t0, 3)
        info.update(status="failed", error=exc.summary, failure=exc.failure, wall_s=round(time.time() - command_t0, 3),
                    wall_covers=WALL_COVERS, timings=timings, **pipeline_report,
                    **({"head_start": head.describe()} if head is not None else {}),
                    finished_at=datetime.now(timezone.utc).isoformat())
        write_json_atomic(info, run_dir.run_json)
        raise
    finally:
        if head is not None:
            head.stop()
        if running is not None and sys.exc_info()[0] is not None:
            running.close()
        timings["pipeline_s"] = round(time.perf_counter() - t0, 3)
        stopping = None
        if started_ray and sys.exc_info()[0] is not None:  # the run stopped: Ray is down before the error goes up
            if sys.exc_info()[0] is KeyboardInterrupt:  # said first: nothing after Ray's shutdown can lose it
                mark_interrupted(run_dir, cfg.run_id, wall_s=round(time.time() - command_t0, 3))
            _shutdown_timed(timings)
        elif started_ray:
            stopping = _shutdown_beside(timings)
    warming.join()  # its imports are the tail's first-use ones: never slower than making them again here
    try:
        return _score(cfg, questions, timings=timings, pipeline_report=pipeline_report, head=head, spec=spec,
                      run_dir=run_dir, samples=samples, inputs=inputs, info=info, command_t0=command_t0,
                      stopping=stopping, running=running)
    finally:
        if stopping is not None:
            stopping.result()


def warm_tail() -> None:
    """Make the run's tail's first-use imports now, while the pipeline runs (a thread of the driver, which
    mostly waits then): the bootstrap's ``numpy.random`` and ``numpy.ma`` (numpy imports them on the
    first generator and the first ``np.quantile``), the evidence recall's module, and ``ray.dag``, which
    Ray 2.60's ``ray.shutdown()`` imports to stop compiled graphs, in the thread beside the scoring. They took
    about 0.04 s of the tail's CPU (cProfile of ``_score``, docs/benchmarks.md). And ``pyarrow.dataset``,
    which ``pyarrow.parquet.read_table`` imports at its first call: the pipeline's end reading the question
    evidence back took 0.05 s instead of 0.01 s. Run by :func:`~aml_ray.warming.warm_in_background`:
    an error is left for the tail, which imports the same. Also polars, which neither this module nor the
    pipeline imports before the run's first Add (the module docstring)."""
    import pyarrow.dataset  # noqa: F401

    from aml_ray.scoring.bootstrap import mean_ci
    import aml_ray.scoring.evidence_recall  # noqa: F401

    mean_ci([0.0, 1.0], resamples=2)
    if "ray" in sys.modules:
        import ray.dag.compiled_dag_node  # noqa: F401
    import polars  # noqa: F401 - last: the largest, and the tail's first read needs the others too


def _shutdown_beside(timings: dict[str, float]) -> Future:
    """Shut down the Ray this run started, in a thread of its own (sets ``timings["ray_shutdown_s"]``).

    The scoring after the pipeline reads the evidence files and needs no Ray, so the shutdown (0.1-0.4 s
    of waiting for Ray's processes to stop, docs/benchmarks.md) goes beside it instead of before it
    The future's ``result()`` waits for it and raises what
    :func:`~aml_ray.run.ray_runtime.shutdown_ray` raised.
    """
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aml-ray-shutdown")
    try:
        return pool.submit(_shutdown_timed, timings)
    finally:
        pool.shutdown(wait=False)


def _shutdown_timed(timings: dict[str, float]) -> None:
    """:func:`~aml_ray.run.ray_runtime.shutdown_ray`, its seconds in ``timings["ray_shutdown_s"]``."""
    t = time.perf_counter()
    try:
        shutdown_ray()
    finally:
        timings["ray_shutdown_s"] = round(time.perf_counter() - t, 3)


def _score(cfg: EvaluationConfig, questions: pl.DataFrame, *, timings: dict[str, float],
           pipeline_report: dict[str, Any], head: HeadStart | None, spec, run_dir: RunDir, samples,
           inputs: PipelineInputs, info: dict[str, Any], command_t0: float, stopping: Future | None,
           running: RunningChecks | None = None) -> EvaluationResult:
    """The run's tables, outcome and run.json from its evidence (:func:`evaluate` after the pipeline).

    ``stopping`` (the Ray shutdown under way, :func:`_shutdown_beside`) is waited for before run.json is
    written, so its time is in the run's ``timings``. ``running``: the memories' checks made along with the
    pipeline (:class:`~aml_ray.run.memory_checks.RunningChecks`); None: made here from the evidence files.
    """
    import polars as pl

    from aml_ray.scoring.aggregate import aggregate, latency_summary
    from aml_ray.scoring.retrieval import retrieval_table

    # a Ctrl-C held here (polars drops one that lands in its callbacks and fails half way) is raised at the
    # block's end, before run.json says the run ended: it is `interrupted` and can be resumed
    with interrupts.deferred():
        if head is not None:
            pipeline_report["head_start"] = head.describe()
        t_scoring = time.perf_counter()
        # `questions` holds SUMMARY_COLUMNS only (run_pipeline): everything below reads no other column
        adds = read_adds(run_dir)
        with_dataset = questions.with_columns(pl.lit(spec.name).alias("dataset"))
        table = retrieval_table(with_dataset) if cfg.retrieval_only else aggregate(with_dataset)
        by_checkpoint = checkpoint_tables(with_dataset, run_dir, samples, cfg.stream_checkpoints,
                                          retrieval_table if cfg.retrieval_only else aggregate)
        write_parquet_atomic(table.to_arrow(), run_dir.results_parquet)
        searched = questions.filter(pl.col("search_status") == "ok")
        search_lat = searched["search_latency_ms"]  # time at the participant: the table's p50/p95
        leaks, recall, flags = (running.finish(run_dir) if running is not None
                                else memory_checks(samples, inputs, run_dir))
        outcome = run_outcome(adds, questions, expected_adds=inputs.n_chunks, scorable=inputs.n_scorable,
                              isolation=leaks)
        info.update(
            status=outcome.status, outcome=outcome.describe(), finished_at=datetime.now(timezone.utc).isoformat(),
            isolation={"leaking_questions": len(leaks), "examples": leaks[:20]},
            evidence_recall={"rule": "fuzzy (headline) and exact: aml_ray.scoring.evidence_recall", "table": recall},
            integrity=integrity_summary(flags),
            **({} if cfg.retrieval_only else {"answer_cap": answer_cap_summary(questions, info["answer_cap_tokens"])}),
            **({"by_checkpoint": by_checkpoint} if by_checkpoint else {}),
            **({"error": outcome.summary} if outcome.status != "completed" else {}),
            evidence={"add_rows": adds.height, "question_rows": questions.height},
            adds={"ok": int((adds["status"] == "ok").sum()), "failed": int((adds["status"] != "ok").sum()),
                  "retried": int((adds["attempts"] > 1).sum()),
                  "retries_by_status": retries_by_status(adds["retried_statuses"]),
                  "latency_ms": latency_summary(adds.filter(pl.col("status") == "ok")["latency_ms"]),
                  "queue_ms": latency_summary(adds.filter(pl.col("status") == "ok")["queue_ms"])},
            search={"latency_ms": latency_summary(search_lat), "queue_ms": latency_summary(searched["search_queue_ms"]),
                    "latency_is": "time at the participant (sent to reply), queueing there behind aml-ray's other requests "
                                  "in flight included (participant_concurrency.unloaded_ms: without it); queue_ms: "
                                  "waiting for an in-flight slot",
                    "retried": int((questions["search_attempts"].fill_null(0) > 1).sum()),
                    "failed": int((questions["search_status"] == "error").sum()),
                    "retries_by_status": retries_by_status(questions["search_retried_statuses"])},
            **usage_summary(questions),
        )
        timings["scoring_s"] = round(time.perf_counter() - t_scoring, 3)
        if stopping is not None:
            stopping.result()
    info.update(wall_s=round(time.time() - command_t0, 3), wall_covers=WALL_COVERS, timings=timings,
                **pipeline_report)
    write_json_atomic({"run_id": cfg.run_id, "status": outcome.status, "offline_models": info["offline_models"],
                       "models": info["models"], "retrieval_only": cfg.retrieval_only,
                       "table": table.to_dicts(), "evidence_recall": recall, "judge_runs": info["judge_runs_summary"],
                       "integrity": {k: v for k, v in info["integrity"].items() if k != "examples"},
                       **({"answer_cap": info["answer_cap"]} if "answer_cap" in info else {}),
                       **({"by_checkpoint": by_checkpoint, "table_pools_checkpoints": True} if by_checkpoint else {})},
                      run_dir.results_json)
    write_json_atomic(info, run_dir.run_json)
    shutil.rmtree(inputs.folder, ignore_errors=True)  # derived from the dataset and run id; not evidence
    if outcome.status == "failed":  # the evidence and tables stay for audit; the run measured nothing to report
        raise StageFailed(outcome.summary or "failed", failure={"kind": "isolation" if leaks else "outcome",
                                                                 "summary": outcome.summary})
    return EvaluationResult(run_dir=run_dir, table=table, run_info=info)


#: run.json's ``error`` for a run stopped by Ctrl-C (:func:`mark_interrupted`).
INTERRUPTED = ("interrupted (Ctrl-C) before the end: the evidence so far is kept; continue it with "
               "'aml-ray run --resume {out}'")


def mark_interrupted(run_dir: RunDir, run_id: str, *, wall_s: float) -> bool:
    """Record in ``run_dir``'s run.json that its run was interrupted (Ctrl-C), if it was still ``running``.

    Status ``interrupted`` is neither a result nor a failure of the participant: the run can be resumed
    (:func:`check_resumable` refuses only a completed one), and the evidence already written stays.

    Args:
        run_dir: the run's directory.
        run_id: the interrupted run's id (a run.json of another run is never touched).
        wall_s: seconds from the process start to the interruption.

    Returns:
        True when run.json was rewritten; False when there is none yet, or it is another run's, or its
        status is already final (the interruption came after the last run.json was written).
    """
    return _mark_ended(run_dir, run_id, status="interrupted", error=INTERRUPTED.format(out=run_dir.root),
                       wall_s=wall_s)


def this_process() -> dict[str, Any]:
    """``{"pid", "host", "started"}`` of this process (``started``: its start in clock ticks since boot, from
    /proc, so a later process that reuses the pid is told apart; None where /proc is absent). run.json holds it
    while the run says ``running``: :func:`process_alive` tells a live run from one whose process is gone."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": _proc_start(os.getpid())}


def process_alive(process: dict[str, Any] | None) -> bool:
    """Whether the process :func:`this_process` described still runs (False for another host's: unknown there,
    so never refused; False for None)."""
    if not process or process.get("host") != socket.gethostname():
        return False
    started = _proc_start(int(process["pid"]))
    return started is not None and started == process.get("started")


def _proc_start(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (the process's start, clock ticks after boot); None when it is not running."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def mark_failed(run_dir: RunDir, run_id: str, *, cause: str, wall_s: float) -> bool:
    """Record in ``run_dir``'s run.json that its run failed on an error of its own (not the participant's), if it
    was still ``running``: ``status`` ``failed``, ``error`` the cause in one line, ``failure.kind`` ``internal``.

    The evidence already written stays, and the run can be resumed (:func:`check_resumable` refuses only a
    completed one). Arguments and return value as :func:`mark_interrupted`.
    """
    cause = " ".join(cause.split())
    return _mark_ended(run_dir, run_id, status="failed", error=f"internal error: {cause}",
                       wall_s=wall_s, failure={"kind": "internal", "summary": cause})


def _mark_ended(run_dir: RunDir, run_id: str, *, status: str, error: str, wall_s: float, **more: Any) -> bool:
    """Rewrite run.json with a final ``status`` when it is this run's, says ``running``, and this process wrote
    that or the process that did is gone (a refused resume of a run another process runs leaves its run.json
    alone; a suite's driver marks the runs of the bundle runners it killed: :mod:`aml_ray.run.bundle_runner`)."""
    try:
        info = json.loads(run_dir.run_json.read_text())
    except (OSError, ValueError):
        return False
    if info.get("run_id") != run_id or info.get("status") != "running":
        return False
    if info.get("process") not in (None, this_process()) and process_alive(info["process"]):
        return False
    info.update(status=status, error=error, wall_s=wall_s, wall_covers=WALL_COVERS,
                finished_at=datetime.now(timezone.utc).isoformat(), **more)
    write_json_atomic(info, run_dir.run_json)
    return True


def _with_media(participant: ParticipantSpec, media) -> ParticipantSpec:
    """The participant's spec with the run's media limits (a multimodal run), else as it is."""
    return participant.model_copy(update={"media": media}) if media else participant


def _prepare(cfg: EvaluationConfig, *, started: StartedPreflight | None = None):
    """What a run needs before its pipeline: the dataset checked and loaded, inputs, prompts, run.json, and
    the pre-flight started (``started``: already under way, from the command line).

    Raises what :func:`evaluate` documents for these steps; waits for nothing: the pre-flight's result is
    :func:`_preflight_passed`'s.

    Returns:
        ``(spec, run_dir, media, samples, inputs, answer_prompt, judge_prompt, info, preflight)``, ``info``
        as written to run.json (``status`` ``running``), ``preflight`` the
        :class:`~aml_ray.run.preflight.StartedPreflight`.
    """
    spec = get_dataset(cfg.dataset)
    run_dir = RunDir(cfg.out_dir)
    media = _media_limits(spec.track, cfg)  # refuses a text-only answer model for the multimodal track
    previous: dict[str, Any] | None = None
    if run_dir.run_json.exists():
        if not cfg.resume:
            raise FileExistsError(f"{run_dir.run_json} exists: choose a new --out directory (runs are never "
                                  "overwritten) or continue it with --resume")
        previous = json.loads(run_dir.run_json.read_text())
        if previous.get("status") == "completed":
            raise ValueError(f"run {previous['run_id']} in {run_dir.root} is already completed; nothing to resume")
        if previous.get("status") == "running" and previous.get("process") != this_process() \
                and process_alive(previous.get("process")):
            raise ValueError(f"run {previous['run_id']} in {run_dir.root} is still running (process "
                             f"{previous['process']['pid']} on {previous['process']['host']}); resume it once it ended")
        cfg.run_id = previous["run_id"]
    elif cfg.resume:
        raise FileNotFoundError(f"--resume {run_dir.root}: no run.json there; pass a run directory made by "
                                "'aml-ray run'")
    data_file = spec.resolve(cfg.data_path, cache_dir(), cfg.allow_hash_mismatch)
    samples = spec.load(data_file)
    # the suite's count check (aml_ray.suite): refuses a pinned or unpinned bundle whose counts differ
    bundle_info = verify_loaded_bundle(spec.name, cfg.data_path or data_file, samples,
                                       allow_hash_mismatch=cfg.allow_hash_mismatch, suite=cfg.suite)
    # nothing to score would end 'completed' having measured nothing: refused before run.json (service jobs,
    # suites and library calls; the command line checks it before its run directory exists)
    require_scorable(samples, cfg.data_path or data_file, limit_samples=cfg.limit_samples)
    if cfg.limit_samples is not None:
        if cfg.limit_samples < 1:
            raise ValueError(f"limit_samples must be >= 1, got {cfg.limit_samples}")
        samples = samples[: cfg.limit_samples]
    # the pre-flight's round trips go beside the inputs, prompts, run.json and the Ray start (its result is
    # awaited after them, before run.json says anything of it): the first Add comes that much sooner.
    # The command line starts it earlier still, before its heavy imports (``started``).
    if started is None:
        started = start_preflight(cfg.participant, run_id=cfg.run_id, dataset=spec.name, top_k=cfg.top_k)
    elif (started.run_id, started.dataset) != (cfg.run_id, spec.name):
        raise ValueError(f"preflight: started for run {started.run_id} ({started.dataset}), not for this run "
                         f"{cfg.run_id} ({spec.name}): start it with the run's own run_id and dataset")
    done: set[str] = set()
    reopened = None
    if previous is not None:  # evidence already written (a damaged file raises EvidenceError: no restart)
        # what gave up is done again (aml_ray.run.reopen): Adds, their samples' questions, Searches
        reopened = plan_reopen(run_dir)
        done = reopened.done_questions
    # one sample at a time into <run>/inputs/ (aml_ray.run.inputs): the driver keeps counts, not rows
    inputs = build_inputs(samples, IdScheme(cfg.run_id, spec.name), out_dir=run_dir.inputs,
                          stream_checkpoints=cfg.stream_checkpoints, done_questions=done,
                          media_dir=run_dir.media if media else None)
    answer_prompt = load_prompt(cfg.answer_prompt or spec.answer_prompt, cfg.answer_prompt_sha256)
    judge_prompt = load_prompt(cfg.judge_prompt or spec.judge_prompt, cfg.judge_prompt_sha256)
    prompts = {role: {"name": p.name, "sha256": p.sha256, "source": p.path}
               for role, p in (("answer", answer_prompt), ("judge", judge_prompt))}
    info: dict[str, Any] = {
        "run_id": cfg.run_id, "run_label": cfg.run_label, "status": "running",
        "started_at": datetime.now(timezone.utc).isoformat(), "process": this_process(),
        "dataset": {"name": spec.name, "track": spec.track, "file": str(data_file),
                    "sha256": path_sha256(data_file), "hash_mismatch_allowed": cfg.allow_hash_mismatch,
                    "samples": len(samples), "chunks": inputs.n_chunks, "messages": inputs.n_messages,
                    "questions": inputs.n_questions, "scorable_questions": inputs.n_scorable,
                    "excluded_questions": inputs.n_excluded,
                    "questions_by_category": dict(sorted(inputs.by_category.items())),
                    "load_notes": load_notes(samples)},
        "participant": {"label": cfg.participant_label, **cfg.participant.describe()},
        # a retrieval-only run calls no model: none is recorded, and its table has no accuracy
        "models": {} if cfg.retrieval_only else {"answer": cfg.answer.describe(), "judge": cfg.judge.describe()},
        "offline_models": not cfg.retrieval_only and (cfg.answer.offline or cfg.judge.offline),
        "bundle": bundle_info, "prompts": prompts, "top_k": cfg.top_k, "limit_samples": cfg.limit_samples,
        "context_budget_tokens": cfg.context_budget_tokens, "answer_cap_tokens": answer_cap(cfg),
        "judge_runs": cfg.judge_runs, "stream_checkpoints": cfg.stream_checkpoints, "retrieval_only": cfg.retrieval_only,
        **({"media": media.model_dump(mode="json")} if media else {}),
        **code_provenance(),  # started by the command line beside the pre-flight (aml_ray.run.provenance)
    }
    if previous is not None:
        check_resumable(previous, info)
        info["started_at"] = previous["started_at"]
        info["resumed_at"] = [*previous.get("resumed_at", []), datetime.now(timezone.utc).isoformat()]
        info["resumed_with_done_questions"] = len(done)
        info["resumed_resends"] = [*previous.get("resumed_resends", []), reopened.describe()]
        reopened.apply(run_dir)  # the resume is accepted: the evidence changes only now
    write_json_atomic(info, run_dir.run_json)
    return spec, run_dir, media, samples, inputs, answer_prompt, judge_prompt, info, started


def _progress_totals(cfg: EvaluationConfig, inputs: PipelineInputs) -> dict[str, int]:
    """The progress display's totals per stage (a retrieval-only run answers and judges nothing)."""
    model_total = 0 if cfg.retrieval_only else inputs.n_scorable
    return {"add": inputs.n_chunks, "search": inputs.n_scorable, "answer": model_total, "judge": model_total}


def _start_ray(*, num_cpus: int | None, timings: dict[str, float], command_t0: float) -> bool:
    """:func:`~aml_ray.run.ray_runtime.init_ray` (the warm cluster when one is up, else a local cluster of its
    own), in the calling thread: ``ray.init`` installs signal handlers and was measured to lose its GCS connection under load when
    started from another thread (docs/benchmarks.md). Sets ``timings["before_ray_s"]`` (process start to
    the Ray start) and ``ray_start_s`` (0 when Ray was already running); returns whether it connected Ray."""
    timings["before_ray_s"] = round(time.time() - command_t0, 3)
    t_ray = time.perf_counter()
    try:
        return init_ray(num_cpus=num_cpus)
    finally:
        timings["ray_start_s"] = round(time.perf_counter() - t_ray, 3)


def _cluster_of_run(own: bool) -> dict[str, Any]:
    """run.json's ``ray_cluster``: ``{"address": the GCS address, "started_here": whether this run's process
    started it (else it joined a running one: a warm cluster, ``RAY_ADDRESS``, the service's)}``."""
    import ray

    return {"address": ray.get_runtime_context().gcs_address, "started_here": own}


def _preflight_passed(preflight: StartedPreflight, info: dict[str, Any], run_dir: RunDir, *,
                      command_t0: float) -> dict[str, Any]:
    """Wait for the pre-flight; its report for run.json when it passed.

    Raises:
        StageFailed: it failed (a dead or mis-configured endpoint fails the run in seconds, before any Add
            of the run); run.json (``info``) is written first with ``status="failed"``, the error,
            the structured failure and the pre-flight's report.
    """
    try:
        return preflight.result().describe()
    except PreflightFailed as exc:
        failure = exc.failure()
        info.update(status="failed", error=str(exc), failure=failure, preflight=exc.report.describe(),
                    wall_s=round(time.time() - command_t0, 3), wall_covers=WALL_COVERS,
                    finished_at=datetime.now(timezone.utc).isoformat())
        write_json_atomic(info, run_dir.run_json)
        raise StageFailed(str(exc), failure=failure) from None


def checkpoint_tables(questions: pl.DataFrame, run_dir: RunDir, samples, checkpoints: list[float] | None,
                      table_of: Callable[[pl.DataFrame], pl.DataFrame]) -> list[dict[str, Any]]:
    """Streaming: the score table at each checkpoint, not pooled.

    A sample of ``n`` sessions is searched at step ``max(1, ceil(f * n))`` for the fraction ``f``
    (:func:`aml_ray.run.inputs.stream_steps`), so the table of ``f`` takes each sample's rows of that step; two
    fractions that give a sample the same step share those rows.

    Args:
        questions: the run's question rows (``question_id`` and what ``table_of`` reads).
        run_dir: the run (its rows' ``sample_id`` and ``step`` are read from the evidence).
        samples: the run's samples (their session counts).
        checkpoints: the run's fractions; None or empty gives ``[]``.
        table_of: :func:`aml_ray.scoring.aggregate` or the retrieval-only table.

    Returns:
        ``[{"fraction": f, "table": [rows]}, ...]`` in increasing ``f``.
    """
    if not checkpoints:
        return []
    import math

    import polars as pl

    where = read_questions(run_dir, columns=("question_id", "sample_id", "step"))
    rows = questions.join(where, on="question_id", how="left")
    out = []
    for f in sorted(set(checkpoints)):
        wanted = pl.DataFrame({"sample_id": [s.sample_id for s in samples],
                               "step": [max(1, math.ceil(f * len(s.sessions))) for s in samples]},
                              schema={"sample_id": pl.String, "step": pl.Int32})
        at = rows.join(wanted, on=["sample_id", "step"], how="semi").drop("sample_id", "step")
        out.append({"fraction": f, "table": table_of(at).to_dicts()})
    return out
