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
from aml_ray.datasets.registry import get_dataset
from aml_ray.datasets.validate import require_scorable
from aml_ray.run.evidence import RunDir, read_adds, read_questions, write_json_atomic, write_parquet_atomic
from aml_ray.ids import IdScheme, new_run_id
from aml_ray.run.inputs import PipelineInputs, build_inputs
from aml_ray.run.memory_checks import RunningChecks, memory_checks
from aml_ray.run.options import PipelineOptions
from aml_ray.run.outcome import StageFailed, run_outcome
from aml_ray.run.preflight import PreflightFailed, StartedPreflight, start_preflight
from aml_ray.run.provenance import code_provenance
from aml_ray.prompts import load_prompt
from aml_ray.run.head_start import HeadStart
from aml_ray import interrupts
from aml_ray.run.ray_runtime import init_ray, shutdown_ray, started_here
from aml_ray.stages._common import warm_in_background
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
        judge_runs: how many times each answer is judged (mean and std reported when > 1).
        suite: the suite whose bundle for this dataset is count-checked (:func:`aml_ray.suite.verify_loaded_bundle`).
        retrieval_only: Add and Search only: no model is called, the table is
            :func:`aml_ray.scoring.retrieval.retrieval_table` (what Search returned, no accuracy).
        participant_key: the non-secret version key under which jobs of this driver running at once share
            one participant client and so the version's declared capacity (:mod:`aml_ray.actors.shared`);
            None derives it from the spec's non-secret fields. Never put a secret in it: it names an actor.
        head_start: send the first Adds from this process while the pipeline's actors start
            (:mod:`aml_ray.run.head_start`), with a client of its own holding the version's
            declared limits. Only where no other job sends to this participant version meanwhile: None
            (default) turns it on when the run starts its own local cluster (nobody else can reach it);
            the service sets True, since it admits one active job per version
            (:func:`aml_ray.store.jobs.create_job`), and the Ingest stage takes over before its first request.
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
    judge_runs: int = 1
    stream_checkpoints: list[float] | None = None
    resume: bool = False
    suite: str = "textual"
    retrieval_only: bool = False
    participant_key: str | None = None
    head_start: bool | None = None


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
                     ("participant", "label"), ("participant", "auth"), ("context_budget_tokens",),
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


#: What run.json's ``wall_s`` covers (issue 25, item 5).
WALL_COVERS = ("the whole command: from the process start (interpreter, imports, dataset load and check, "
               "inputs, pre-flight, Ray start, actor pools, Adds and Searches, Answer and Judge, scoring) "
               "to the final run.json; timings splits it")


def process_started_at() -> float:
    """This process's start as a ``time.time()`` value (Linux ``/proc``); now where it cannot be read.

    The start is in clock ticks since boot (``/proc/self/stat``, 10 ms); the boot is ``time.time()`` less
    ``/proc/uptime`` (10 ms), not ``/proc/stat``'s ``btime``, whose whole seconds put the start up to 1 s
    early (a run's ``wall_s`` above the time it really took).
    """
    try:
        ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            boot = time.time() - float(fh.read().split()[0])
        return min(boot + ticks / os.sysconf("SC_CLK_TCK"), time.time())
    except (OSError, ValueError, IndexError):
        return time.time()


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
             num_cpus: int | None = None, preflight: StartedPreflight | None = None) -> EvaluationResult:
    """Run one evaluation, or resume one.

    Resume (``cfg.resume``): the run keeps its run_id, so every request_id and body is the same; questions
    already in the evidence are not built again, each sample's Add journal skips finished Adds
    (:class:`aml_ray.stages.ingest.IngestStage`), nothing is deleted, and the final tables are computed
    from all the evidence, old and new.

    Args:
        cfg: the evaluation's configuration.
        on_progress: called with ``("totals", {...})`` once, then ``("done", {stage: n})`` as work finishes.
        num_cpus: CPUs for a local Ray cluster started here (ignored when Ray is already running).
        preflight: the run's pre-flight, already started by the caller
            (:func:`aml_ray.run.preflight.start_preflight` with ``cfg.run_id`` and the dataset's name: the
            command line starts it before its heavy imports); None: started here, beside the Ray start.

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
    ``interrupted`` in run.json (:func:`mark_interrupted`) and can be resumed.
    """
    command_t0 = process_started_at()  # wall_s covers the whole command (WALL_COVERS)
    try:
        return _evaluate(cfg, on_progress=on_progress, num_cpus=num_cpus, command_t0=command_t0, preflight=preflight)
    except KeyboardInterrupt:
        mark_interrupted(RunDir(cfg.out_dir), cfg.run_id, wall_s=round(time.time() - command_t0, 3))
        raise


