"""Fair admission to an endpoint's in-flight slots: round-robin across jobs, by priority.

A model endpoint declares how many requests it takes at once (``max_in_flight``); every job on the
cluster calls it through one shared :class:`aml_ray.actors.model.ModelClient`. A plain semaphore
admits waiters first come, first served, so a job that queued 10,000 requests makes a job that
arrives later with 100 wait behind all of them. :class:`FairSlots` keeps one FIFO queue per job and,
whenever a slot frees, grants it to the next job *in turn* among those with a waiting request
(deficit-free round-robin: each request costs one slot, so turns are equal). Within a job, requests
keep their arrival order. A job that joins goes to the back of the rotation.

Priorities: a request may be asked for with a ``priority`` (lower is sooner; default 0). A freed slot
goes to the most urgent priority with a waiting request, round-robin across jobs within it. The
participant client (:class:`aml_ray.actors.participant.ParticipantClient`) asks for Adds before
Searches: a sample's Adds gate all of its Searches, and behind a FIFO of a thousand queued Searches a
new sample's Add waited until the queue drained, so the Search queue ran dry while the next samples'
Adds finished (measured: docs/benchmarks.md).

:class:`FairQueue` is that order on its own (items in, the next item out); :class:`FairSlots` grants
slots in it (the model clients), and the participant client's senders take requests from it
(:class:`aml_ray.actors.participant.ParticipantClient`).

Plain asyncio, no Ray: tested directly (``tests/test_many_participants.py``). One instance belongs to
one event loop (the actor's); it is not thread-safe.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from typing import Generic, TypeVar
from contextlib import asynccontextmanager

T = TypeVar("T")


class FairQueue(Generic[T]):
    """Items taken out by priority (lower first), then round-robin across jobs, FIFO within a job.

    Not thread-safe; :meth:`get` belongs to one event loop.

    Examples:
        >>> q = FairQueue()
        >>> for job, item in [("a", 1), ("a", 2), ("b", 3)]:
        ...     q.put(job, item)
        >>> q.put("c", 0, priority=-1)
        >>> [q.pop() for _ in range(len(q))]
        [0, 1, 3, 2]
    """

    def __init__(self) -> None:
        self._n = 0
        # priority -> (job -> its items in arrival order); each dict's order is that priority's rotation
        # (front = next turn); a priority or job with no item is removed
        self._levels: dict[int, OrderedDict[str, deque[T]]] = {}
        self._getters: deque[asyncio.Future[None]] = deque()

    def __len__(self) -> int:
        return self._n

    def waiting(self) -> dict[str, int]:
        """``{job: items queued}`` over every priority (jobs with none are absent), most urgent first."""
        out: dict[str, int] = {}
        for level in sorted(self._levels):
            for job, queue in self._levels[level].items():
                out[job] = out.get(job, 0) + len(queue)
        return out

    def put(self, job: str, item: T, priority: int = 0) -> None:
        """Queue ``item`` for ``job`` at ``priority`` (lower is taken sooner) and wake one waiting :meth:`get`."""
        self._levels.setdefault(priority, OrderedDict()).setdefault(job, deque()).append(item)
        self._n += 1
        self._wake_next()

    def pop(self) -> T:
        """The next item: the most urgent priority's job whose turn it is, its oldest item.

        Raises:
            IndexError: the queue is empty.
        """
        if not self._n:
            raise IndexError("pop from an empty FairQueue")
        priority = min(self._levels)
        queues = self._levels[priority]
        job, queue = next(iter(queues.items()))
        item = queue.popleft()
        self._n -= 1
        if queue:
            queues.move_to_end(job)  # its turn is used: to the back of the rotation
        else:
            self._drop_if_empty(priority, job)
        return item

    def remove(self, job: str, item: T, priority: int = 0) -> bool:
        """Take ``item`` out of the queue if it is still there (a cancelled waiter); True when it was."""
        queue = self._levels.get(priority, {}).get(job)
        if queue is None or item not in queue:
            return False
        queue.remove(item)
        self._n -= 1
        self._drop_if_empty(priority, job)
        return True

    async def get(self) -> T:
        """The next item (:meth:`pop`), waiting for one when the queue is empty; no wait when it is not.

        Raises:
            asyncio.CancelledError: when the waiting task is cancelled; nothing is taken then.
        """
        while not self._n:
            getter = asyncio.get_running_loop().create_future()
            self._getters.append(getter)
            try:
                await getter
            except asyncio.CancelledError:
                if getter.done() and not getter.cancelled() and self._n:
                    self._wake_next()  # woken, then cancelled: pass the wake-up on
                raise
        return self.pop()

    def _wake_next(self) -> None:
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)
                return

    def _drop_if_empty(self, priority: int, job: str) -> None:
        queues = self._levels[priority]
        if not queues[job]:
            del queues[job]
            if not queues:
                del self._levels[priority]


class FairSlots:
    """``n`` slots granted in :class:`FairQueue` order: by priority, then round-robin across waiting jobs.

    Args:
        n: slots (the endpoint's declared max in-flight requests); at least 1.

    Raises:
        ValueError: ``n`` < 1.

    Invariants: at most ``n`` holders at any time; a free slot is never left idle while a request
    waits; a request of a lower ``priority`` value is granted before any of a higher one; a cancelled
    waiter leaves its queue, and a waiter cancelled after it was granted a slot gives the slot back (so
    cancellation never leaks capacity).

    Examples:
        >>> async def demo():
        ...     slots = FairSlots(1)
        ...     async with slots.slot("big"):
        ...         pass
        ...     return slots.in_use, slots.waiting()
        >>> asyncio.run(demo())
        (0, {})
    """

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"FairSlots needs at least 1 slot, got {n}")
        self.n = n
        self.in_use = 0
        self._waiters: FairQueue[asyncio.Future[None]] = FairQueue()

    def waiting(self) -> dict[str, int]:
        """``{job: requests waiting}`` (jobs with none are absent), most urgent first."""
        return self._waiters.waiting()

    async def acquire(self, job: str, priority: int = 0) -> None:
        """Wait for a slot on behalf of ``job`` (by priority, then FIFO within the job, round-robin across jobs).

        Args:
            job: the requesting job's key.
            priority: lower is granted sooner.

        Raises:
            asyncio.CancelledError: when the waiting task is cancelled; nothing is held then.
        """
        if self.in_use < self.n and not len(self._waiters):
            self.in_use += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.put(job, fut, priority)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # granted, then cancelled before it ran: give it back
                self.release()
            else:
                self._waiters.remove(job, fut, priority)
            raise

    def release(self) -> None:
        """Free one slot and grant it to the next waiting request in :class:`FairQueue` order, if any.

        Raises:
            RuntimeError: more releases than grants.
        """
        if self.in_use <= 0:
            raise RuntimeError("FairSlots.release() without a held slot")
        self.in_use -= 1
        while self.in_use < self.n and len(self._waiters):
            fut = self._waiters.pop()
            if fut.done():  # cancelled while queued but not yet removed (defensive)
                continue
            fut.set_result(None)
            self.in_use += 1

    @asynccontextmanager
    async def slot(self, job: str, priority: int = 0) -> AsyncIterator[None]:
        """``async with slots.slot(job):`` holds one slot for the block (released on any exit)."""
        await self.acquire(job, priority)
        try:
            yield
        finally:
            self.release()
