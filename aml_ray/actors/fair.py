"""Fair admission to an endpoint's in-flight slots: round-robin across jobs (issue 7, item 4).

A model endpoint declares how many requests it takes at once (``max_in_flight``); every job on the
cluster calls it through one shared :class:`aml_ray.actors.model.ModelClient`. A plain semaphore
admits waiters first come, first served, so a job that queued 10,000 requests makes a job that
arrives later with 100 wait behind all of them. :class:`FairSlots` keeps one FIFO queue per job and,
whenever a slot frees, grants it to the next job *in turn* among those with a waiting request
(deficit-free round-robin: each request costs one slot, so turns are equal). Within a job, requests
keep their arrival order. A job that joins goes to the back of the rotation.

Plain asyncio, no Ray: tested directly (``tests/test_many_participants.py``). One instance belongs to
one event loop (the actor's); it is not thread-safe.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class FairSlots:
    """``n`` slots granted round-robin across jobs that have waiting requests.

    Args:
        n: slots (the endpoint's declared max in-flight requests); at least 1.

    Raises:
        ValueError: ``n`` < 1.

    Invariants: at most ``n`` holders at any time; a free slot is never left idle while a request
    waits; a cancelled waiter leaves its queue, and a waiter cancelled after it was granted a slot
    gives the slot back (so cancellation never leaks capacity).

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
        # job -> its waiters in arrival order; the dict's order is the rotation (front = next turn)
        self._queues: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    def waiting(self) -> dict[str, int]:
        """``{job: requests waiting}`` in rotation order (jobs with none are absent)."""
        return {job: len(q) for job, q in self._queues.items()}

    async def acquire(self, job: str) -> None:
        """Wait for a slot on behalf of ``job`` (FIFO within the job, round-robin across jobs).

        Raises:
            asyncio.CancelledError: when the waiting task is cancelled; nothing is held then.
        """
        if self.in_use < self.n and not self._queues:
            self.in_use += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(job, deque()).append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # granted, then cancelled before it ran: give it back
                self.release()
            else:
                queue = self._queues.get(job)
                if queue is not None and fut in queue:
                    queue.remove(fut)
                    if not queue:
                        del self._queues[job]
            raise

    def release(self) -> None:
        """Free one slot and grant it to the job whose turn it is, if any is waiting.

        Raises:
            RuntimeError: more releases than grants.
        """
        if self.in_use <= 0:
            raise RuntimeError("FairSlots.release() without a held slot")
        self.in_use -= 1
        self._grant()

    def _grant(self) -> None:
        while self.in_use < self.n and self._queues:
            job, queue = next(iter(self._queues.items()))
            fut = queue.popleft()
            if queue:
                self._queues.move_to_end(job)  # its turn is used: to the back of the rotation
            else:
                del self._queues[job]
            if fut.done():  # cancelled while queued but not yet removed (defensive)
                continue
            fut.set_result(None)
            self.in_use += 1

    @asynccontextmanager
    async def slot(self, job: str) -> AsyncIterator[None]:
        """``async with slots.slot(job):`` holds one slot for the block (released on any exit)."""
        await self.acquire(job)
        try:
            yield
        finally:
            self.release()
