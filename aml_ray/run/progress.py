"""Progress counters shared by the pipeline's stages and read by the driver's display.

Stages report with a fire-and-forget ``tracker.incr.remote(stage, n)`` once per batch (never per row);
the Ingest stage reports a sample's finished Adds in all (``set_done("add", sample, n)``), so a sample
that runs again (its actor restarted after a node loss, or a resumed run) is counted once. The Ingest
stage reports several samples a task and sends them through a :class:`ProgressBuffer`: one call per task
or per half second instead of two per sample.

Where the tracker lives: in the cluster's progress hub, one actor on the head node holding every job's
tracker (:mod:`aml_ray.actors.progress_hub`; it survives a worker node's loss); or, in a private cluster's
single-stage run, inside the Ingest actor (:class:`InProcess` there; the driver
calls it in that actor's ``progress`` concurrency group, :meth:`aml_ray.stages.ingest.IngestStage.progress`):
one Ray worker process less, which costs about 1 % of a core while the run lasts, Ray's 10 ms signal check
in every worker process, and a second of CPU to start (docs/ray-notes.md). It is thread-safe for
that: the driver's calls run on that group's event loop thread, the stage's on the actor's own.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any


class ProgressTracker:
    """Counts finished units per stage (``add``, ``search``, ``answer``, ``judge``); a Ray actor at run time.

    Args:
        head_start: the driver's head start is sending Adds (:mod:`aml_ray.run.head_start`): the Ingest
            stage's :meth:`take_over` of a sample waits for the driver's :meth:`release` of it.

    It also keeps the first stage failure (a contract error or a non-retryable participant status) as
    plain data, because Ray Data re-wraps UDF exceptions as text and the driver must still name the field.
    Thread-safe (module docstring): its counts under a lock, the hand-over's two signals threading events.
    """

    def __init__(self, head_start: bool = False) -> None:
        self._lock = threading.Lock()
        self._done: Counter[str] = Counter()
        self._keyed: dict[tuple[str, str], int] = {}
        self._failure: dict | None = None
        self._wanted = threading.Event()  # the Ingest stage asked to take over
        self._released = threading.Event()  # the head start ended: every sample's Adds are journalled
        self._handover = threading.Condition()  # signals a release (all, or every sample but ``_kept``)
        self._kept: set[str] | None = None  # samples the head start still has an Add of out (release's keep)
        if not head_start:  # no head start sends Adds (aml_ray.run.head_start): nothing to wait for
            self._released.set()

    async def take_over(self, sample: str | None = None) -> bool:
        """The Ingest stage's call before it reads a sample's Add journal: returns once the head start (if any)
        has no Add of ``sample`` out any more (:meth:`release`), at once when there is none. ``None``: once
        the head start ended. Returns whether it ended (no later call needs to ask)."""
        if not self.ask_to_take_over(sample):
            await asyncio.to_thread(self._wait_released, sample)
        return self.ended()

    def ask_to_take_over(self, sample: str | None = None) -> bool:
        """:meth:`take_over` without the wait: ask to take over, and return whether ``sample`` may go on now
        (``None``: whether the head start ended). For a host that waits without holding a thread
        (:class:`aml_ray.actors.progress_hub.ProgressHub`)."""
        if self._released.is_set():
            return True
        self._wanted.set()
        with self._handover:
            return self._may_go_on(sample)

    def ended(self) -> bool:
        """Whether the head start ended (every sample released; always True without a head start)."""
        return self._released.is_set()

    def wanted(self) -> bool:
        """Whether the Ingest stage asked to take over (:meth:`wait_wanted` without the wait)."""
        return self._wanted.is_set()

    def _may_go_on(self, sample: str | None) -> bool:
        return self._released.is_set() or (sample is not None and self._kept is not None and sample not in self._kept)

    def _wait_released(self, sample: str | None) -> None:
        with self._handover:
            self._handover.wait_for(lambda: self._may_go_on(sample))

    async def wait_wanted(self) -> None:
        """The driver's call: returns once the Ingest stage asked to take over (:meth:`take_over`)."""
        await asyncio.to_thread(self._wanted.wait)

    def release(self, keep: list[str] | None = None) -> None:
        """The driver's call at the handover: every sample but those in ``keep`` (the head start still has an
        Add of each out) goes on in the Ingest stage (:meth:`take_over`); ``None``: all, the head start ended.
        Each call replaces the last ``keep`` (the driver calls again as each kept sample's Add returns)."""
        with self._handover:
            if keep is None:
                self._released.set()
            else:
                self._kept = set(keep)
            self._handover.notify_all()

    def record_failure(self, failure: dict) -> None:
        """Keep the first failure: ``{"kind", "summary", "field"?, "status"?, "request_id"}``."""
        with self._lock:
            if self._failure is None:
                self._failure = failure

    def failure(self) -> dict | None:
        return self._failure

    def incr(self, stage: str, n: int = 1) -> None:
        with self._lock:
            self._done[stage] += n

    def set_done(self, stage: str, key: str, n: int) -> None:
        """Record that ``key`` (a sample) has ``n`` finished units of ``stage`` in all; the highest count wins.

        Idempotent: a re-executed sample reports the same key again instead of adding its units twice.
        """
        with self._lock:
            self._keyed[(stage, key)] = max(self._keyed.get((stage, key), 0), n)

    def update(self, counts: dict[str, int], totals: dict[tuple[str, str], int]) -> None:
        """Apply a :class:`ProgressBuffer` flush: ``counts`` as :meth:`incr`, ``{(stage, key): n}`` as :meth:`set_done`."""
        with self._lock:
            self._done.update(counts)
            for key, n in totals.items():
                self._keyed[key] = max(self._keyed.get(key, 0), n)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            done = Counter(self._done)
            for (stage, _), n in self._keyed.items():
                done[stage] += n
        return dict(done)


