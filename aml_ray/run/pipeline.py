"""The evaluation job: samples -> Ingest (Adds, then Searches) -> Answer and Judge -> evidence.

Shape (DESIGN.md "The pipeline"): the unit of ingestion is one sample (one user_id); its chunks are
added in order while samples run in parallel; a sample's questions are searched as soon as that
sample's Adds are done (no global barrier), by the Ingest task itself; its searched rows are then answered
and judged, each slice judged as soon as it is answered (:mod:`aml_ray.stages.answer_judge`). A
retrieval-only run stops after Search.

By default (:attr:`PipelineOptions.models_inline`) the job is one plain Ray actor that the driver calls
itself (:func:`_single_stage`): the Ingest actor, which also runs the models' stages on each sample's
searched rows (:mod:`aml_ray.stages.ingest`); the model clients' actors hold the models' limits. Ray
Data's streaming executor and its helper actors (stats, actor locations, autoscaling coordinator) cost
about 1.6 ms of CPU a question against a one-at-a-time participant, and they and a model stage actor of
its own cost worker starts that delayed the first model call of a suite's or of many participants' jobs
on 2 cores by seconds (docs/benchmarks.md). With ``models_inline=False`` the models are a Ray Data operator
after Ingest (:func:`_ray_data_stages`), with backpressure between the two operators. Every stage actor has a
fractional CPU (``num_cpus=0.1``: I/O-bound; a whole CPU per pool actor deadlocks on 2 cores,
docs/ray-notes.md) and sends one actor call per batch (per slice, for the models) to the
``ParticipantClient`` / ``ModelClient`` actors that hold the limits.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from aml_ray import interrupts
from aml_ray.actors.model import JobModel
from aml_ray.actors.participant import ParticipantSpec
from aml_ray.actors.progress_hub import TrackerOnHub
from aml_ray.actors.shared import acquire_model_client, acquire_participant_client, acquire_progress_hub
from aml_ray.config import ModelEndpoint
from aml_ray.run.evidence import (SUMMARY_COLUMNS, BufferedQuestionWriter, QuestionWriter, RunDir, finish_add_journals,
                              read_questions)
from aml_ray.run.head_start import HeadStart
from aml_ray.run.inputs import PipelineInputs, build_inputs, iter_excluded, stream_steps
from aml_ray.run.local_ingest import LocalIngest
from aml_ray.run.options import ANSWER_QUEUE_FACTOR, OFFLINE_BATCH, PipelineOptions  # noqa: F401 - re-exported: the pipeline's knobs
from aml_ray.run.outcome import StageFailed  # noqa: F401 - re-exported: how the pipeline stops
from aml_ray.prompts import Prompt
from aml_ray.run.ray_runtime import in_ray_actor, quiet_ray_data, use_arrow_ipc_serialization
from aml_ray.stages import AnswerJudgeStage, IngestFromFiles
from aml_ray.stages.ingest import PROGRESS_GROUP, PROGRESS_GROUP_SIZE

if TYPE_CHECKING:  # read_questions imports it for the result: importing the pipeline right after the Ray
    import polars as pl  # start costs 0.015 s instead of 0.1 s (aml_ray.run.evaluation)

__all__ = ["IngestFromFiles", "PipelineInputs", "PipelineOptions", "StageFailed", "build_inputs", "run_pipeline",
           "stream_steps"]


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: Longest cause kept in an error summary (characters): the whole message of any ordinary exception.
MAX_CAUSE_CHARS = 4000
_CHAINED = re.compile(r"\n\s*(?:The above exception was the direct cause of the following exception:|"
                      r"During handling of the above exception, another exception occurred:)\s*\n")


def error_cause(exc: BaseException) -> str:
    """The cause of a pipeline failure as one message: ``"pyarrow.lib.ArrowInvalid: Not an Arrow file"``.

    Ray Data re-raises a stage's exception as a ``RayTaskError(UserCodeException)`` whose text is Ray's
    header (actor, pid, ANSI colour codes), then the worker's traceback: the original exception first,
    then "The above exception was the direct cause..." and Ray's own wrapper; the original object is not
    kept. This returns the original exception's ``Type: message`` in full (up to
    :data:`MAX_CAUSE_CHARS`), without colour codes; an exception that carries no traceback text gives
    ``Type: message``.
    """
    text = _ANSI.sub("", str(exc)).strip()
    first = _CHAINED.split(text)[0]  # Python prints the innermost cause first
    lines = first.splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith("  File \"")]
    if frames:
        rest = lines[frames[-1] + 1:]
        start = next((i for i, line in enumerate(rest) if line and not line[0].isspace()), None)
        if start is not None:
            return "\n".join(rest[start:]).strip()[:MAX_CAUSE_CHARS]
    return f"{type(exc).__name__}: {text}"[:MAX_CAUSE_CHARS]


def _hand_over(tracker, client, head_start: HeadStart, stop: threading.Event, *, held_from_start: bool = False) -> None:
    """Hand ``head_start``'s samples over to the Ingest stage once it asks to take over, or once ``stop`` is
    set (the pipeline ended first) (:mod:`aml_ray.run.head_start`, the handover).

    The head start sends no new Add; the participant client actor ``client`` holds back a slot for each
    sample it still has an Add of out (:meth:`~aml_ray.actors.participant.ParticipantClient.hold_back`,
    before anything is released), the other samples are released at once, and each of those is released,
    and its slot given back, as its Add returns (:meth:`aml_ray.run.progress.ProgressTracker.release`).
    Last, the head start's thread is joined and everything released.

    ``held_from_start``: ``client`` is a joined cluster's shared client made holding all its slots for this
    head start (:mod:`aml_ray.actors.shared`): ``hold_back`` is called whatever the head start has out,
    which gives the others back.
    """
    import queue

    import ray

    wanted = tracker.wait_wanted.remote()
    while not stop.is_set() and not ray.wait([wanted], timeout=0.2)[0]:
        pass
    ended: queue.SimpleQueue[str] = queue.SimpleQueue()
    adding, state = head_start.hand_over(ended.put)
    kept = set(adding)
    try:
        if held_from_start or (kept and state is not None):
            lone, limit = (state["lone_latencies"], state["limit"]) if state is not None else (None, None)
            ray.get(client.hold_back.remote(len(kept), lone, limit), timeout=30)
        tracker.release.remote(sorted(kept))
        while kept:
            try:
                sample = ended.get(timeout=0.2)
            except queue.Empty:
                if head_start.running():
                    continue
                break  # the head start's thread is over: every sample it had is journalled
            kept.discard(sample)
            client.give_back.remote(1)
            tracker.release.remote(sorted(kept))
    finally:
        head_start.stop()
        if kept:
            client.give_back.remote(len(kept))
        tracker.release.remote()


def _ingest_actor(ingest_kwargs: dict[str, Any], *, in_flight: int, scheduling: Any = None):
    """The plain Ray actor of a job whose only stage is Ingest (:func:`_single_stage`); the caller kills it.

    Args:
        ingest_kwargs: :class:`~aml_ray.stages.IngestFromFiles`'s constructor arguments; with
            ``progress_here`` the actor holds the run's tracker and gets the concurrency group of its
            :meth:`~aml_ray.stages.IngestStage.progress` calls (:data:`~aml_ray.stages.ingest.PROGRESS_GROUP`).
        in_flight: tasks the actor runs at once (an async actor's ``max_concurrency``, its default group's);
            the others wait in its queue.
        scheduling: the actor's Ray scheduling strategy (:attr:`PipelineOptions.stage_scheduling`).

    On a cluster of several nodes, a lost actor (its node gone) is restarted and its unfinished tasks are
    sent again (``max_restarts``/``max_task_retries``), as Ray Data does for its actor pools; a re-run
    sample goes on from its Add journal. On one node there is no other node to restart it on, so it gets
    no restarts: Ray's core worker then has no reason to log, on the driver's console, that its
    constructor's arguments (actor handles) could be gone by a restart.
    """
    import ray

    restarts = -1 if sum(1 for node in ray.nodes() if node["Alive"]) > 1 else 0
    options: dict[str, Any] = {"num_cpus": 0.1, "max_concurrency": in_flight, "max_restarts": restarts,
                               "max_task_retries": restarts}
    if scheduling is not None:
        options["scheduling_strategy"] = scheduling
    groups = {PROGRESS_GROUP: PROGRESS_GROUP_SIZE} if ingest_kwargs.get("progress_here") is not None else None
    # concurrency groups are declared with the class, not in .options() (Ray 2.60 refuses them there)
    remote_class = ray.remote(concurrency_groups=groups)(IngestFromFiles) if groups else ray.remote(IngestFromFiles)
    return remote_class.options(**options).remote(**ingest_kwargs)


#: Seconds between two reads of the run's progress for ``on_progress`` (a Ray call into the actor that holds
#: the tracker, CPU in both processes while the participant works): once a
#: second, as often as the command line redraws its bars.
PROGRESS_POLL_S = 1.0


class ProgressOnIngest:
    """The driver's handle on the tracker a single-stage Ingest actor holds (``progress_here``): called as a
    :class:`~aml_ray.run.progress.ProgressTracker` actor is (``tracker.snapshot.remote()``), each call runs
    :meth:`~aml_ray.stages.IngestStage.progress` in the actor's :data:`~aml_ray.stages.ingest.PROGRESS_GROUP`."""

    def __init__(self, actor) -> None:
        self._call = actor.progress.options(concurrency_group=PROGRESS_GROUP)

    def __getattr__(self, method: str) -> "_ProgressCall":
        return _ProgressCall(self._call, method)


