"""Ingest stage: one sample's Adds, in order, journalled one by one; then that sample's Searches.

A sample's questions are searched as soon as its Adds are done, by the same task (DESIGN.md: "a
sample's questions enter Search as soon as that sample's Adds are done"), in one ParticipantClient call
(in two, sent at once, when the offline models run here: :data:`ANSWERED_LAST_ROWS`), and leave this
stage searched. Search is not a Ray Data operator of its own: a separate Search stage cost CPU per
question (a second copy of every row through the object store and an actor) and an actor start
(measured: docs/benchmarks.md), on a path where the participant's latency should be the only cost.

Head start (:mod:`aml_ray.run.head_start`): the driver sends the first Adds while the pipeline's actors
start; before its first sample this stage waits for them to be journalled
(:meth:`aml_ray.run.progress.ProgressTracker.take_over`) and goes on from the journals.

Resume: the sample's Add journal (``evidence/adds/<sample>.jsonl``) says which chunks already finished;
only the others are sent. A sample whose Parquet evidence exists sends no Add at all. The journals become
Parquet evidence when the run's traffic is over (:func:`aml_ray.run.evidence.finish_add_journals`, by the
driver), not here: a Parquet write per sample on this event loop took CPU from the participant client.

Streaming mode: questions that carry a ``step`` (the number of the sample's sessions added before they
are asked) are searched here, right after the Adds of their step returned and before the next Add is
sent, so each step sees exactly the memory written so far (DESIGN.md "Streaming mode").

Models here (``models``): the answer and judge models run in this actor, on each sample's searched rows,
instead of as a Ray Data operator of their own: a job is one actor, started with no Ray Data executor
beside it. A model stage's actor cost a worker process start, and Ray Data its executor's helpers
and per-batch work (docs/benchmarks.md); on a small machine, a suite's or many participants' worker
starts delay the first model call by seconds. Their imports and the tokenizer load in a thread started
with the actor, beside its first Adds.

- Offline models (``judge_slice_rows`` None) are CPU work (0.03 ms a question for the answer): each of a
  sample's two parts is answered and judged as its Searches return, inside the sample's slot.
- Online models (``judge_slice_rows`` a number): the sample gives its slot back once searched, so the next
  sample's Adds go while its rows wait for the models; its rows then go through
  :class:`~aml_ray.stages.answer_judge.AnswerJudgeStage` (each slice judged as soon as it is answered).
  The model clients' actors hold the models' limits, as they do for a Ray Data operator.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import threading
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa

from aml_ray.run.evidence import AddJournal, RunDir, StopLog
from aml_ray.run.inputs import SAMPLE_INPUT_SCHEMA, read_sample_files, sample_questions
from aml_ray.run.ray_runtime import tune_actor_process, use_arrow_ipc_serialization
from aml_ray.run.progress import InProcess, ProgressBuffer, ProgressTracker
from aml_ray.run.outcome import FailureBudget
from aml_ray.stages._common import StageStopped, searched_questions, stop_on
from aml_ray.stages.search import search_rows

#: The concurrency group of :meth:`IngestStage.progress` on a single-stage Ingest actor that holds the tracker
#: (its size: the driver's calls that may wait at once, the hand-over's ``wait_wanted`` among them).
PROGRESS_GROUP = "progress"
PROGRESS_GROUP_SIZE = 4
#: When the offline models run in this actor, a sample's last questions, this many, are searched in a call of
#: their own, sent with the call of the others: the others are answered and judged while these Searches are
#: still out, so after the run's last Search only these rows are left to answer.
#: One call more per sample, not one per part: each costs the client and Ingest actors CPU.
ANSWERED_LAST_ROWS = 16


def add_evidence_row(sample_id: str, add: dict[str, Any], meta: dict[str, Any], o: dict[str, Any]) -> dict[str, Any]:
    """One finished Add's journal row (:data:`aml_ray.run.evidence.ADD_SCHEMA`) from its AddRequest dict ``add``,
    its chunk metadata ``meta`` and the client's outcome ``o`` (:meth:`~aml_ray.actors.participant.ParticipantClient.add`)."""
    return {"sample_id": sample_id, "chunk_index": meta["chunk_index"], "n_words": meta["n_words"],
            "request_id": add["request_id"], "user_id": add["user_id"], "session_id": add["session_id"],
            "n_messages": len(add["messages"]), "request_sha256": o["request_sha256"], "status": o["status"],
            "http_status": o["http_status"], "attempts": o["attempts"], "retried_statuses": o["retried_statuses"],
            "latency_ms": o["latency_ms"], "elapsed_ms": o["elapsed_ms"], "queue_ms": o.get("queue_ms"),
            "contract": "ok" if o["status"] == "ok" else None, "error": o["error"], "turn_ids": meta.get("turn_ids")}