def _evaluate(cfg: EvaluationConfig, *, on_progress: Callable[[str, dict[str, int]], None] | None,
              num_cpus: int | None, command_t0: float, preflight: StartedPreflight | None) -> EvaluationResult:
    """:func:`evaluate`'s work (``command_t0``: the process start, :func:`process_started_at`).

    Its start, in order: the run's preparation in this thread (:func:`_prepare`: dataset, inputs, prompts,
    run.json), while the pre-flight's round trips go on in theirs; then Ray, started or joined in this
    thread; then the pre-flight's result; then, on a cluster of its own, the head start, which sends the
    first Adds while the pipeline's actors start. No thread of this process sends or reads samples while
    ``ray.init`` runs, so a Ctrl-C there is an ordinary ``KeyboardInterrupt``.
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
    own_cluster = started_ray and started_here()  # nobody else can reach it: nothing to share
    info["ray_cluster"] = _cluster_of_run(own_cluster)
    # the first Adds go from here while the pipeline's actors start (aml_ray.run.head_start)
    head = HeadStart(samples_at_once=cfg.options.ingest_parallelism,
                     on_adds=(lambda n: on_progress("done", {"add": n})) if on_progress else None) \
        if (own_cluster if cfg.head_start is None else cfg.head_start) else None
    if head is not None:
        head.start(_with_media(cfg.participant, media), inputs, run_dir,
                   lone_latencies=probed.result().lone_latencies())
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
            judge_runs=cfg.judge_runs, scorer=spec.scorer, job_key=cfg.run_id,
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
    evidence back took 0.05 s instead of 0.01 s. Run by :func:`~aml_ray.stages._common.warm_in_background`:
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
        leaks, recall = running.finish(run_dir) if running is not None else memory_checks(samples, inputs, run_dir)
        outcome = run_outcome(adds, questions, expected_adds=inputs.n_chunks, scorable=inputs.n_scorable,
                              isolation=leaks)
        info.update(
            status=outcome.status, outcome=outcome.describe(), finished_at=datetime.now(timezone.utc).isoformat(),
            isolation={"leaking_questions": len(leaks), "examples": leaks[:20]},
            evidence_recall={"rule": "fuzzy (headline) and exact: aml_ray.scoring.evidence_recall", "table": recall},
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
    try:
        info = json.loads(run_dir.run_json.read_text())
    except (OSError, ValueError):
        return False
    if info.get("run_id") != run_id or info.get("status") != "running":
        return False
    info.update(status="interrupted", error=INTERRUPTED.format(out=run_dir.root), wall_s=wall_s,
                wall_covers=WALL_COVERS, finished_at=datetime.now(timezone.utc).isoformat())
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
    if previous is not None:  # evidence already written (a damaged file raises EvidenceError: no restart)
        import polars as pl

        finished = read_questions(run_dir, columns=("question_id", "status")).filter(pl.col("status").is_not_null())
        done = set(finished["question_id"].to_list())
        del finished
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
        "started_at": datetime.now(timezone.utc).isoformat(),
        "dataset": {"name": spec.name, "track": spec.track, "file": str(data_file),
                    "sha256": path_sha256(data_file), "hash_mismatch_allowed": cfg.allow_hash_mismatch,
                    "samples": len(samples), "chunks": inputs.n_chunks, "messages": inputs.n_messages,
                    "questions": inputs.n_questions, "scorable_questions": inputs.n_scorable,
                    "excluded_questions": inputs.n_excluded,
                    "questions_by_category": dict(sorted(inputs.by_category.items()))},
        "participant": {"label": cfg.participant_label, **cfg.participant.describe()},
        # a retrieval-only run calls no model: none is recorded, and its table has no accuracy
        "models": {} if cfg.retrieval_only else {"answer": cfg.answer.describe(), "judge": cfg.judge.describe()},
        "offline_models": not cfg.retrieval_only and (cfg.answer.offline or cfg.judge.offline),
        "bundle": bundle_info, "prompts": prompts, "top_k": cfg.top_k, "limit_samples": cfg.limit_samples,
        "context_budget_tokens": cfg.context_budget_tokens, "judge_runs": cfg.judge_runs,
        "stream_checkpoints": cfg.stream_checkpoints, "retrieval_only": cfg.retrieval_only,
        **({"media": media.model_dump(mode="json")} if media else {}),
        **code_provenance(),  # started by the command line beside the pre-flight (aml_ray.run.provenance)
    }
    if previous is not None:
        check_resumable(previous, info)
        info["started_at"] = previous["started_at"]
        info["resumed_at"] = [*previous.get("resumed_at", []), datetime.now(timezone.utc).isoformat()]
        info["resumed_with_done_questions"] = len(done)
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
            of the run, issue 24); run.json (``info``) is written first with ``status="failed"``, the error,
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
    """Streaming: the score table at each checkpoint, not pooled (issue 25).

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


