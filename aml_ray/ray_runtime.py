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