@dataclass(frozen=True)
class _ProgressCall:
    call: Any  # the actor's ``progress`` method, in its concurrency group
    method: str

    def remote(self, *args: Any):
        """The ObjectRef of ``method(*args)`` on the tracker the actor holds."""
        return self.call.remote(self.method, *args)


def _snapshot(tracker) -> dict[str, int] | None:
    """The tracker's counts, or None when the actor that holds it is gone (the run's own error says why)."""
    import ray

    try:
        return ray.get(tracker.snapshot.remote(), timeout=10)
    except Exception:  # noqa: BLE001 - RayActorError, GetTimeoutError
        return None


def _single_stage(actor, blocks: list[list[str]]) -> Iterator[pa.Table]:
    """Run a job whose only stage is Ingest on one plain Ray actor (:func:`_ingest_actor`); yield each task's
    rows as it ends.

    Args:
        actor: the Ingest actor; alive when this ends (the caller kills it, after its last tracker call).
        blocks: the sample file paths of each Ingest task (as Ray Data's blocks would hold them).

    Yields:
        Each task's output table (:meth:`aml_ray.stages.IngestStage.ingest`), in the order the tasks end.

    Raises:
        ray.exceptions.RayTaskError: a task's error (the tracker holds a participant's structured cause);
        ray.exceptions.RayActorError: the actor died and could not be restarted (:func:`_ingest_actor`).
    """
    import ray

    pending = [actor.ingest.remote(pa.table({"path": paths})) for paths in blocks]
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=1.0)  # a timeout: Ctrl-C gets through
            for ref in done:
                yield ray.get(ref)
    finally:
        if pending:  # stopped early (an error, Ctrl-C): the tasks left are cancelled first, so none is retried
            for ref in pending:  # on an actor that is being killed (Ray logs each such retry to the console)
                ray.cancel(ref)
            ray.wait(pending, num_returns=len(pending), timeout=2.0)