def _take(table: pa.Table, positions: list[int]) -> pa.Table:
    """``table``'s rows at ``positions`` (typed indices: an empty list has no type to infer).

    All rows in order (a sample without Streaming steps, the usual case) give ``table`` itself, with no
    copy of its columns.
    """
    if len(positions) == table.num_rows and all(i == p for i, p in enumerate(positions)):
        return table
    return table.take(pa.array(positions, pa.int64()))


def segments(meta: list[dict[str, Any]], steps: set[int]) -> list[tuple[list[int], int | None]]:
    """Split chunk positions at Streaming steps.

    Args:
        meta: per-chunk metadata in order, each with ``session_index`` (1-based session position).
        steps: session counts after which questions are asked.

    Returns:
        ``[(chunk positions, step or None), ...]``: each segment ends where a step's sessions end; the
        last segment's step is None when no question waits at its end.
    """
    out: list[tuple[list[int], int | None]] = []
    current: list[int] = []
    for i, m in enumerate(meta):
        current.append(i)
        last_of_session = i + 1 == len(meta) or meta[i + 1]["session_index"] != m["session_index"]
        if last_of_session and m["session_index"] in steps:
            out.append((current, m["session_index"]))
            current = []
    if current:
        out.append((current, None))
    return out


class IngestStage:
    """Adds one sample's chunks in order, journals their evidence, searches its questions, emits them.

    Input rows: ``{sample_id, adds_json, add_meta_json, questions}`` (:data:`aml_ray.run.inputs.SAMPLE_INPUT_SCHEMA`):
    the ordered AddRequest dicts, their metadata (chunk_index, n_words, session_index) and the sample's
    pending questions; one
    row per sample, several samples per task when samples are many (one Ray Data task costs the actor
    and the driver milliseconds of CPU, measured with ``scripts/bench_pipeline.py``). Output: the
    task's question rows, searched, one table.

    Args:
        participant: the ``ParticipantClient`` actor handle.
        run_root: the run directory (Add evidence goes to ``evidence/adds/<sample_id>.*``; on a multi-node
            cluster it must be storage every node sees).
        top_k: Top K sent with every Search.
        tracker: optional ``ProgressTracker`` actor handle.
        final: a retrieval-only run ends here: each question row also gets its final ``status``
            (:func:`aml_ray.stages._common.searched_questions`).
        samples_at_once: at most this many samples in progress in this actor across its tasks (each
            task's samples run at once; :attr:`aml_ray.run.pipeline.PipelineOptions.samples_per_task`); None:
            no actor-wide limit (the tasks' own count bounds it).
        models: ``(answer_kwargs, judge_kwargs)``, the constructor arguments of
            :class:`~aml_ray.stages.answer.AnswerStage` and :class:`~aml_ray.stages.judge_stage.JudgeStage`:
            each task's rows leave this stage answered and judged (see the module docstring). None: they
            leave searched.
        judge_slice_rows: None: ``models`` are answered and judged in the sample's slot, on each of its
            parts (offline models); a number: after the slot, by
            :class:`~aml_ray.stages.answer_judge.AnswerJudgeStage` in slices of this many rows (online models).
        progress_here: the run's :class:`~aml_ray.run.progress.ProgressTracker` is held by this actor, made
            with these constructor arguments (``tracker`` must be None): a private cluster's single-stage
            run, one Ray worker process less (:mod:`aml_ray.run.progress`); the driver calls it through
            :meth:`progress`, the stages of ``models`` report to it.
    """

    def __init__(self, participant, run_root: str, top_k: int = 100, tracker=None, final: bool = False,
                 samples_at_once: int | None = None, models: tuple[dict, dict] | None = None,
                 judge_slice_rows: int | None = None, progress_here: dict[str, Any] | None = None):
        use_arrow_ipc_serialization()
        tune_actor_process()
        self._progress_here: ProgressTracker | None = None
        if progress_here is not None:
            if tracker is not None:
                raise ValueError("progress_here: this actor holds the tracker; give no tracker handle as well")
            self._progress_here = ProgressTracker(**progress_here)
            tracker = InProcess(self._progress_here)
            if models is not None:  # their stages report to the tracker held here
                models = tuple({**kwargs, "tracker": tracker} for kwargs in models)
        self.participant = participant
        self.run_dir = RunDir(Path(run_root))
        self.top_k = top_k
        self.tracker = tracker
        self.progress = ProgressBuffer(tracker)  # sent at the end of each task (__call__) or every 0.5 s
        self.final = final
        self.samples_at_once = samples_at_once
        # one Ingest actor sends every Add and Search of the run (pool size 1): it holds the run's budget
        self.budget = FailureBudget()
        self._journalled: dict[str, int] = {}  # sample -> its Adds in the journal (a resumed run's included)
        self._slots: asyncio.Semaphore | None = None  # made in the UDF's event loop (first call)
        self._taken_over = False  # the driver's head start handed its Adds over (ProgressTracker.take_over)
        self._models: list | None = None  # the Answer and Judge stages, built by _loading
        self._models_error: BaseException | None = None
        self._models_ready = threading.Event()  # _models or _models_error is set: answering may start
        self._loading: threading.Thread | None = None
        self._answers_after_slot = models is not None and judge_slice_rows is not None
        if models is not None:
            self._loading = threading.Thread(target=self._load_models, args=(*models, judge_slice_rows),
                                             daemon=True, name="models")
            self._loading.start()

    def _load_models(self, answer: dict[str, Any], judge: dict[str, Any], slice_rows: int | None) -> None:
        """Build the Answer and Judge stages (one :class:`~aml_ray.stages.answer_judge.AnswerJudgeStage` when
        ``slice_rows`` is a number) and warm them while the Adds run: the answer's tokenizer
        (:meth:`AnswerStage.warm <aml_ray.stages.answer.AnswerStage.warm>`, about 0.4 s of CPU), then, once the
        stages are ready to answer, the judge's nltk imports (:meth:`JudgeStage.warm
        <aml_ray.stages.judge_stage.JudgeStage.warm>`, about 0.3 s), which the first judgement needs only after
        the first answer's round trip. On 2 cores, with many jobs' actors starting at once, waiting for both
        held each job's first model call 1.5-3.6 s after its stages were built (docs/benchmarks.md).

        An error building the stages or warming the answer is raised by the first task that needs them; one
        in the judge's warm-up is raised again by the first judgement (the same imports)."""
        try:
            if slice_rows is not None:
                from aml_ray.stages.answer_judge import AnswerJudgeStage

                both = AnswerJudgeStage(answer, judge, slice_rows)
                stages: list = [both]
                answer_stage, judge_stage = both.answer, both.judge
            else:
                from aml_ray.stages.answer import AnswerStage
                from aml_ray.stages.judge_stage import JudgeStage

                answer_stage, judge_stage = AnswerStage(**answer), JudgeStage(**judge)
                stages = [answer_stage, judge_stage]
            answer_stage.warm()
            self._models = stages
        except BaseException as exc:  # noqa: BLE001 - raised by the first task that needs them
            self._models_error = exc
            return
        finally:
            self._models_ready.set()
        with contextlib.suppress(Exception):  # raised again where the judge first needs these imports
            judge_stage.warm()

    async def _answered_and_judged(self, table: pa.Table) -> pa.Table:
        """Searched question rows through the Answer and Judge stages (``models``)."""
        assert self._loading is not None
        if not self._models_ready.is_set():
            await asyncio.to_thread(self._models_ready.wait)
        if self._models_error is not None:
            raise self._models_error
        assert self._models is not None
        for stage in self._models:
            table = await stage(table)
        return table

    async def _add(self, sample_id: str, journal: AddJournal, adds: list[dict], meta: list[dict]) -> None:
        """Send ``adds`` in order through the client, journalling each outcome as it arrives.

        Several Adds go in one streaming call (:meth:`~aml_ray.actors.participant.ParticipantClient.add_stream`),
        so each is journalled as soon as it returned; a single Add goes in a plain call
        (:meth:`~aml_ray.actors.participant.ParticipantClient.add_sample`), which journals it just as
        soon and costs the client actor less CPU (measured: docs/benchmarks.md).
        """
        if not adds:
            return
        token = uuid.uuid4().hex
        try:
            if len(adds) == 1:
                for outcome in await self.participant.add_sample.remote(adds, sample_id, token):
                    await self._journal(journal, add_evidence_row(sample_id, adds[0], meta[0], outcome))
                return
            i = 0
            async for ref in self.participant.add_stream.remote(adds, sample_id, token):
                outcome = await ref
                await self._journal(journal, add_evidence_row(sample_id, adds[i], meta[i], outcome))
                i += 1
        except Exception as exc:
            def record(outcome: dict[str, Any]) -> str | None:
                """The Add that stopped the run: its row, with the violation, in evidence/stopped/ (not the
                journal, which holds finished Adds: a resumed run sends this one again)."""
                j = next((k for k, a in enumerate(adds) if a["request_id"] == outcome["request_id"]), None)
                if j is None:
                    return None
                row = {**add_evidence_row(sample_id, adds[j], meta[j], outcome), "contract": outcome["contract"]}
                return StopLog(self.run_dir).append("add", row)

            await stop_on(exc, self.tracker, record)
            raise

    async def _journal(self, journal: AddJournal, row: dict[str, Any]) -> None:
        """Journal one Add's evidence row, report it as done (failed ones too, counted apart), and count it
        against the failure budget."""
        journal.append(row)
        sid = row["sample_id"]
        self._journalled[sid] = self._journalled.get(sid, 0) + 1
        self.progress.total("add", sid, self._journalled[sid])
        ok = row["status"] == "ok"
        if not ok:
            self.progress.incr("add_failed", 1)
        self.budget.record("add", ok, http_status=row["http_status"], request_id=row["request_id"],
                           error=row["error"])
        await self._check_budget()

    async def _count_searches(self, search: pa.Table, questions: pa.Table) -> None:
        """Count a group's Searches against the failure budget (``search``: its Search columns, in order)."""
        statuses = search.column("search_status").to_pylist()
        failed = [i for i, s in enumerate(statuses) if s != "ok"]
        if not failed:
            self.budget.stages["search"].ok += len(statuses)  # the common case: no Python call per Search
            return
        self.progress.incr("search_failed", len(failed))
        http, errors = search.column("search_http_status").to_pylist(), search.column("search_error").to_pylist()
        refs = questions.column("ref").to_pylist()
        for i, status in enumerate(statuses):
            self.budget.record("search", status == "ok", http_status=http[i], request_id=refs[i], error=errors[i])
        await self._check_budget()

    async def _count_journalled(self, rows: list[dict[str, Any]]) -> None:
        """Count a sample's Adds already in its journal against the failure budget, and its failed ones in the
        progress: the budget is the run's
        (:func:`aml_ray.run.outcome.run_outcome` judges the same evidence at the end), whichever client sent
        them (the driver's head start, a resumed run's earlier attempt)."""
        if not rows:
            return
        for row in rows:
            self.budget.record("add", row["status"] == "ok", http_status=row.get("http_status"),
                               request_id=row.get("request_id"), error=row.get("error"))
        failed = sum(row["status"] != "ok" for row in rows)
        if failed:  # as the sample's Add total counts them (a progress total, not this run's share)
            self.progress.incr("add_failed", failed)
        await self._check_budget()

    async def _check_budget(self) -> None:
        """Stop the run when the failure budget is exceeded (:mod:`aml_ray.run.outcome`): the failure goes to
        the tracker (the driver's error summary), then :class:`~aml_ray.stages._common.StageStopped` is raised."""
        stage = self.budget.exceeded()
        if stage is None:
            return
        if self.tracker is not None:
            await self.tracker.record_failure.remote(self.budget.failure(stage))
        raise StageStopped(self.budget.summary(stage))

    async def __call__(self, batch: pa.Table) -> pa.Table:
        # A task's samples run at once, each holding one of the actor's sample slots while it runs; the
        # table goes out when the last one is done. A failing sample cancels the others (TaskGroup).
        if self.samples_at_once is not None and self._slots is None:
            self._slots = asyncio.Semaphore(self.samples_at_once)
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self._held(row)) for row in batch.to_pylist()]
        except BaseExceptionGroup as failed:  # the first sample's error, as a one-sample task raises it
            raise failed.exceptions[0] from None
        finally:
            self.progress.flush()
        return pa.concat_tables([t.result() for t in tasks])

    async def ingest(self, batch: pa.Table) -> pa.Table:
        """One task, as :meth:`__call__` runs it for Ray Data: the entry point of a plain Ray actor of this
        class (a single-stage job: :func:`aml_ray.run.pipeline._single_stage`)."""
        return await self(batch)

    async def progress(self, method: str, *args: Any) -> Any:
        """The driver's call of ``method`` (``snapshot``, ``failure``, ``wait_wanted``, ``release``) on the tracker
        this actor holds (``progress_here``); called in the actor's :data:`PROGRESS_GROUP` concurrency group,
        so it never waits for one of the Ingest tasks' slots (:func:`aml_ray.run.pipeline._single_stage`).

        Raises:
            RuntimeError: this actor holds no tracker.
        """
        if self._progress_here is None:
            raise RuntimeError("this Ingest actor holds no progress tracker (progress_here was not given)")
        result = getattr(self._progress_here, method)(*args)
        return await result if inspect.isawaitable(result) else result

    async def _held(self, row: dict[str, Any]) -> pa.Table:
        async with self._slots or contextlib.nullcontext():  # read only once it runs: a queued sample holds no memory
            sample = self._load(row)
            await self._take_over(sample["sample_id"])
            rows = await self._sample(sample)
        # online models: the slot is the next sample's while these rows wait for them
        return await self._answered_and_judged(rows) if self._answers_after_slot else rows

    async def _take_over(self, sample_id: str) -> None:
        """Before the sample's journal is read: wait while the driver's head start still has an Add of it out
        (:meth:`aml_ray.run.progress.ProgressTracker.take_over`); once the head start ended, ask no more."""
        if not self._taken_over and self.tracker is not None:
            self._taken_over = await self.tracker.take_over.remote(sample_id)

    async def _search(self, questions: pa.Table, media_root: str) -> pa.Table:
        """Search ``questions`` (:func:`~aml_ray.stages.search.search_rows`) and count them against the budget."""
        search = await search_rows(self.participant, questions, self.top_k, self.tracker, media_root=media_root,
                                   run_dir=self.run_dir)
        await self._count_searches(search, questions)
        return search

    async def _searched(self, questions: pa.Table, media_root: str) -> pa.Table:
        """``questions`` searched (:meth:`_search`) as question rows, answered and judged when the offline
        models run here."""
        rows = searched_questions(questions, await self._search(questions, media_root), final=self.final)
        return rows if not self._answers_in_slot else await self._answered_and_judged(rows)

    @property
    def _answers_in_slot(self) -> bool:
        """The models run here and answer a sample's parts in its slot (offline models)."""
        return self._loading is not None and not self._answers_after_slot

    async def _searched_in_parts(self, questions: pa.Table, media_root: str) -> list[pa.Table]:
        """:meth:`_searched` of ``questions``: when the offline models run here, in two calls sent at once, the
        last :data:`ANSWERED_LAST_ROWS` questions in the second (the first part is answered while those are
        out; the client serves the calls in the order sent), else in one call. Returns the parts' rows in
        order."""
        if not self._answers_in_slot or questions.num_rows <= ANSWERED_LAST_ROWS:
            return [await self._searched(questions, media_root)]
        split = questions.num_rows - ANSWERED_LAST_ROWS
        try:
            async with asyncio.TaskGroup() as group:
                parts = [group.create_task(self._searched(part, media_root))
                         for part in (questions.slice(0, split), questions.slice(split))]
        except BaseExceptionGroup as failed:  # the first part's error, as one call raises it
            raise failed.exceptions[0] from None
        return [part.result() for part in parts]

    def _load(self, row: dict[str, Any]) -> dict[str, Any]:
        """The sample's input row from the task's row, its ``questions`` as a table (:func:`~aml_ray.run.inputs.sample_questions`)."""
        return {**row, "questions": sample_questions(pa.Table.from_pylist([row], schema=SAMPLE_INPUT_SCHEMA))}

    async def _sample(self, row: dict[str, Any]) -> pa.Table:
        """One sample: its Adds in order (journalled; Streaming steps searched between them), its Searches.

        Returns its question rows (``QUESTION_SCHEMA``): a Streaming step's questions in step order, then
        the others, each in input order.
        """
        sid = row["sample_id"]
        adds, meta = json.loads(row["adds_json"]), json.loads(row["add_meta_json"])
        questions: pa.Table = row["questions"]
        journal = AddJournal(self.run_dir, sid)
        earlier = journal.rows()  # Adds the head start or an earlier attempt of the run sent and journalled
        done = {r["chunk_index"] for r in earlier}
        await self._count_journalled(earlier)
        steps = questions.column("step").to_pylist()
        by_step: dict[int, list[int]] = {}  # step -> its questions' positions
        for i, step in enumerate(steps):
            if step is not None:
                by_step.setdefault(step, []).append(i)
        searched: list[pa.Table] = []  # question rows, a Streaming step's, then the others
        media_root = str(self.run_dir.media)
        n_done = len(done)
        self._journalled[sid] = n_done
        for positions, step in segments(meta, set(by_step)):
            todo = [p for p in positions if meta[p]["chunk_index"] not in done]
            await self._add(sid, journal, [adds[p] for p in todo], [meta[p] for p in todo])
            n_done += len(todo)
            # the sample's total, not this run's share: a re-run sample (restarted actor, resume) counts once
            self.progress.total("add", sid, n_done)
            if step is not None:
                searched.append(await self._searched(_take(questions, by_step[step]), media_root))
        asked = [i for i, step in enumerate(steps) if step is None]
        searched.extend(await self._searched_in_parts(_take(questions, asked), media_root))
        self.progress.incr("search", len(steps))
        return pa.concat_tables(searched)


