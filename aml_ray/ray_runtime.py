"""Starting (or joining) Ray with the settings measured on small machines (RAY_NOTES.md).

Quiet start: usage stats off, token auth off for a local cluster, a private temp dir, no dashboard,
``address="local"`` so a stale address file from an earlier ``ray start`` is never joined by accident.
Set ``RAY_ADDRESS`` (or pass ``address``) to join a real cluster instead.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

QUIET_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "RAY_DEDUP_LOGS": "0"}


def init_ray(*, num_cpus: int | None = None, address: str | None = None) -> bool:
    """Initialise Ray unless it already is.

    Args:
        num_cpus: CPUs for a local cluster (default: all of the machine's).
        address: a cluster address; default ``$RAY_ADDRESS`` or a new local cluster.

    Returns:
        True when this call started Ray (the caller then shuts it down), False when Ray was running.
    """
    import ray

    if ray.is_initialized():
        return False
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    kwargs: dict = {"include_dashboard": False, "log_to_driver": False, "logging_level": "warning"}
    if address == "local":
        tmp = os.environ.setdefault("RAY_TMPDIR", str(Path(tempfile.gettempdir()) / "aml-ray"))
        Path(tmp).mkdir(parents=True, exist_ok=True)
        kwargs.update(num_cpus=num_cpus, _temp_dir=tmp)
    ray.init(address=address, **kwargs)
    import logging

    import ray.data

    logging.getLogger("ray.data").setLevel(logging.ERROR)  # the CLI prints its own progress

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # the CLI shows its own per-stage progress
    ctx.print_on_execution_start = False
    return True


def on_this_node():
    """A scheduling strategy that keeps an actor on the calling process's node (hard node affinity).

    The job's shared actors (``ParticipantClient``, ``ModelClient``, ``ProgressTracker``) hold what a
    restart cannot rebuild (calls in flight, progress counts, the first failure), and a stage whose call
    to one of them fails stops the job; on the driver's node they live exactly as long as the driver.
    Ray Data's stage actors may go anywhere: they are restarted elsewhere when their node is lost
    (``max_restarts=-1``). Hard, because soft affinity was measured to spill 0-CPU actors to another
    node (3 of 6 on a 1-CPU head); they need no resources, so the driver's node always fits them.

    Returns:
        ``NodeAffinitySchedulingStrategy(<this node>, soft=False)``.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


def undo_worker_niceness() -> bool:
    """Run every thread of this process at nice 0, the driver's priority, undoing Ray's worker niceness.

    Ray starts every worker process at nice 15 (``RAY_worker_niceness``), so that its driver and raylet
    stay responsive. The actors that time a participant's or a model's calls (``ParticipantClient``,
    ``ModelClient``) then lose the CPU to any nice-0 process on their core, and the latencies they record
    are partly the scheduler's. Measured with ``scripts/bench_pipeline.py --pipeline retrieval`` on 2 cores,
    20 ms participant latency: Search p95 as the client saw it 47-52 ms at nice 15, and 34-37 ms at nice 0;
    throughput 1,940-2,060 against 2,160-2,240 req/s. Linux niceness is per thread, so every thread is
    set, and threads started later inherit it. The stage actors keep Ray's niceness: their work is
    throughput, not timing.

    Returns:
        True when every thread was set; False when the process may not lower its niceness (no
        ``CAP_SYS_NICE``; the actor then runs at Ray's niceness, nothing else changes) or on a platform
        without ``/proc/self/task``.
    """
    import os

    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return False
    done = True
    for tid in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), 0)
        except (OSError, ValueError):
            done = False
    return done