@dataclass
class SuiteConfig:
    """One participant on every bundle of a suite that is present under the datasets directory.

    Attributes:
        participant / answer / judge / participant_label / run_label / options: as in
            :class:`EvaluationConfig`, shared by every bundle.
        out_dir: the suite run directory: ``suite.json`` plus one run directory per bundle.
        suite: the suite name or file (:func:`aml_ray.suite.load_suite`).
        datasets_dir: the datasets directory (default :func:`aml_ray.suite.datasets_dir`).
        top_k / context_budget_tokens / judge_runs: None takes the suite's value; another value runs
            and is reported as a deviation from the release baseline.
        limit_samples: the first N samples of each bundle (smoke-sized runs; a deviation).
        allow_hash_mismatch: run bundles whose files differ from their pins (a deviation).
        bundles: run only these bundles (default: all of the suite's).
        run_id: one id for every bundle (ids stay unique: they hold the dataset name).
    """

    participant: ParticipantSpec
    answer: ModelEndpoint
    judge: ModelEndpoint
    out_dir: Path
    suite: str = "textual"
    datasets_dir: Path | None = None
    top_k: int | None = None
    context_budget_tokens: int | None = None
    judge_runs: int | None = None
    limit_samples: int | None = None
    allow_hash_mismatch: bool = False
    bundles: list[str] | None = None
    run_id: str = field(default_factory=new_run_id)
    run_label: str | None = None
    participant_label: str = "participant"
    options: PipelineOptions = field(default_factory=PipelineOptions)


