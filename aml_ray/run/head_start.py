"""Head start: the driver sends the first Adds while the pipeline's actors start.

A run waits seconds before its Ingest actor sends the first Add: the worker processes of the pipeline's
actors start first, CPU work on a small machine (docs/benchmarks.md). Nothing in an Add needs Ray, so
the driver sends them meanwhile, once Ray is up (no thread of the driver races ``ray.init``), with the
run's own :class:`~aml_ray.actors.participant.ParticipantClient` code (same auth, limits, retries and
contract checks) in a thread with its own event loop, and journals each finished Add in the sample's Add
journal (:class:`aml_ray.run.evidence.AddJournal`), the same rows the Ingest stage writes.

Where: on a cluster the run started itself (nobody else can reach it), and on a joined cluster once the
client registry grants it (:mod:`aml_ray.actors.shared`, the head start): the run's lease started the
version's shared client actor, which holds back all its in-flight slots until the handover, so another
job's requests through it wait and the declared in-flight limit holds across jobs. There the driver
prepares it once the pre-flight passed (:meth:`HeadStart.prepare`) and releases it when the grant comes
(:meth:`HeadStart.release`, from :func:`aml_ray.run.pipeline.run_pipeline`), or stops it when another job
holds that client.

Handover: the Ingest actor, before it reads a sample's journal, asks the run's tracker to take it over
(:meth:`aml_ray.run.progress.ProgressTracker.take_over`); the driver then stops the head start
(:meth:`HeadStart.hand_over`: no new Add) and releases every sample it has no Add of out; each other sample
is released as its last Add returns and is journalled. The Ingest stage goes on from the journals as a
resumed run does (each sample's finished chunks are skipped). One client owns a sample at a time, so no
Add is sent twice and each sample's Adds stay in order; the participant client actor holds back as many of
its in-flight slots as the head start may still have Adds out
(:meth:`~aml_ray.actors.participant.ParticipantClient.hold_back`), so the declared in-flight limit holds
across both. The participant always has the next Add: a one-at-a-time participant idled 20-80 ms at a
handover that waited for the head start's last Add before the Ingest stage sent its first.

What it sends: each sample's Adds up to its first Streaming step (all of them when the sample has no
Streaming step), so a step's Searches still see exactly the sessions before them; samples in input order,
up to ``samples_at_once`` of them at once (the pipeline's ``ingest_parallelism``), each in order. It
stops at the first Add that did not succeed: a failed Add (retries exhausted) is journalled as the Ingest
stage journals one, so it is evidence and counts in the run's outcome; an Add whose reply broke the
contract or had a status that is not retried is not journalled, so the Ingest stage sends it again and
stops the run with its evidence (a participant acknowledges a repeated request_id without a duplicate:
seeds, the Add contract).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from aml_ray.actors.participant import ParticipantClient, ParticipantSpec
from aml_ray.contract import AddRequest
from aml_ray.media import media_context
from aml_ray.run.evidence import AddJournal, RunDir
from aml_ray.run.inputs import PipelineInputs, read_sample_files, sample_questions
from aml_ray.stages.ingest import add_evidence_row, segments


class HeadStart:
    """The first Adds of a run, sent from the driver while Ray starts; stopped at the handover.

    Args:
        samples_at_once: samples sent at once (each sample's Adds stay in order).
        on_adds: called with the number of Adds journalled so far (each sample's journal included), from
            the head start's thread, after each one; for a progress display.

    Use: :meth:`start` once the inputs exist and the pre-flight passed; at the handover :meth:`hand_over`
    (sends nothing new, returns at once), then :meth:`stop` (idempotent, waits for the Adds in flight; after
    it, :meth:`start` sends nothing); :meth:`describe` for run.json.
    """

    def __init__(self, *, samples_at_once: int = 16, on_adds: Callable[[int], None] | None = None):
        self.samples_at_once = max(1, samples_at_once)
        self.on_adds = on_adds
        self.spec: ParticipantSpec | None = None
        self.inputs: PipelineInputs | None = None
        self.run_dir: RunDir | None = None
        self.lone_latencies: dict[str, float] | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the samples being added to, and the handover's callback
        self._adding: set[str] = set()  # samples with an Add out (or about to be sent): ids
        self._on_released: Callable[[str], None] | None = None
        self._client: ParticipantClient | None = None
        self._handover_t: float | None = None
        self._thread: threading.Thread | None = None
        # release(): the thread's loop and the event its samples wait on before their first Add
        self._released = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._go: asyncio.Event | None = None
        self._t0 = 0.0
        self.sent = 0  # Adds sent and journalled by the head start
        self.failed = 0  # of them, not ok
        self.samples: set[str] = set()  # samples it sent an Add of
        self.journalled = 0  # Adds in the journals of the samples it looked at (earlier ones included)
        self.ready = 0  # samples read and checked before the release (prepare)
        self.ended: str | None = None  # why it ended: "handover", "done" or the error that stopped it
        self.ran_s: float | None = None
        self.stop_wait_s: float | None = None

    @property
    def released(self) -> bool:
        """Whether :meth:`release` (or :meth:`start`) has been called."""
        with self._lock:
            return self._released

    def prepare(self, spec: ParticipantSpec, inputs: PipelineInputs, run_dir: RunDir, *,
                lone_latencies: dict[str, float] | None = None) -> HeadStart:
        """Start its daemon thread now, with nothing sent until :meth:`release`; returns ``self``.

        The thread makes the client and its connection pool, reads the first samples' files and checks
        their first Adds, then waits: called while the pre-flight's probe is out, all of that is done by
        the time it passes, and the first Add goes the moment :meth:`release` is called (at a one-at-a-time
        participant, the head start's set-up after the probe left it idle).

        Args:
            spec: the participant version (with the run's media limits for a multimodal run).
            inputs: the run's inputs (:func:`aml_ray.run.inputs.build_inputs`).
            run_dir: the run directory (the Add journals).
            lone_latencies: what :meth:`release` takes when it is given none (the pre-flight already passed).
        """
        self.spec, self.inputs, self.run_dir = spec, inputs, run_dir
        self.lone_latencies = lone_latencies
        if self._stop.is_set() or self._thread is not None:
            return self
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="aml-ray-head-start", daemon=True)
        self._thread.start()
        return self

    def release(self, lone_latencies: dict[str, float] | None = None) -> None:
        """Let a prepared head start send (the pre-flight passed); thread-safe, returns at once.

        Args:
            lone_latencies: the pre-flight probe's latencies
                (:meth:`aml_ray.run.preflight.PreflightReport.lone_latencies`) for the client's in-flight limit: it starts at 2 instead of sending one Add at a time
                until its first decision, so a stall of this process (the Ray start's imports hold the
                interpreter for tens of milliseconds) finds the next Add already at the participant.
                None: those given to :meth:`prepare`.
        """
        with self._lock:
            if self._released:
                return
            self._released = True
            if lone_latencies is not None:
                self.lone_latencies = lone_latencies
            loop = self._loop
        if loop is not None:  # else its thread sees _released when its loop starts (_main)
            try:
                loop.call_soon_threadsafe(self._begin)
            except RuntimeError:  # its loop has closed: the thread ended (stopped)
                pass

    def start(self, spec: ParticipantSpec, inputs: PipelineInputs, run_dir: RunDir, *,
              lone_latencies: dict[str, float] | None = None) -> HeadStart:
        """:meth:`prepare` and :meth:`release` at once: start sending ``inputs``' first Adds now; returns ``self``."""
        self.prepare(spec, inputs, run_dir)
        self.release(lone_latencies)
        return self

    def stop(self, reason: str | None = None) -> None:
        """Send no new Add and wait until the Adds in flight are journalled (the handover); a head start never
        released ends without sending, ``reason`` (if given) recorded as why it ended (:meth:`describe`)."""
        if reason is not None and self.ended is None:
            self.ended = reason
        self._stop.set()
        self._wake()
        if self._thread is None:
            return
        t = self._handover_t or time.perf_counter()
        self._thread.join()
        if self.stop_wait_s is None:
            self.stop_wait_s = round(time.perf_counter() - t, 3)

    def hand_over(self, on_released: Callable[[str], None]) -> tuple[list[str], dict[str, Any] | None]:
        """Send no new Add, without waiting: the start of the handover (module docstring).

        Args:
            on_released: called with a sample's id, from the head start's thread, as the last Add it had out
                of that sample returns and is journalled (for each sample returned as still being added to).

        Returns:
            ``(samples still being added to, client state)``: the ids of the samples with an Add out (or
            about to go: at most one each), and ``{"limit": its in-flight limit now, "lone_latencies"}``
            for the Ingest stage's client (:meth:`~aml_ray.actors.participant.ParticipantClient.hold_back`),
            None when the head start never started sending. Every other sample can be taken over now.
        """
        with self._lock:
            self._handover_t = self._handover_t or time.perf_counter()
            self._on_released = on_released
            self._stop.set()
            adding = sorted(self._adding)
            client = self._client
        self._wake()
        state = None if client is None else {"limit": client.limit.allowed(), "lone_latencies": self.lone_latencies}
        return adding, state

    def wait(self) -> None:
        """Wait until its thread has ended (after :meth:`hand_over` or :meth:`stop`, or once it sent all it
        sends), without stopping it; at once when it never started."""
        if self._thread is not None:
            self._thread.join()

    def running(self) -> bool:
        """Whether its thread is still sending or waiting for an Add."""
        return self._thread is not None and self._thread.is_alive()

    def describe(self) -> dict[str, Any]:
        """What the head start did, for run.json: ``{"adds", "failed", "samples", "ran_s", "stop_wait_s", "ended"}``
        (``ran_s``: seconds from its start to its end; ``stop_wait_s``: from the handover's start,
        :meth:`hand_over` or :meth:`stop`, to its last Add journalled)."""
        return {"adds": self.sent, "failed": self.failed, "samples": len(self.samples), "ran_s": self.ran_s,
                "stop_wait_s": self.stop_wait_s, "ended": self.ended}

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
            ended = ("handover" if self._released else "stopped before the pre-flight passed") \
                if self._stop.is_set() else "done"
            self.ended = self.ended or ended
        except Exception as exc:  # noqa: BLE001 - the Ingest stage sends the Add again and reports its error
            self.ended = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            self.ran_s = round(time.perf_counter() - self._t0, 3)

    def _wake(self) -> None:
        """Wake the samples waiting for :meth:`release` (they see the stop and end)."""
        with self._lock:
            loop, go = self._loop, self._go
        if loop is not None and go is not None:
            try:
                loop.call_soon_threadsafe(go.set)
            except RuntimeError:  # its loop has closed: the thread ended
                pass

    def _begin(self) -> None:
        """In its loop, once (:meth:`release`): seed the client with the probe's latencies, then let the samples
        send."""
        if self._go is None or self._go.is_set():
            return
        if self.lone_latencies and not self._stop.is_set():
            self._client.seed(self.lone_latencies)
        self._go.set()

    async def _main(self) -> None:
        go = asyncio.Event()
        client = self._client = ParticipantClient(self.spec)
        client.open()
        with self._lock:
            self._loop, self._go = asyncio.get_running_loop(), go
            released = self._released
        if released:
            self._begin()
        elif self._stop.is_set():
            go.set()
        slots = asyncio.Semaphore(self.samples_at_once)

        async def one(path: str) -> None:
            async with slots:
                if not self._stop.is_set():
                    await self._sample(client, path, go)

        try:
            async with asyncio.TaskGroup() as group:
                for path in self.inputs.sample_paths():
                    group.create_task(one(path))
        except BaseExceptionGroup as failed:
            raise failed.exceptions[0] from None
        finally:
            await client.aclose()

    async def _sample(self, client: ParticipantClient, path: str, go: asyncio.Event) -> None:
        """One sample's Adds up to its first Streaming step, in order, each journalled as it returns; read and
        checked before ``go`` (:meth:`release`), sent after it."""
        table = read_sample_files([path])
        row = table.drop_columns(["questions"]).to_pylist()[0]
        sid = row["sample_id"]
        adds, meta = json.loads(row["adds_json"]), json.loads(row["add_meta_json"])
        steps = {s for s in sample_questions(table).column("step").to_pylist() if s is not None}
        first = segments(meta, steps)[0][0] if meta else []
        ctx = media_context(self.spec.media)
        requests = {p: AddRequest.model_validate(adds[p], context=ctx) for p in first}
        journal = AddJournal(self.run_dir, sid)
        done = {r["chunk_index"] for r in journal.rows()}
        self.ready += 1
        await go.wait()
        with self._lock:  # from here to its last Add's return, the sample is the head start's (hand_over)
            if self._stop.is_set():
                return
            self._adding.add(sid)
        try:
            await self._add_first(client, sid, first, adds, meta, requests, journal, done)
        finally:
            with self._lock:
                self._adding.discard(sid)
                released = self._on_released
            if released is not None:
                released(sid)

    async def _add_first(self, client: ParticipantClient, sid: str, first: list[int], adds: list[dict],
                         meta: list[dict], requests: dict[int, AddRequest], journal: AddJournal,
                         done: set[int]) -> None:
        """Sample ``sid``'s Adds at positions ``first`` (``requests``: each one's checked request), in order, each
        journalled in ``journal``; those in ``done`` (chunk indexes already journalled) skipped."""
        self.journalled += len(done)
        for p in first:
            if self._stop.is_set():
                return
            if meta[p]["chunk_index"] in done:
                continue
            self.samples.add(sid)
            outcome = await client.add(requests[p])
            journal.append(add_evidence_row(sid, adds[p], meta[p], outcome))
            self.sent += 1
            self.journalled += 1
            if self.on_adds is not None:
                self.on_adds(self.journalled)
            if outcome["status"] != "ok":  # the failure budget and the run's error are the pipeline's
                self.failed += 1
                self.ended = f"an Add failed: {outcome.get('error')}"[:300]
                self._stop.set()
                return
