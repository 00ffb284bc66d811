"""The pipeline's throughput knobs (:class:`PipelineOptions`).

Apart from :mod:`aml_ray.run.pipeline`, which imports polars, Ray Data's stages and the model clients: a
run's configuration (:class:`aml_ray.run.evaluation.EvaluationConfig`) holds these knobs, and ``aml-ray
run`` builds it and prepares the run before those imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aml_ray.config import ModelEndpoint


#: Rows of a model task answered together and then judged together (:class:`PipelineOptions`
#: ``judge_slice_rows``, :mod:`aml_ray.stages.answer_judge`): one actor call to each model's client and one
#: progress report each per slice. A slice waits for its slowest answer before it is judged; 8 rows keep
#: that wait short while the calls stay few.
JUDGE_SLICE_ROWS = 8

#: Rounds of an online endpoint's concurrency (``max_in_flight``) the model stage holds at once, across its
#: tasks (:meth:`PipelineOptions.model_tasks_for`).
MODEL_ROUNDS_IN_FLIGHT = 8

#: Rows per batch of the offline answerer and judge (:meth:`PipelineOptions.model_batch_for`).
OFFLINE_BATCH = 48

#: With online models in the Ingest actor (:attr:`PipelineOptions.models_inline`), a sample's searched rows
#: wait for the models after its ingestion slot is given back: the actor runs this many times its ingestion
#: tasks at once, so at most that many tasks' rows wait for answers while the next samples are added (the
#: backpressure a Ray Data operator of its own gave them).
ANSWER_QUEUE_FACTOR = 4


@dataclass
class PipelineOptions:
    """Throughput knobs (defaults sized for one participant on a small machine).

    The participant's ``max_in_flight`` (and the model endpoints' limits) are the only limiters: these
    knobs only have to keep enough work queued in front of them. Batches are large (up to 256 rows):
    small ones spend most of the CPU on per-batch Ray Data and actor-call overhead (measured:
    docs/benchmarks.md).

    Attributes:
        ingest_parallelism: samples ingested at once (each sample's Adds stay sequential); the Ingest
            actor runs this many tasks (one sample each) concurrently, and with online models inside it
            :data:`ANSWER_QUEUE_FACTOR` times as many, their searched rows waiting for the models.
        batches_in_flight: tasks each Answer/Judge actor runs at once (each task is one input
            bundle whose batches run concurrently, up to 4); as many again are queued behind them.
        judge_slice_rows: rows of a model task answered together and then judged together, while the
            task's other slices are still being answered (:mod:`aml_ray.stages.answer_judge`).
        model_batch_size: questions per answer/judge actor call; None picks one per endpoint with
            :meth:`model_batch_for`.
        samples_per_task: samples per Ingest task; None picks one with :meth:`ingest_layout`.
        models_inline: answer and judge inside the Ingest actor (:mod:`aml_ray.stages.ingest`): a job is one
            plain Ray actor, with no Ray Data executor and no model stage actor to start. False keeps them
            in a Ray Data operator of their own after Ingest (:class:`~aml_ray.stages.AnswerJudgeStage`), the
            layout a test of that operator needs.
        stage_scheduling: a Ray scheduling strategy for every stage actor (e.g.
            ``NodeAffinitySchedulingStrategy(node_id, soft=True)``); None: Ray Data's for its stages,
            Ray's default for a single-stage job's Ingest actor.
        ingest_here: a single-stage job's Ingest runs in the process that runs the job, on an event loop of
            its own (:mod:`aml_ray.run.local_ingest`), not in an Ingest actor: one worker process less to
            start. None: when that process is a Ray actor that runs the job (a suite's bundle runner, the
            service's job actor) and no ``stage_scheduling`` places the stage; a driver keeps the actor
            (its memory stays flat, and a private cluster's actor also holds the run's progress tracker).
    """

    ingest_parallelism: int = 16
    batches_in_flight: int = 8
    models_inline: bool = True
    model_batch_size: int | None = None
    judge_slice_rows: int = JUDGE_SLICE_ROWS
    samples_per_task: int | None = None
    stage_scheduling: Any = None
    ingest_here: bool | None = None

    def __post_init__(self) -> None:
        """Refuse a slice size the model stage could not cut (before any Ray start or request).

        Raises:
            ValueError: ``judge_slice_rows`` below 1, naming the field.
        """
        if self.judge_slice_rows < 1:
            raise ValueError(f"PipelineOptions.judge_slice_rows must be 1 or more rows, got {self.judge_slice_rows}")

    def ingest_layout(self, n_samples: int, *, retrieval_only: bool = False) -> tuple[int, int]:
        """``(samples per Ingest task, Ingest tasks at once)`` for a run of ``n_samples``.

        Each Ray Data task costs the Ingest actor and the driver milliseconds of CPU whatever its size
        (task dispatch, the output block, the executor's bookkeeping, a progress report), next to a
        fraction of a millisecond per question. So when samples are many, one task takes several. A
        task's rows go downstream only when all its samples are done:

        - with Answer and Judge behind Ingest, that wait is the pipeline's. Tasks take up to 8 samples
          and no more than ``n_samples // (2 * ingest_parallelism)``, so the tasks outnumber twice the
          samples in progress (8 a task measured slower end to end: docs/benchmarks.md);
        - a retrieval-only run has nothing behind Ingest: its tasks take up to 8 samples, and there are
          at least 8 tasks (``n_samples // 8`` a task): measured faster than 3 a task, and lighter on the
          cores the participant client shares (docs/benchmarks.md).

        A task's samples run at once; the actor holds at most ``ingest_parallelism`` samples in
        progress across its tasks (:class:`aml_ray.stages.IngestStage` ``samples_at_once``), and runs
        twice as many tasks as that needs, so a finishing sample's slot is taken at once by a queued
        one. ``samples_per_task`` overrides the choice.
        """
        if self.samples_per_task:
            per_task = self.samples_per_task
        elif retrieval_only:
            per_task = max(1, min(8, n_samples // 8))
        else:
            per_task = max(1, min(8, n_samples // (2 * self.ingest_parallelism)))
        if per_task == 1:
            return 1, self.ingest_parallelism
        return per_task, 2 * -(-self.ingest_parallelism // per_task)

    def model_batch_for(self, endpoint: ModelEndpoint) -> int:
        """Rows per Answer/Judge batch for ``endpoint``.

        A Ray Data task hands its rows to the next stage only when it ends, so a batch's time in a stage
        is a pipeline delay: 256 rows at 32 in flight and 200 ms are 1.6 s before the first Judge. An
        online endpoint gets about two rounds of its concurrency (16..256 rows). The offline answerer and
        judge get :data:`OFFLINE_BATCH` rows: fewer than any LoCoMo sample's scorable questions, so one
        searched sample fills a batch by itself; with 256 the first samples' rows waited for more (two
        samples of 116 rows waited for the last Search), and the run's tail after its last Search held
        every sample's answering (measured: docs/benchmarks.md).
        """
        if self.model_batch_size is not None:
            return self.model_batch_size
        if endpoint.offline:
            return OFFLINE_BATCH
        return max(16, min(256, 2 * endpoint.max_in_flight))

    def model_tasks_for(self, endpoint: ModelEndpoint) -> int:
        """Tasks the Answer/Judge actor runs at once for ``endpoint``.

        Rows taken in by a model stage wait in the endpoint's FIFO semaphore; if the stage takes in
        far more than the endpoint serves at once, every task's last rows queue behind all the others
        and no task finishes until nearly all do (measured: the first Judge long after the first
        Answer; docs/benchmarks.md). Eight rounds of the endpoint's concurrency (at 32 in flight, 64-row
        batches: 4 tasks) keep a buffer of answered rows: when the judge model is
        the one at its limit, the tasks' rows wait for it, and with four rounds (2 tasks) the answer
        model waits at half its budget until they are judged (docs/benchmarks.md, the suite's tenths).
        Offline stages are CPU work: ``batches_in_flight``.

        Examples:
            >>> from aml_ray.config import ModelEndpoint
            >>> ep = ModelEndpoint(role="answer", base_url="http://m/v1", model="m", max_in_flight=32)
            >>> PipelineOptions().model_batch_for(ep), PipelineOptions().model_tasks_for(ep)
            (64, 4)
            >>> PipelineOptions().model_tasks_for(ModelEndpoint(role="answer", base_url="http://m/v1", model="m",
            ...                                                 max_in_flight=4))
            2
        """
        if endpoint.offline:
            return self.batches_in_flight
        batch = self.model_batch_for(endpoint)
        return max(2, min(self.batches_in_flight, -(-MODEL_ROUNDS_IN_FLIGHT * endpoint.max_in_flight // batch)))
