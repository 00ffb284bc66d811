"""The one place aml-ray relies on parts of Ray that are not a stable public API: ``_system_config`` keys, and
the words of Ray's node-start timeout.

A cluster aml-ray starts itself (``aml-ray run`` without a cluster to join, ``aml-ray cluster up``, the
service's ``aml-ray serve``) is given :data:`SYSTEM_CONFIG` through ``ray.init(_system_config=...)`` or
``ray start --system-config``. Ray reads each key from its ``ray_config_def.h``; a key a Ray release
renames or drops stops the cluster's start with Ray's own error ("unknown config key"), and a changed
meaning would pass silently, so :data:`PINNED_RAY_VERSION` names the release they were checked against and
``tests/run/test_ray_internals.py`` fails, naming this module and each key, when another Ray is installed.

:data:`NODE_START_TIMEOUT` is how ``ray.init`` says that the node it started did not register within Ray's
fixed 30 s (``raylet_start_wait_time_s`` in ``ray/_private/node.py``; no setting changes it): a plain
``Exception`` with that text, so a local start that hit it is recognised by its words
(:func:`aml_ray.run.ray_runtime.init_ray` and :func:`aml_ray.run.cluster.up` start again); ``tests/run/test_ray_internals.py`` checks the
words are in the installed Ray's source.

What each key buys is measured in docs/benchmarks.md ("the cluster's system config"); none changes a
result, only CPU and latency.
"""

from __future__ import annotations

#: The Ray release :data:`SYSTEM_CONFIG` was checked against (pyproject pins the same).
PINNED_RAY_VERSION = "2.60.0"

#: Ray's system config for a cluster aml-ray starts:
#:
#: - ``task_events_report_interval_ms: 0``: no task events (every actor call's state changes, buffered in
#:   each worker and sent to the GCS every second for the state API and the dashboard, which such a cluster
#:   does not run; ``ray list`` then shows no tasks);
#: - ``enable_metrics_collection: False``: no metrics export from every worker and raylet;
#: - ``prestart_worker_first_driver: False``: the raylet starts no idle workers when a driver registers.
#:   It answers that registration only once they run, and ``ray.init`` waits for the answer holding the
#:   GIL; actors start their own workers when they are created;
#: - ``worker_niceness: 0``: workers run at the driver's priority (Ray's default is nice 15), so the
#:   latencies the client actors record are the participant's and the model's, not the scheduler's.
SYSTEM_CONFIG: dict[str, int | bool] = {
    "task_events_report_interval_ms": 0,
    "enable_metrics_collection": False,
    "prestart_worker_first_driver": False,
    "worker_niceness": 0,
}


#: The start of the message of the ``Exception`` ``ray.init`` raises when the node it started did not register
#: with the GCS within Ray's fixed 30 s (a raylet waiting for its agents on a loaded machine).
NODE_START_TIMEOUT = "The current node timed out during startup"


def node_start_timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` is Ray's node-start timeout (:data:`NODE_START_TIMEOUT`), raised by ``ray.init``."""
    return type(exc) is Exception and str(exc).startswith(NODE_START_TIMEOUT)


def version_mismatch(installed: str) -> str | None:
    """Why :data:`SYSTEM_CONFIG` may not hold for Ray ``installed`` (a version string), or None when it is the
    pinned release.

    Returns:
        A message naming this module, :data:`PINNED_RAY_VERSION`, ``installed`` and every key to check again.
    """
    if installed == PINNED_RAY_VERSION:
        return None
    return (f"aml_ray.run._ray_internals.SYSTEM_CONFIG was checked against Ray {PINNED_RAY_VERSION}, but Ray "
            f"{installed} is installed: check each key ({', '.join(SYSTEM_CONFIG)}) in that release's "
            f"ray_config_def.h, and NODE_START_TIMEOUT in its ray/_private/node.py, then update "
            f"PINNED_RAY_VERSION")
