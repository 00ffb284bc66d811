"""A single-stage job's Ingest in the calling process: the stage on an event loop in a thread of its own.

A job that runs in a Ray actor of its own (a suite's :class:`~aml_ray.run.bundle_runner.BundleRunner`, the
service's :class:`~aml_ray.serve_app.job_actor.JobActor`) already has a worker process that mostly waits on
the stage. Running the Ingest stage there, rather than in an Ingest actor of its own, spares a worker
process per job: its start (about 0.7 s of CPU for Ray's worker and the stage's imports, which the job's
process has already made) and its place in the raylet's queue of worker starts, which starts two at a time on
2 cores (docs/benchmarks.md); and each task's rows reach the job without the object store's copy.

The stage (:class:`~aml_ray.stages.IngestFromFiles`) is the one the actor would run, called as the actor
would call it: at most ``in_flight`` tasks at once (the actor's ``max_concurrency``), each task's rows given
back as it ends. The participant's and the models' clients stay the cluster's shared actors
(:mod:`aml_ray.actors.shared`), so the declared limits hold as before.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from aml_ray.stages import IngestFromFiles

#: Seconds :meth:`LocalIngest.close` waits for the cancelled tasks to end before it stops the loop.
CLOSE_WAIT_S = 5.0


class LocalIngest:
    """The Ingest stage of one job, on an asyncio loop in a daemon thread of this process.

    Args:
        ingest_kwargs: :class:`~aml_ray.stages.IngestFromFiles`'s constructor arguments (no ``progress_here``:
            the run's tracker is the cluster's progress hub or none).
        in_flight: tasks run at once (each takes a slot of a semaphore; the others wait for one).

    Raises:
        ValueError: ``in_flight`` below 1; or the stage's constructor's own error.
    """

    def __init__(self, ingest_kwargs: dict[str, Any], *, in_flight: int) -> None:
        if in_flight < 1:
            raise ValueError(f"in_flight: {in_flight}; give 1 or more tasks at once")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="aml-ray-ingest", daemon=True)
        self._thread.start()
        try:
            self._stage, self._slots = self._submit(self._build(ingest_kwargs, in_flight)).result()
        except BaseException:
            self.close()
            raise

    @staticmethod
    async def _build(ingest_kwargs: dict[str, Any], in_flight: int) -> tuple[IngestFromFiles, asyncio.Semaphore]:
        return IngestFromFiles(**ingest_kwargs), asyncio.Semaphore(in_flight)

    def _submit(self, coro) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def _task(self, paths: list[str]) -> pa.Table:
        async with self._slots:
            return await self._stage.ingest(pa.table({"path": paths}))

    def run(self, blocks: list[list[str]]) -> Iterator[pa.Table]:
        """Run one task per block of sample file paths; yield each task's rows in the order the tasks end.

        Closing the generator early (an error, Ctrl-C) cancels the tasks left.

        Raises:
            Exception: a task's own error (a participant's structured cause is in the run's tracker).
        """
        pending = {self._submit(self._task(paths)) for paths in blocks}
        try:
            while pending:  # a timeout: a Ctrl-C in this thread gets through
                done, pending = concurrent.futures.wait(pending, timeout=1.0,
                                                        return_when=concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    yield future.result()
        finally:
            for future in pending:
                future.cancel()

    def close(self) -> None:
        """Cancel every task still on the loop, wait up to :data:`CLOSE_WAIT_S` for them to end, then stop the
        loop and its thread. Closing twice is a no-op."""
        if self._loop.is_closed():
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=CLOSE_WAIT_S)

        if self._thread.is_alive():
            try:
                self._submit(cancel_all()).result(timeout=CLOSE_WAIT_S + 1)
            except (concurrent.futures.TimeoutError, RuntimeError):
                pass  # a task that ignores its cancellation: the loop stops under it
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=CLOSE_WAIT_S)
        if not self._thread.is_alive():
            self._loop.close()