class IngestFromFiles(IngestStage):
    """:class:`~aml_ray.stages.IngestStage` fed with sample file paths: reads each sample's row in the actor.

    Input rows: ``{path}``, one sample's input file (:mod:`aml_ray.run.inputs`). Reading in the Ingest actor
    (milliseconds per sample) needs no read tasks: no extra worker processes and no CPU ask. Ray Data's
    ``read_parquet`` (ray 2.60) samples files with 1-CPU tasks, starts footer-reader actors and read tasks
    that each need CPU to be placed (a whole CPU can never be had on a 1-CPU node whose stage actors hold
    0.1 each: docs/ray-notes.md, and the ds.repartition stall noted in :func:`aml_ray.run.pipeline.run_pipeline`); it
    added two worker processes and their memory (measured: docs/benchmarks.md). Arguments as IngestStage's.

    It lives here, not in :mod:`aml_ray.run.pipeline`: a Ray worker imports the module of the class it runs,
    and the pipeline module pulls in the model clients (the openai SDK) and polars, seconds of CPU per
    worker start on 2 cores that the first Searches would share.
    """

    def _load(self, row: dict[str, Any]) -> dict[str, Any]:
        table = read_sample_files([row["path"]])
        return {**table.drop_columns(["questions"]).to_pylist()[0], "questions": sample_questions(table)}