def _ray_data_stages(opts: PipelineOptions, paths: list[str], *, per_task: int, tasks: int,
                     ingest_kwargs: dict[str, Any], answer: tuple[ModelEndpoint, dict[str, Any]],
                     judge: tuple[ModelEndpoint, dict[str, Any]]) -> Iterator[pa.Table]:
    """Ingest, then Answer and Judge in one stage, as Ray Data operators (a job with an online model); yield
    output blocks.

    Args:
        opts: the throughput knobs (batch sizes, tasks at once, ``stage_scheduling``).
        paths: every sample's input file; ``per_task`` of them per Ingest task, ``tasks`` tasks at once.
        ingest_kwargs: :class:`~aml_ray.stages.IngestFromFiles`'s constructor arguments.
        answer / judge: each model's endpoint and its stage's constructor arguments.

    Yields:
        Output blocks as ``pyarrow.Table`` (judged question rows), as Ray Data streams them.
    """
    import ray.data
    from ray.data import ActorPoolStrategy

    quiet_ray_data()

    def pool(in_flight: int) -> ActorPoolStrategy:
        # A Ray Data actor runs one task at a time unless max_concurrent_calls_per_actor says otherwise
        # (each task = one input bundle; an async UDF runs up to 4 of its batches at once). Running
        # `in_flight` tasks at once, with as many queued behind them, keeps the participant's semaphore
        # (the only limiter) fed between tasks.
        return ActorPoolStrategy(size=1, max_concurrent_calls_per_actor=in_flight,
                                 max_tasks_in_flight_per_actor=2 * in_flight)

    common: dict[str, Any] = {"batch_format": "pyarrow", "num_cpus": 0.1, "zero_copy_batch": True}
    if opts.stage_scheduling is not None:
        common["scheduling_strategy"] = opts.stage_scheduling
    (answer_endpoint, answer_kwargs), (judge_endpoint, judge_kwargs) = answer, judge
    ds = ray.data.from_items([{"path": p} for p in paths], override_num_blocks=max(1, -(-len(paths) // per_task)))
    ds = ds.map_batches(IngestFromFiles, batch_size=per_task, compute=pool(tasks),
                        fn_constructor_kwargs=ingest_kwargs, **common)
    # Ingest emits one block per task, its questions searched. Ray Data bundles blocks up to the model
    # batch size (not ds.repartition(): its tasks ask for a whole CPU, which a 1-CPU node whose stage
    # actors hold 0.1 never has; measured: a 2-node run of 1 CPU each stalled before the first Answer).
    # Answer and Judge are one operator: each slice of a task's rows is judged as soon as it is answered
    # (aml_ray.stages.answer_judge).
    model_tasks = max(opts.model_tasks_for(answer_endpoint), opts.model_tasks_for(judge_endpoint))
    ds = ds.map_batches(AnswerJudgeStage, batch_size=opts.model_batch_for(answer_endpoint),
                        compute=pool(model_tasks),
                        fn_constructor_kwargs={"answer": answer_kwargs, "judge": judge_kwargs,
                                               "slice_rows": opts.judge_slice_rows, "warm_up": True},
                        **common)
    yield from ds.iter_batches(batch_format="pyarrow", batch_size=None)


def _release(leases: list) -> None:
    """Give back every lease of ``leases`` (:meth:`aml_ray.actors.shared.Lease.release`: never raises)."""
    for lease in leases:
        lease.release()


def run_pipeline(
    inputs: PipelineInputs,
    *,
    run_dir: RunDir,
    participant: ParticipantSpec,
    answer: ModelEndpoint,
    judge: ModelEndpoint,
    answer_prompt: Prompt | str,
    judge_prompt: Prompt | str,
    top_k: int,
    f1_rule: str = "token",
    context_budget_tokens: int = 16_000,
    answer_cap_tokens: int | None = None,
    judge_runs: int = 1,
    scorer: str = "binary_judge",
    options: PipelineOptions | None = None,
    on_progress: Callable[[dict[str, int]], None] | None = None,
    media_root: str | None = None,
    image_tokens: int | str = "openai_tiles",
    retrieval_only: bool = False,
    job_key: str | None = None,
    participant_key: str | None = None,
    report: dict | None = None,
    private_cluster: bool = False,
    head_start: HeadStart | None = None,
    on_rows: Callable[[pa.Table], None] | None = None,
) -> pl.DataFrame:
    """Run the job (Ray Data stages, or one Ingest actor for a single-stage job) and write question
    evidence; Ray must be initialised.

    Args:
        inputs: from :func:`build_inputs`: Ray Data carries its sample files' paths, one per block and
            per Ingest task (:class:`IngestFromFiles`); its excluded rows are copied into the evidence by
            the driver, one sample's row group at a time.
        run_dir: where evidence goes.
        participant: the participant version under evaluation.
        answer / judge: model endpoints (offline ones run inside the stage, no actor).
        answer_prompt / judge_prompt: loaded prompts (they travel to the workers) or shipped names.
        f1_rule: ``"locomo"`` or ``"token"`` (the dataset's lexical F1 definition).
        context_budget_tokens: token budget of the answer context (memories).
        answer_cap_tokens: the answer-length cap in tokens (:func:`aml_ray.stages.answer.cap_answers`); None: no cap.
        judge_runs: how many times each answer is judged (mean and std of accuracy when > 1).
        scorer: the dataset's scoring contract (:mod:`aml_ray.stages.scorers`).
        top_k: Top K sent with every Search.
        options: throughput knobs.
        on_progress: called about once a second (:data:`PROGRESS_POLL_S`) with ``{stage: done}`` counts.
        media_root / image_tokens: Multimodal: the run's media folder and the context cost of an image
            (:func:`aml_ray.stages.answer.answer_rows`); None for text-only tracks.
        retrieval_only: Add and Search only, no Answer or Judge (no model is called): each question
            row ends with its memories and status ``retrieved`` (or ``search_error``).
        job_key: this job's key (an evaluation's :attr:`~aml_ray.run.evaluation.EvaluationConfig.job_key`;
            never a secret): its model calls take the shared endpoint's
            in-flight slots in turn with other jobs' (:mod:`aml_ray.actors.fair`). None: a fresh one.
        participant_key: the non-secret version key under which the participant's client is shared
            with other jobs on the cluster (:func:`aml_ray.actors.shared.acquire_participant_client`);
            None derives it from the spec's non-secret fields.
        report: filled with ``participant_concurrency``: the participant client's adaptive in-flight
            limit (:meth:`aml_ray.actors.participant.ParticipantClient.concurrency`: declared, min, max,
            final, trajectory), read before the client is released, whether or not the run failed.
        private_cluster: this driver started its own local cluster (no other process can reach it): the
            client actors are spawned here, not through the cluster's registry actor (one worker start
            less before the first Add; :mod:`aml_ray.actors.shared`).
        head_start: the driver's head start (:mod:`aml_ray.run.head_start`): stopped when the Ingest stage
            asks to take over (or when the pipeline ends first), so one client sends the participant's
            traffic at a time. One prepared but not released (a joined cluster) asks the client registry
            for the head start with the participant's lease, and is released when granted, else stopped.
        on_rows: called with each output table of question rows as the driver receives it (the rows it
            writes as evidence, in that order), from this thread: it must return quickly
            (:class:`aml_ray.run.memory_checks.RunningChecks`).

    Returns:
        Every question row of the run's evidence (scored and excluded, including a resumed run's earlier
        ones), columns :data:`aml_ray.run.evidence.SUMMARY_COLUMNS` only (no memories, answers or judge
        texts: the driver's memory stays flat as the corpus grows); :func:`aml_ray.run.evidence.read_questions`
        reads every column.

    Raises:
        StageFailed: on a contract error or non-retryable participant status (``.cause`` holds it).
    """
    import ray

    opts = options or PipelineOptions()
    use_arrow_ipc_serialization()  # the blocks this driver reads back (the stage actors set it for theirs)
    # the models run inside the Ingest actor (aml_ray.stages.ingest): the job is one actor, no Ray Data (module docstring)
    inline = not retrieval_only and opts.models_inline
    single = retrieval_only or inline  # one stage: no Ray Data (module docstring)
    # the tracker keeps counts and the first failure: in the cluster's progress hub, one actor for every job
    # (aml_ray.actors.progress_hub), or in a private cluster's single stage the Ingest actor itself
    # (aml_ray.run.progress)
    local = single and (opts.ingest_here if opts.ingest_here is not None
                        else opts.stage_scheduling is None and in_ray_actor())  # aml_ray.run.local_ingest
    progress_here = {"head_start": head_start is not None} if private_cluster and single and not local else None
    # Shared with every job running on the cluster, in any process (aml_ray.actors.shared): one client
    # per participant version and per model endpoint, so declared limits hold across jobs; leases are
    # released in the finally below, and the last job out closes the actor. What every job needs (the
    # progress hub, the model clients) is leased first and the version's participant client last: the
    # raylet starts worker processes in the order they are asked for, as many at a time as the node has
    # CPUs, so jobs that start at once find the shared actors started ahead of their participants' clients,
    # not behind all of them (docs/benchmarks.md). On a joined cluster the participant's lease grants the
    # head start, those few registry round trips later.
    job = job_key or uuid.uuid4().hex
    leases: list = []
    try:  # a lease that fails to come releases those already taken
        tracker = None
        if progress_here is None:
            leases.append(acquire_progress_hub(job, private=private_cluster))
            tracker = TrackerOnHub(leases[-1].handle, uuid.uuid4().hex, head_start=head_start is not None)
        answer_client = judge_client = None
        if not answer.offline and not retrieval_only:
            leases.append(acquire_model_client(answer, job, private=private_cluster))
            answer_client = JobModel(leases[-1].handle, job)
        if not judge.offline and not retrieval_only:
            leases.append(acquire_model_client(judge, job, private=private_cluster))
            judge_client = JobModel(leases[-1].handle, job)
        ask = head_start is not None and not private_cluster and not head_start.released
        participant_lease = acquire_participant_client(participant, job, version_key=participant_key,
                                                       private=private_cluster, head_start=ask)
        leases.append(participant_lease)
        client = participant_lease.handle
        if ask and participant_lease.head_start:  # this job's lease started the shared client, holding its slots for it
            head_start.release()
        elif ask:
            head_start.stop("not granted: another job holds the participant version's client")
    except BaseException:
        _release(leases)
        raise

    # blocks of sample file paths (the driver never holds the rows), one Ingest task per block: one sample
    # each, or several when samples are many (PipelineOptions.ingest_layout); IngestFromFiles reads each
    # sample in the actor when its turn comes
    per_task, tasks = opts.ingest_layout(inputs.n_samples, retrieval_only=retrieval_only)
    samples_at_once = None if per_task == 1 else opts.ingest_parallelism
    # online models here: a searched sample waits for them after its ingestion slot (aml_ray.stages.ingest); the
    # actor runs more tasks than it ingests at once, so the next samples are added meanwhile
    answers_after_slot = inline and not (answer.offline and judge.offline)
    if answers_after_slot:
        samples_at_once, tasks = opts.ingest_parallelism, tasks * ANSWER_QUEUE_FACTOR
    answer_kwargs = {"endpoint": answer, "client": answer_client, "prompt": answer_prompt,
                     "budget_tokens": context_budget_tokens, "cap_tokens": answer_cap_tokens, "tracker": tracker,
                     "media_root": media_root, "image_tokens": image_tokens}
    judge_kwargs = {"endpoint": judge, "client": judge_client, "prompt": judge_prompt, "f1_rule": f1_rule,
                    "judge_runs": judge_runs, "scorer": scorer, "tracker": tracker}
    ingest_kwargs = {"participant": client, "run_root": str(run_dir.root), "top_k": top_k, "tracker": tracker,
                     "final": retrieval_only, "samples_at_once": samples_at_once,
                     "models": (answer_kwargs, judge_kwargs) if inline else None,
                     "judge_slice_rows": opts.judge_slice_rows if answers_after_slot else None,
                     "progress_here": progress_here}
    paths = inputs.sample_paths()
    blocks = [paths[i:i + per_task] for i in range(0, len(paths), per_task)]  # one Ingest task's sample files each
    ingest_actor = local_ingest = None
    if report is not None:
        report["ingest_in"] = "job process" if local else "actor" if single else "ray data"
    if local:
        try:  # the stage's constructor runs here, not in an actor's first call: its error releases the leases
            local_ingest = LocalIngest(ingest_kwargs, in_flight=tasks)
        except BaseException:
            _release(leases)
            raise
        outputs = local_ingest.run(blocks)
    elif single:
        ingest_actor = _ingest_actor(ingest_kwargs, in_flight=tasks, scheduling=opts.stage_scheduling)
        outputs = _single_stage(ingest_actor, blocks)
        if progress_here is not None:
            tracker = ProgressOnIngest(ingest_actor)
    else:
        outputs = _ray_data_stages(opts, paths, per_task=per_task, tasks=tasks, ingest_kwargs=ingest_kwargs,
                                   answer=(answer, answer_kwargs), judge=(judge, judge_kwargs))

    writer = QuestionWriter(run_dir)
    writer.write(iter_excluded(inputs))
    stop = threading.Event()
    handover = None
    if head_start is not None:
        handover = threading.Thread(target=_hand_over, args=(tracker, client, head_start, stop), daemon=True,
                                    kwargs={"held_from_start": participant_lease.head_start})
        handover.start()
    poller = None
    if on_progress is not None:
        def poll() -> None:
            while not stop.wait(PROGRESS_POLL_S):
                snapshot = _snapshot(tracker)
                if snapshot is None:  # the tracker's actor is gone: the run's own error says why
                    return
                on_progress(snapshot)
        poller = threading.Thread(target=poll, name="aml-ray-progress", daemon=True)
        poller.start()
    buffered = BufferedQuestionWriter(writer)
    try:
        for batch in outputs:
            buffered.append(batch)
            if on_rows is not None:
                on_rows(batch)
    except Exception as exc:  # Ray Data wraps stage errors as text; the tracker kept the structured cause
        try:
            failure = ray.get(tracker.failure.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - the actor holding the tracker is gone: the cause below
            failure = None
        if failure is not None:
            raise StageFailed(failure["summary"], failure=failure) from None
        raise StageFailed(f"pipeline failed: {error_cause(exc)}") from exc
    finally:
        # a Ctrl-C from here on waits for the end (aml_ray.interrupts.deferred): cut short, the clean-up left
        # the tracker and clients alive, and one landing in pyarrow's or polars' callbacks was dropped
        with interrupts.deferred():
            outputs.close()  # now, not when collected: a single stage's tasks left are cancelled, Ray Data's executor stops
            buffered.flush()  # finished rows are evidence, whether or not the run stopped on an error
            stop.set()
            if poller is not None:
                poller.join(timeout=2)
            if handover is not None:
                handover.join()
            if on_progress is not None and (snapshot := _snapshot(tracker)) is not None:
                on_progress(snapshot)
            if report is not None:
                try:
                    report["participant_concurrency"] = ray.get(client.concurrency.remote(), timeout=10)
                except Exception as exc:  # noqa: BLE001 - a lost client actor: the run's own error says why
                    report["participant_concurrency"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            if isinstance(tracker, TrackerOnHub):  # the hub forgets this job's counts; its lease ends below
                tracker.hub.drop.remote(tracker.key)
            _release(leases)
            if ingest_actor is not None:
                ray.kill(ingest_actor, no_restart=True)
            if local_ingest is not None:
                local_ingest.close()
            if poller is not None:
                # never left inside a Ray call: a thread that calls into Ray after ray.shutdown() ends the whole
                # process at once with status 1 (Ray's core worker exits), before run.json says how the run
                # ended; its call returns within _snapshot's timeout, at once once the hub dropped the job
                poller.join()
    with interrupts.deferred():
        finish_add_journals(run_dir)  # every sample's Adds are done: their journals become Parquet evidence
        return read_questions(run_dir, columns=SUMMARY_COLUMNS)