class InProcess:
    """An object called as its Ray actor handle would be (``handle.method.remote(*args)``), in this process: the
    progress tracker the single-stage Ingest actor holds, as its stages call it (module docstring).

    ``.remote()`` runs the method at once; it returns the coroutine of an ``async`` method, and an awaitable
    of the result of any other, so ``await handle.record_failure.remote(f)`` and a fire-and-forget
    ``handle.incr.remote(stage, n)`` read as they do with an actor handle.
    """

    def __init__(self, target: Any) -> None:
        self.target = target

    def __getattr__(self, name: str) -> "_InProcessMethod":
        return _InProcessMethod(getattr(self.target, name))


class _InProcessMethod:
    def __init__(self, method: Callable[..., Any]) -> None:
        self._method = method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        result = self._method(*args, **kwargs)
        return result if inspect.isawaitable(result) else _Done(result)


class _Done:
    """An awaitable of a value already there."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __await__(self):
        return self.value
        yield  # noqa: unreachable - makes __await__ a generator


class ProgressBuffer:
    """A stage actor's progress reports, sent to the :class:`ProgressTracker` in one call at a time.

    Each fire-and-forget actor call costs Ray's task machinery in the caller and in the tracker, on the
    cores the participant client times its Searches on (a call per report measured a noticeable share of
    the Ingest actor's time: docs/benchmarks.md). Reports are kept here and sent as one
    :meth:`ProgressTracker.update` when ``interval_s`` has passed since the last one, or on
    :meth:`flush` (the stage flushes at the end of each task, errors included). The display is at most
    ``interval_s`` or one task behind.

    Args:
        tracker: the tracker's actor handle, or None (nothing is kept or sent).
        interval_s: the least time between two sends of reports made in between (seconds).
        clock: monotonic seconds (injected in tests).
    """

    def __init__(self, tracker, interval_s: float = 0.5, clock: Callable[[], float] = time.monotonic):
        self.tracker, self.interval_s, self.clock = tracker, interval_s, clock
        self._counts: Counter[str] = Counter()
        self._totals: dict[tuple[str, str], int] = {}
        self._sent_at = float("-inf")

    def incr(self, stage: str, n: int) -> None:
        """Count ``n`` more finished units of ``stage`` (as :meth:`ProgressTracker.incr`)."""
        if self.tracker is not None and n:
            self._counts[stage] += n
            self._send_if_due()

    def total(self, stage: str, key: str, n: int) -> None:
        """Record ``key``'s finished units of ``stage`` in all (as :meth:`ProgressTracker.set_done`; highest wins)."""
        if self.tracker is not None:
            self._totals[(stage, key)] = max(self._totals.get((stage, key), 0), n)
            self._send_if_due()

    def flush(self) -> None:
        """Send what is kept, if anything."""
        if self._counts or self._totals:
            self.tracker.update.remote(dict(self._counts), self._totals)
            self._counts, self._totals = Counter(), {}
            self._sent_at = self.clock()

    def _send_if_due(self) -> None:
        if self.clock() - self._sent_at >= self.interval_s:
            self.flush()


class NeverLower:
    """A run's ``on_progress`` whose ``("done", {stage: n})`` counts never go below counts handed on before:
    each call hands on every stage counted so far, at the highest count seen.

    A run's done counts reach the caller from two threads: the head start's Adds (from its thread) and the
    tracker's snapshots (from the driver's poller), and a snapshot taken before a newer one can arrive after it
    (a Ray call slowed by a loaded machine). Every count is cumulative, so the highest seen is the truth; handed
    on as it came, a late count made a service job's progress drop. Thread-safe: counts are merged and handed
    on under one lock, so the caller sees them in order.

    Args:
        on_progress: the caller's ``(kind, values)`` callback (:func:`aml_ray.run.evaluation.evaluate`'s);
            ``"totals"`` and other kinds pass unchanged.
    """

    def __init__(self, on_progress: Callable[[str, dict[str, int]], None]) -> None:
        self._on_progress = on_progress
        self._done: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, kind: str, values: dict[str, int]) -> None:
        with self._lock:
            if kind == "done":
                self._done.update((stage, max(n, self._done.get(stage, 0))) for stage, n in values.items())
                values = dict(self._done)
            self._on_progress(kind, values)