@dataclass
class BundleOutcome:
    """What happened to one bundle of a suite run.

    Attributes:
        name / dataset / title: the bundle.
        status: ``ran``, ``skipped`` (absent, no adapter, a missing operator input, or a substitute
            whose primary is present) or ``failed`` (refused by hash or counts, or stopped).
        reason: one line saying why, for ``skipped`` and ``failed``.
        result: the dataset's :class:`EvaluationResult` when it ran.
        score / score_se / coverage / n_total / n_scored: the dataset row of Overall.
        task_averages: secondary metrics (name -> value), task averages then subsets
            (:func:`aml_ray.suite.secondary_metrics`), e.g. LongMemEval's task-averaged and abstention accuracy.
        substitute_for: the primary bundle this one stands in for, if any.
        deviations: how the run differs from the release baseline.
        credits: the per-question credits behind ``score`` (non-excluded questions, errors 0), for the
            Overall's bootstrap interval; None reads them from ``result``'s evidence when needed.
    """

    name: str
    dataset: str
    title: str
    status: str
    reason: str | None = None
    result: EvaluationResult | None = None
    score: float | None = None
    score_se: float | None = None
    coverage: float | None = None
    n_total: int = 0
    n_scored: int = 0
    task_averages: dict[str, float | None] = field(default_factory=dict)
    substitute_for: str | None = None
    deviations: list[str] = field(default_factory=list)
    credits: list[float] | None = field(default=None, repr=False)

    def question_credits(self) -> list[float] | None:
        """The per-question credits behind ``score`` (:func:`aml_ray.scoring.aggregate.with_credit`, excluded
        questions left out): ``credits`` when set, else read from the run's evidence; None when it did not run."""
        if self.credits is None and self.result is not None:
            import polars as pl

            from aml_ray.scoring.aggregate import with_credit

            rows = read_questions(self.result.run_dir, columns=("excluded", "status", "verdict", "score"))
            self.credits = with_credit(rows).filter(~pl.col("excluded"))["credit"].to_list()
        return self.credits

    @property
    def score_ci(self) -> tuple[float | None, float | None]:
        """The 95 % bootstrap interval of ``score``: the dataset row's ``accuracy_ci_low`` / ``_high`` of the
        result table (:func:`aml_ray.scoring.aggregate`); ``(None, None)`` when it did not run."""
        row = _dataset_row(self.result.table) if self.result is not None else {}
        return row.get("accuracy_ci_low"), row.get("accuracy_ci_high")

    def describe(self) -> dict[str, Any]:
        """The outcome for suite.json (no table, no evidence)."""
        return {k: getattr(self, k) for k in ("name", "dataset", "title", "status", "reason", "score", "score_se",
                                               "coverage", "n_total", "n_scored", "task_averages", "substitute_for",
                                               "deviations")} | (
            {"score_ci_low": self.score_ci[0], "score_ci_high": self.score_ci[1],
             "run_dir": str(self.result.run_dir.root)} if self.result else {})


@dataclass
class SuiteResult:
    """A finished suite run: per-bundle outcomes, the Overall row and what was written to suite.json."""

    suite: Any
    outcomes: list[BundleOutcome]
    overall: dict[str, Any]
    info: dict[str, Any]


def overall_of(outcomes: list[BundleOutcome]) -> dict[str, Any]:
    """Overall by the suite rule: the unweighted mean of the dataset scores of the bundles that ran.

    Its 95 % interval is the stratified percentile bootstrap of that mean
    (:func:`aml_ray.scoring.bootstrap.mean_of_means_ci`): each dataset's questions are resampled within the
    dataset, the resampled dataset scores are averaged without weights, bundles taken in suite order.

    Examples:
        >>> a = BundleOutcome("a", "a", "A", "ran", score=0.5, coverage=1.0, n_total=10, n_scored=10,
        ...                   credits=[1.0] * 5 + [0.0] * 5)
        >>> b = BundleOutcome("b", "b", "B", "ran", score=0.9, coverage=0.5, n_total=30, n_scored=15,
        ...                   credits=[1.0] * 27 + [0.0] * 3)
        >>> o = overall_of([a, b, BundleOutcome("c", "c", "C", "skipped")])
        >>> round(o["score"], 3), round(o["coverage"], 4), o["datasets"]
        (0.7, 0.625, 2)
        >>> o["score_ci_low"] < 0.7 < o["score_ci_high"]
        True

    Returns:
        ``{"score", "score_ci_low", "score_ci_high", "coverage", "n_total", "n_scored", "datasets"}``:
        score and its interval are None when nothing ran (the interval also when a bundle's credits are
        unknown); coverage = scored questions / non-excluded questions summed over the bundles that ran.
    """
    from aml_ray.scoring.bootstrap import mean_of_means_ci

    ran = [o for o in outcomes if o.status == "ran" and o.score is not None]
    n_total = sum(o.n_total for o in ran)
    n_scored = sum(o.n_scored for o in ran)
    credits = [o.question_credits() for o in ran]
    low, high = mean_of_means_ci(credits) if ran and all(credits) else (None, None)
    return {"score": sum(o.score for o in ran) / len(ran) if ran else None, "score_ci_low": low,
            "score_ci_high": high, "coverage": n_scored / n_total if n_total else None, "n_total": n_total,
            "n_scored": n_scored, "datasets": len(ran)}


