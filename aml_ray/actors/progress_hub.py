"""One actor holding the progress tracker of every job on the cluster.

A job's pipeline keeps its counts and its first failure in a :class:`~aml_ray.run.progress.ProgressTracker`
that its stage actors and its driver call. As an actor of its own per job, it is a worker process per job:
about 0.75 s of CPU to start and a place in the raylet's queue of worker starts, which starts as many at a
time as the node has CPUs; 8 jobs starting at once queued 8 of them beside their 16 stage actors
(docs/benchmarks.md, "Many participants at once"). :class:`ProgressHub` holds every job's tracker, by a key
each pipeline draws, in one actor that the cluster's client registry starts and closes like the shared
clients (:func:`aml_ray.actors.shared.acquire_progress_hub`).

The hub is an asyncio actor, and a tracker's two waits (the Ingest stage's ``take_over`` of a sample, the
driver's ``wait_wanted``) poll every :data:`POLL_S` on its event loop rather than each holding a thread: the
loop's default executor has a few threads, and with one job's ``take_over`` calls holding all of them, a
``wait_wanted`` (whose return leads to the release they wait for) would never get one.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from aml_ray.run.progress import ProgressTracker

#: Seconds between a waiting call's looks at its tracker (a sample's take-over at most this late after its release).
POLL_S = 0.01
#: Dropped keys remembered (a late report of one of them is ignored); a hub that lives as long as the cluster
#: forgets the oldest beyond this, so its memory stays flat over thousands of jobs.
DROPPED_KEPT = 10_000


class ProgressHub:
    """Every job's :class:`~aml_ray.run.progress.ProgressTracker`, by key; a Ray actor at run time.

    A tracker is made by its job's first call (with that call's ``head_start``) and dropped by :meth:`drop`;
    a call for a dropped key does nothing and returns None (a fire-and-forget report that arrives late).
    """

    def __init__(self) -> None:
        self._trackers: dict[str, ProgressTracker] = {}
        self._dropped: OrderedDict[str, None] = OrderedDict()  # in drop order, at most DROPPED_KEPT

    async def call(self, key: str, head_start: bool, method: str, *args: Any) -> Any:
        """``method(*args)`` on ``key``'s tracker (made now, with ``head_start``, if this is the job's first call).

        ``take_over`` and ``wait_wanted`` wait by polling (the module docstring); they return at once, with
        None, once the key is dropped. Any other method runs at once.
        """
        if key in self._dropped:
            return None
        tracker = self._trackers.get(key)
        if tracker is None:
            tracker = self._trackers[key] = ProgressTracker(head_start=head_start)
        if method == "take_over":
            while not tracker.ask_to_take_over(*args):
                await asyncio.sleep(POLL_S)
                if key in self._dropped:
                    return None
            return tracker.ended()
        if method == "wait_wanted":
            while not tracker.wanted() and key not in self._dropped:
                await asyncio.sleep(POLL_S)
            return None
        return getattr(tracker, method)(*args)

    def drop(self, key: str) -> None:
        """Forget ``key``'s tracker (its job ended); later calls for it do nothing."""
        self._trackers.pop(key, None)
        self._dropped[key] = None
        while len(self._dropped) > DROPPED_KEPT:
            self._dropped.popitem(last=False)

    def jobs(self) -> list[str]:
        """The keys of the trackers held now (tests)."""
        return list(self._trackers)

    async def aclose(self) -> None:
        """The registry's close before it kills the actor: nothing is open."""
        self._trackers.clear()


@dataclass(frozen=True)
class TrackerOnHub:
    """A job's handle on its tracker in the hub, called as a ``ProgressTracker`` actor handle is
    (``tracker.incr.remote(stage, n)``, ``ray.get(tracker.snapshot.remote())``). Picklable: the stages get it.

    Attributes:
        hub: the :class:`ProgressHub` actor handle.
        key: the job's tracker key (drawn by its pipeline; never a secret).
        head_start: whether the job's driver runs a head start (:class:`~aml_ray.run.progress.ProgressTracker`'s).
    """

    hub: Any
    key: str
    head_start: bool = False

    def __getattr__(self, method: str) -> _HubMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return _HubMethod(self, method)


@dataclass(frozen=True)
class _HubMethod:
    on: TrackerOnHub
    method: str

    def remote(self, *args: Any):
        """The ObjectRef of ``method(*args)`` on the job's tracker."""
        return self.on.hub.call.remote(self.on.key, self.on.head_start, self.method, *args)


def spawn_progress_hub(*, name: str, namespace: str):
    """Start the :class:`ProgressHub` actor named ``name`` in ``namespace``, on this node (a worker node's loss
    must not lose the counts); the registry's ``_spawn`` calls it (:mod:`aml_ray.actors.shared`)."""
    import ray

    from aml_ray.run.ray_runtime import on_this_node

    return ray.remote(ProgressHub).options(num_cpus=0, max_concurrency=10_000, name=name, namespace=namespace,
                                           get_if_exists=True, scheduling_strategy=on_this_node()).remote()