def _dataset_row(table: pl.DataFrame) -> dict[str, Any]:
    import polars as pl

    row = table.filter(pl.col("category") == "overall").to_dicts()
    return row[0] if row else {}


def evaluate_suite(cfg: SuiteConfig, *,
                   on_bundle: Callable[[str, BundleOutcome | dict[str, Any]], None] | None = None,
                   on_progress: Callable[[str, str, dict[str, int]], None] | None = None,
                   num_cpus: int | None = None) -> SuiteResult:
    """Run every present bundle of a suite with :func:`evaluate`, then Overall by the suite's rule.

    Bundles are taken in suite order. A bundle is skipped, with a reason, when its files are absent, no
    adapter is registered for it, its adapter reports a missing input (``FileNotFoundError``, e.g.
    ScriptMem's unpublished scripts), or it is a ``substitute_for`` bundle whose primary is present. A
    bundle whose files or counts differ from the suite is refused (``failed``), unless hash mismatches
    are allowed. A contract error or non-retryable participant status stops the suite (the remaining
    bundles are ``failed`` with "not run"). Ray is started once, before the first bundle that runs.

    Args:
        cfg: the suite run's configuration.
        on_bundle: called with ``("start", {"name", "samples"...})`` before a bundle runs and
            ``("done", outcome)`` after each bundle (ran, skipped or failed).
        on_progress: called with ``(bundle, kind, values)`` as :func:`evaluate`'s ``on_progress``.
        num_cpus: CPUs for a local Ray cluster started here.

    Returns:
        The :class:`SuiteResult`; ``<out_dir>/suite.json`` holds the same facts.

    Raises:
        FileExistsError: ``out_dir`` already holds a suite.json.
    """
    from aml_ray.datasets.fetch import DatasetError
    from aml_ray.datasets.registry import DATASETS
    from aml_ray.suite import baseline_deviations, check_bundle, datasets_dir, load_suite, release_baseline, secondary_metrics

    suite = load_suite(cfg.suite)
    root = datasets_dir(cfg.datasets_dir)
    out = Path(cfg.out_dir)
    if (out / "suite.json").exists():
        raise FileExistsError(f"{out / 'suite.json'} exists: choose a new --out directory (runs are never overwritten)")
    wanted = cfg.bundles or [b.name for b in suite.bundles]
    for name in wanted:
        suite.bundle(name)  # unknown names fail before anything runs
    checks = {b.name: check_bundle(b, root=root) for b in suite.bundles}
    outcomes: list[BundleOutcome] = []
    started = datetime.now(timezone.utc).isoformat()
    t0 = time.perf_counter()
    started_ray = False  # Ray starts with the first bundle that runs (a run where every bundle is skipped needs none)
    stopped: str | None = None
    try:
        for bundle in suite.bundles:
            if bundle.name not in wanted:
                continue
            outcome = BundleOutcome(bundle.name, bundle.dataset, bundle.title, "skipped",
                                    substitute_for=bundle.substitute_for)
            check = checks[bundle.name]
            primary = checks.get(bundle.substitute_for) if bundle.substitute_for else None
            if stopped:
                outcome.status, outcome.reason = "failed", f"not run: {stopped}"
            elif bundle.dataset not in DATASETS:
                outcome.reason = f"no adapter is registered for dataset {bundle.dataset!r}"
            elif primary is not None and primary.present and bundle.substitute_for in wanted:
                outcome.reason = f"stands in for {bundle.substitute_for}, which is present"
            elif check.status == "missing":
                outcome.reason = f"absent: {check.data_path} not found (aml-ray datasets fetch {bundle.name})"
            elif check.status == "incomplete":
                outcome.reason = check.summary()
            elif check.status == "mismatch" and not cfg.allow_hash_mismatch:
                outcome.status, outcome.reason = "failed", f"refused: {check.summary()}"
            else:
                if on_bundle:
                    on_bundle("start", {"name": bundle.name, "title": bundle.title, "path": str(check.data_path)})
                prompts = {role: pin for role, pin in bundle.prompts.items() if pin.sha256}
                ecfg = EvaluationConfig(
                    dataset=bundle.dataset, participant=cfg.participant, answer=cfg.answer, judge=cfg.judge,
                    out_dir=out / bundle.name, data_path=check.data_path, allow_hash_mismatch=cfg.allow_hash_mismatch,
                    top_k=cfg.top_k or suite.top_k, limit_samples=cfg.limit_samples, run_id=cfg.run_id,
                    run_label=cfg.run_label, participant_label=cfg.participant_label, options=cfg.options,
                    answer_prompt=prompts["answer"].name if "answer" in prompts else None,
                    answer_prompt_sha256=prompts["answer"].sha256 if "answer" in prompts else None,
                    judge_prompt=prompts["judge"].name if "judge" in prompts else None,
                    judge_prompt_sha256=prompts["judge"].sha256 if "judge" in prompts else None,
                    context_budget_tokens=cfg.context_budget_tokens or suite.context_budget_tokens,
                    judge_runs=cfg.judge_runs or suite.judge_runs, suite=cfg.suite)
                progress = (lambda kind, values, _n=bundle.name: on_progress(_n, kind, values)) if on_progress else None
                started_ray = init_ray(num_cpus=num_cpus) or started_ray
                try:
                    result = evaluate(ecfg, on_progress=progress)
                except FileNotFoundError as exc:
                    outcome.reason = f"input missing: {exc}"
                except (DatasetError, ValueError) as exc:
                    outcome.status, outcome.reason = "failed", f"refused: {exc}"
                except StageFailed as exc:
                    outcome.status, outcome.reason = "failed", f"stopped: {exc.summary}"
                    stopped = f"the suite stopped after {bundle.name}: {exc.summary}"
                else:
                    row = _dataset_row(result.table)
                    outcome.status, outcome.result = "ran", result
                    outcome.score, outcome.score_se = row.get("accuracy"), row.get("accuracy_se")
                    outcome.coverage, outcome.n_total, outcome.n_scored = (row.get("coverage"), row.get("n_total", 0),
                                                                           row.get("n_scored", 0))
                    outcome.task_averages = secondary_metrics(bundle, result.questions)  # task averages, subsets
                    outcome.deviations = baseline_deviations(suite, bundle, result.run_info)
                    if result.run_info["status"] != "completed":  # partial: fewer Adds or questions than the bundle
                        outcome.deviations.append(f"run {result.run_info['status']}: {result.run_info.get('error')}")
                    if bundle.substitute_for:
                        outcome.deviations.append(f"stands in for {bundle.substitute_for}, which is absent")
            outcomes.append(outcome)
            if on_bundle:
                on_bundle("done", outcome)
    finally:
        if started_ray:
            shutdown_ray()
    overall = overall_of(outcomes)
    not_comparable = [f"{o.name}: {o.status}" + (f" ({o.reason})" if o.reason else "")
                      for o in outcomes if o.status != "ran"]
    not_comparable += [f"{o.name}: {d}" for o in outcomes for d in o.deviations]
    info = {"suite": suite.name, "suite_version": suite.version, "run_id": cfg.run_id, "run_label": cfg.run_label,
            "participant": {"label": cfg.participant_label, **cfg.participant.describe()},
            "datasets_dir": str(root), "started_at": started, "finished_at": datetime.now(timezone.utc).isoformat(),
            "wall_s": round(time.perf_counter() - t0, 3), "aggregation_rule": suite.aggregation.rule,
            "bundles": [o.describe() for o in outcomes], "overall": overall,
            "comparable_with_release_baseline": not not_comparable, "differences_from_release_baseline": not_comparable,
            "release_baseline": release_baseline(suite)}
    write_json_atomic(info, out / "suite.json")
    return SuiteResult(suite=suite, outcomes=outcomes, overall=overall, info=info)
