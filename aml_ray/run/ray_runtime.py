"""Starting (or joining) Ray with the settings measured on small machines (docs/ray-notes.md).

Quiet start: usage stats off, token auth off for a local cluster, a private temp dir, no dashboard,
``address="local"`` so a stale address file from an earlier ``ray start`` is never joined by accident.
Set ``RAY_ADDRESS`` (or pass ``address``) to join a real cluster instead.

Console (:func:`set_verbose`; ``aml-ray run`` calls it with its ``--verbose`` flag): quiet keeps Ray's own
log lines off the console, since a user cannot act on them and they read as failures (a ``core_worker.cc``
error about actor constructor arguments on every run, Ray Data's ``max_errored_blocks`` advice and
"Exception occurred in user code" when the contract stops a run). The run reports its own errors, and
``run.json`` and the evidence name each one. What quiet keeps off the console:

- the driver's C++ log lines, which Ray's core worker writes straight to descriptor 2
  (:func:`_filter_native_stderr`); they stay in ``<RAY_TMPDIR>/session_*/logs/python-core-driver-*.log``;
- Ray Data's console handler; its errors stay in the session's ``logs/ray-data/`` files;
- the driver's ``ray`` Python logger below critical (it writes no file: ``--verbose`` to see it).

Verbose gives Ray's defaults (``ray`` logger at info, Ray Data's console lines, the workers' output).
Without a call (tests, the service, scripts) the ``ray`` logger prints warnings and Ray Data errors.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

QUIET_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "RAY_DEDUP_LOGS": "0"}
#: The start of a line of Ray's C++ log: ``[2026-12-03 04:37:11,602 E 32049 32049] core_worker.cc:2465: ...``
#: (time, level, process and thread id).
RAY_NATIVE_LOG_LINE = re.compile(rb"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [TDIWEF] \d+ \d+\] ")

#: This process started a local cluster with :func:`init_ray` (:func:`exit_process`).
_started_here = False
#: This process ends with :func:`exit_process` once its command returns (:func:`exit_after_command`).
_exit_after_command = False
#: None: no :func:`set_verbose` call (library defaults); False: quiet console; True: Ray's defaults.
_verbose: bool | None = None
_native_stderr_filtered = False


def set_verbose(verbose: bool) -> None:
    """Show Ray's own log lines on this process's console (True) or keep them off it (False).

    Call it before Ray starts (the logger settings apply at the next :func:`init_ray` or
    :func:`local_cluster`, Ray Data's at the next :func:`quiet_ray_data`); see the module docstring for
    what quiet keeps off the console and where those lines still go. Quiet also filters descriptor 2 at
    once (:func:`_filter_native_stderr`).
    """
    global _verbose
    _verbose = verbose
    if not verbose:
        _filter_native_stderr()


def _filter_native_stderr() -> None:
    """Keep Ray's C++ log lines, written by the driver's core worker to descriptor 2, off the console.

    Descriptor 2 becomes a pipe read by a daemon thread that passes every line not starting with
    :data:`RAY_NATIVE_LOG_LINE` on to the console; ``sys.stderr`` is reopened on the console itself, so
    what Python prints never waits on the thread. Only where ``sys.stderr`` is the process's own on
    descriptor 2 (the command line; not under pytest's capture or click's test runner), and once.
    """
    global _native_stderr_filtered
    if _native_stderr_filtered or sys.stderr is not sys.__stderr__:
        return
    try:
        if sys.stderr.fileno() != 2:
            return
    except (AttributeError, OSError, ValueError):
        return
    _native_stderr_filtered = True
    sys.stderr.flush()
    console = os.dup(2)
    pipe_in, pipe_out = os.pipe()
    os.dup2(pipe_out, 2)
    os.close(pipe_out)
    old = sys.stderr
    sys.stderr = open(console, "w", buffering=1, encoding=old.encoding, errors=old.errors, closefd=False)  # noqa: SIM115
    if faulthandler.is_enabled():  # PYTHONFAULTHANDLER / -X faulthandler: a crash's stacks reach the console,
        faulthandler.enable(file=sys.stderr, all_threads=True)  # not the pipe, whose reader dies with the process

    def forward() -> None:
        pending = b""
        while chunk := os.read(pipe_in, 65536):
            *lines, pending = (pending + chunk).split(b"\n")
            kept = b"".join(line + b"\n" for line in lines if not RAY_NATIVE_LOG_LINE.match(line))
            if kept:
                os.write(console, kept)
        if pending and not RAY_NATIVE_LOG_LINE.match(pending):
            os.write(console, pending)

    threading.Thread(target=forward, name="aml-ray-stderr", daemon=True).start()


def init_ray(*, num_cpus: int | None = None, address: str | None = None, private: bool = False) -> bool:
    """Initialise Ray unless it already is.

    Args:
        num_cpus: CPUs for a local cluster (default: all of the machine's).
        address: a cluster address; default ``$RAY_ADDRESS`` or a new local cluster.
        private: a new local cluster serves this process's runs and nothing else: it starts without the
            autoscaler monitor, the API server and (unless verbose) the log monitor (:func:`_private_head`),
            and without task events and metrics (:data:`PRIVATE_SYSTEM_CONFIG`). Ignored when joining a
            cluster.

    Returns:
        True when this call started Ray (the caller then shuts it down), False when Ray was running.
    """
    import ray

    if ray.is_initialized():
        return False
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    local = is_local_address(address)
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    kwargs: dict = {"include_dashboard": False, **_driver_logging()}
    if local:
        tmp = os.environ.setdefault("RAY_TMPDIR", str(Path(tempfile.gettempdir()) / "aml-ray"))
        Path(tmp).mkdir(parents=True, exist_ok=True)
        kwargs.update(num_cpus=num_cpus, _temp_dir=tmp)
    if local and private:
        kwargs["_system_config"] = PRIVATE_SYSTEM_CONFIG
    global _started_here
    # before ray.init: a Ctrl-C inside it (the head start's Adds go on meanwhile) must leave through exit_process's
    # os._exit too, never the teardown under a Ray half started (the crash exit_process documents)
    _started_here = _started_here or local
    with _private_head(log_monitor=kwargs["log_to_driver"]) if local and private else contextlib.nullcontext():
        ray.init(address=address, **kwargs)
    return True


def exit_process(code: int | str | None = 0) -> NoReturn:
    """End this process with ``code`` (as ``sys.exit`` takes it), without the interpreter's teardown when this
    process started a local Ray cluster (issue 29, the fixed cost).

    After ``ray.shutdown()``, finalising the interpreter takes 0.44-0.52 s more in a process that imported
    Ray (native code, no Python frame: measured with a script that only starts and stops Ray, against 4 ms
    without Ray; docs/benchmarks.md), time the command's caller waits for. So such a process flushes its
    standard streams and leaves with ``os._exit``: atexit handlers do not run, and nothing of aml-ray's is
    pending then (run.json, results and evidence are written atomically and closed; the reference system's
    process ends with its parent).

    A cluster of its own that is still up (a run that left it to the exit, :func:`leave_cluster_to_exit`; a
    Ctrl-C inside the run's own shutdown) is stopped at once by :func:`stop_cluster_at_exit` rather than by
    ``ray.shutdown()`` (0.06-0.14 s or 0.30-0.34 s, waiting for the raylet's graceful stop: docs/ray-notes.md);
    where that cannot be done, it is shut down first. Never through the teardown: with Ray's core worker
    alive it crashed (SIGSEGV in ``TaskManager::RecordMetrics`` under ``CoreWorkerProcess::HandleAtExit``,
    exit -11 instead of 130, 1 run in 4-8 of tests/test_interrupt.py). Any other process (a cluster
    joined, no Ray) exits with ``sys.exit``, which runs the usual teardown (Ray's own atexit shutdown
    included).
    """
    if isinstance(code, str):  # sys.exit("message"): printed, status 1
        print(code, file=sys.stderr)
        code = 1
    code = 0 if code is None else int(code)
    ray = sys.modules.get("ray")
    if _started_here and ray is not None and ray.is_initialized():
        try:
            if not stop_cluster_at_exit():
                shutdown_ray()
        except BaseException:  # noqa: BLE001 - another Ctrl-C: leave anyway, without the teardown
            pass
    if _started_here and ray is not None:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        os._exit(code)
    sys.exit(code)


def leave_cluster_to_exit() -> bool:
    """Whether a run may leave the local cluster it started up for this process's exit to stop
    (:func:`exit_process`): only in the ``aml-ray`` command, which ends with it (:func:`exit_after_command`).

    ``aml_ray.run.evaluation.evaluate`` then skips its ``ray.shutdown()`` after a run that did not fail; in
    tests, the service and library calls (no :func:`exit_after_command`) it always shuts its cluster down.
    """
    return _exit_after_command


def exit_after_command() -> None:
    """Declare that this process ends with :func:`exit_process` once its command returns (``aml_ray.cli.main``)."""
    global _exit_after_command
    _exit_after_command = True


def stop_cluster_at_exit() -> bool:
    """Stop the local cluster this process started, at once, for a process about to leave with ``os._exit``.

    The raylet is stopped (SIGSTOP) and every process under it, workers and Ray's agents, is killed
    (SIGKILL), with any worker of it already orphaned (:func:`_raylet_processes`, as :func:`shutdown_ray`); the raylet and the GCS, started with the kernel's fate sharing (``PR_SET_PDEATHSIG``,
    Ray's ``Node.kernel_fate_share``), are killed by the kernel when this process ends. Stopped first, the
    raylet cannot notice its workers' or agents' deaths and exit while this process still runs: a raylet
    that died under a live driver made the driver's core worker end the process itself about 1 s later,
    with status 1 (measured: docs/ray-notes.md). Nothing is waited for; spilled objects are deleted as
    ``ray.shutdown()`` deletes them (``Node.destroy_external_storage``). The agents must be killed: left
    alone, they outlive the raylet with parent 1 (seen 9 s after the driver's exit).

    The caller must leave with ``os._exit`` right after, and use no Ray call in between. The processes it
    ends are reaped by the system's init (PID 1), not waited for here: in a container whose PID 1 never
    reaps orphans (``docker run`` without ``--init``), they stay as zombies, which hold no memory.

    Returns:
        True when it stopped the cluster; False when it did nothing (no cluster of this process's own is
        up, it has no raylet here, or its processes do not share the driver's fate): shut it down then.
    """
    import signal

    ray = sys.modules.get("ray")
    if not _started_here or ray is None or not ray.is_initialized():
        return False
    node = getattr(ray._private.worker, "_global_node", None)
    raylet = _own_raylet_pid()
    if node is None or raylet is None or not getattr(node, "kernel_fate_share", False):
        return False
    import psutil

    try:
        raylet_proc = psutil.Process(raylet)
        os.kill(raylet, signal.SIGSTOP)
    except (psutil.Error, OSError):
        return False
    try:  # its children (workers, agents), and workers of it already orphaned (:func:`_raylet_processes`)
        under = {p.pid: p for p in (*raylet_proc.children(recursive=True), *_raylet_processes(raylet))}
    except (psutil.Error, OSError):
        with contextlib.suppress(OSError):
            os.kill(raylet, signal.SIGCONT)  # the caller's ray.shutdown() then stops it as usual
        return False
    with contextlib.suppress(Exception):
        node.destroy_external_storage()
    for proc in under.values():
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return True


#: The head node's processes a private cluster does without (:func:`_private_head`).
PRIVATE_HEAD_SKIPS = ("start_monitor", "start_api_server")
#: The environment a private cluster's DashboardAgent starts with (:func:`_private_head`): its reporter module
#: gathers every Ray process's stats (psutil) and publishes them to the GCS for the dashboard's node view
#: every 5 s by default; a private cluster has no dashboard, so it does so once an hour.
PRIVATE_AGENT_ENV = {"REPORTER_UPDATE_INTERVAL_MS": "3600000"}
#: Seconds between two looks for the GCS's port file while a private head starts (:func:`_port_wait_without_gil`).
PORT_POLL_S = 0.005


def _port_wait_without_gil(wait: Callable[..., int], port_filename: Callable[[str, str], str]) -> Callable[..., int]:
    """Ray's wait for a process's port file (``ray._raylet.wait_for_persisted_port``, which ``ray.init`` calls
    for the GCS's port), with the waiting done here: Ray's own sleeps 100 ms between two looks holding the
    GIL, so every other thread of the driver stood still for about 100 ms of ``ray.init`` (the head start's
    first Add after the pre-flight's probe among them; measured: docs/benchmarks.md).

    Returns a function with ``wait``'s arguments that looks for the file every :data:`PORT_POLL_S` with
    ``time.sleep`` (the GIL released) until it exists or the timeout passed, then lets ``wait``, given the
    time left, read it (a port, or Ray's own error for a file it cannot read or that never came).
    """
    def wait_for_persisted_port(session_dir: str, node_id: str, port_name: str, timeout_ms: int = 30_000,
                                poll_interval_ms: int = 100) -> int:
        path = os.path.join(session_dir, port_filename(node_id, port_name))
        deadline = time.monotonic() + timeout_ms / 1000
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(PORT_POLL_S)
        left_ms = max(0, int((deadline - time.monotonic()) * 1000))
        return wait(session_dir, node_id, port_name, timeout_ms=left_ms, poll_interval_ms=poll_interval_ms)

    return wait_for_persisted_port


#: Ray's system config for a private cluster (issue 29): no task events (each actor call's state changes,
#: buffered in every worker and sent to the GCS each second, for the state API and dashboard, which a
#: private cluster does not run) and no metrics (every worker's and raylet's, exported through the
#: DashboardAgent, for the dashboard and Prometheus). On 2 cores against a one-at-a-time participant,
#: aml-ray's CPU at full rate went from 4.59 to 2.49-2.83 ms a question with both off (docs/benchmarks.md).
#: And no workers started at the driver's registration (``prestart_worker_first_driver``): the raylet
#: answers that registration only after starting them, and the driver waits for the answer inside
#: ``ray._raylet.CoreWorker``'s constructor holding the GIL, so every other thread of the driver (the head
#: start's Adds, the pre-flight) stood still 0.49-0.51 s at the end of ``ray.init``; without them ``ray.init``
#: took 1.43-1.48 s instead of 1.92-1.95 s with no such stall, and two actors were ready as soon (2.26-2.38 s
#: against 2.28-2.35 s from the start): their workers start when they are created (docs/ray-notes.md).
PRIVATE_SYSTEM_CONFIG = {"task_events_report_interval_ms": 0, "enable_metrics_collection": False,
                         "prestart_worker_first_driver": False}


@contextmanager
def _private_head(*, log_monitor: bool = True) -> Iterator[None]:
    """While Ray starts a local head node, skip its autoscaler monitor and its API server (issue 29), and its
    log monitor unless ``log_monitor``.

    A cluster that ``aml-ray run`` (or a suite run) starts for itself has nothing to autoscale and nobody calling the
    dashboard's or the state API. Both are Python processes of the head node: on 2 cores their start is
    CPU the Ray start and the first Adds share, each takes CPU every second while the run goes on, and the
    monitor does not exit on SIGTERM, so ``ray.shutdown()`` waits 1 s for it before killing it (measured:
    docs/benchmarks.md). ``ray.init`` has no argument for either (Ray 2.60's ``RayParams.no_monitor`` is not
    passed through), so :class:`ray._private.node.Node`'s two start methods are replaced while the head
    starts, and put back after; with another Ray version each replacement whose target is gone or renamed
    is left out, the others still made.
    The log monitor tails the workers' log files to send their lines to the driver; with
    ``log_to_driver=False`` (a quiet run: :func:`_driver_logging`) nobody reads them, and it took 0.21-0.26
    ms of CPU a question (docs/benchmarks.md).

    The DashboardAgent, which the raylet always starts, starts ``--minimal``: without its HTTP server (the
    job-submission and log API of a dashboard that is not running) and its gRPC server (metrics, which a
    private cluster does not collect: :data:`PRIVATE_SYSTEM_CONFIG`), as Ray starts it where the dashboard's
    packages are not installed. ``ray.init`` waited for that HTTP server, and the agent's servers and
    reporter took CPU every second of the run (measured: docs/benchmarks.md). Ray's check for those packages
    (``ray._private.utils.get_dashboard_dependency_error``, read by ``start_raylet`` for the agent's
    command) answers so while the head starts, and the environment the raylet and its agent inherit holds
    :data:`PRIVATE_AGENT_ENV` for that time; both are put back after.

    And the head's wait for the GCS's port waits without holding the GIL (:func:`_port_wait_without_gil`, in
    place of the name ``ray._private.node`` imported from ``ray._raylet`` while the head starts).
    """
    try:
        from ray._private import node, utils
        from ray._raylet import get_port_filename
    except ImportError:  # pragma: no cover - another Ray layout: the default start
        yield
        return
    skips = PRIVATE_HEAD_SKIPS if log_monitor else (*PRIVATE_HEAD_SKIPS, "start_log_monitor")
    # (object, attribute) -> what stands in for it while the head starts; each only where this Ray has it
    patches: dict[tuple[Any, str], Any] = {(node.Node, name): lambda self, *args, **kwargs: None for name in skips}
    no_dashboard = ImportError("aml-ray: a private cluster runs no dashboard")
    patches[(utils, "get_dashboard_dependency_error")] = lambda: no_dashboard
    port_wait = getattr(node, "wait_for_persisted_port", None)
    if port_wait is not None:
        patches[(node, "wait_for_persisted_port")] = _port_wait_without_gil(port_wait, get_port_filename)
    saved = {target: getattr(*target, None) for target in patches}
    for target, stand_in in patches.items():
        if saved[target] is not None:
            setattr(*target, stand_in)
    env = {key: os.environ.get(key) for key in PRIVATE_AGENT_ENV}
    for key, value in PRIVATE_AGENT_ENV.items():
        os.environ.setdefault(key, value)
    try:
        yield
    finally:
        for target, original in saved.items():
            if original is not None:
                setattr(*target, original)
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)


def starts_own_cluster(address: str | None = None) -> bool:
    """Whether :func:`init_ray` with ``address`` would start a new local cluster now: Ray is not running in
    this process (not imported, or not initialised) and the address is local (:func:`is_local_address`)."""
    ray = sys.modules.get("ray")
    running = ray is not None and getattr(ray, "is_initialized", lambda: False)()
    return not running and is_local_address(address)


def is_local_address(address: str | None = None) -> bool:
    """Whether :func:`init_ray` with ``address`` starts a new local cluster (``address`` or ``$RAY_ADDRESS``
    unset or ``"local"``) rather than joining one that other processes may use."""
    return (address or os.environ.get("RAY_ADDRESS") or "local") == "local"


def _driver_logging() -> dict[str, Any]:
    """``ray.init`` arguments for the driver's ``ray`` logger and the workers' output (module docstring)."""
    if _verbose:
        return {"log_to_driver": True, "logging_level": "info"}
    return {"log_to_driver": False, "logging_level": "warning" if _verbose is None else "critical"}


def quiet_ray_data() -> None:
    """Ray Data's settings for this process's pipelines: its console lines and progress bars off (the CLI shows
    its own; see the module docstring), and no per-task memory poll.

    Called where a Ray Data pipeline is built (:func:`aml_ray.run.pipeline._ray_data_stages`), not when Ray
    starts: importing ``ray.data`` costs 0.32 s of CPU in a process that has pyarrow and polars (0.24 s of it
    pandas, which pyarrow also imports at its first table built from Python objects), time a single-stage
    job, run without Ray Data, need not spend (issue 29). Idempotent.
    """
    import logging

    import ray.data

    data_log = logging.getLogger("ray.data")
    if not _verbose:
        data_log.setLevel(logging.ERROR)  # the CLI prints its own progress
    if _verbose is False:
        for handler in data_log.handlers:  # the console's, not the session's log file
            if isinstance(handler, logging.StreamHandler):
                handler.setLevel(logging.CRITICAL + 1)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # the CLI shows its own per-stage progress
    ctx.print_on_execution_start = False
    # No per-task memory poll: Ray Data starts a thread in every map task that reads the process's memory
    # (psutil) for its per-task max-USS statistic, which nothing here reads (measured faster without:
    # docs/benchmarks.md).
    ctx.memory_usage_poll_interval_s = None


@dataclass
class LocalCluster:
    """A running multi-node Ray cluster on this machine (:func:`local_cluster`).

    Attributes:
        cluster: the ``ray.cluster_utils.Cluster`` (``cluster.remove_node(node)`` takes a node away).
        nodes: the added (non-head) nodes' handles, in the order asked.
        node_ids: their Ray node ids, in the same order.
        temp_dir: the cluster's ``RAY_TMPDIR`` (its session dir is below it); removed at the end.
    """

    cluster: Any
    nodes: list[Any]
    node_ids: list[str]
    temp_dir: str


@contextmanager
def local_cluster(head: dict[str, Any], workers: list[dict[str, Any]], *, prefix: str = "amlc-") -> Iterator[LocalCluster]:
    """Start a head and ``workers`` as separate Ray nodes on this machine, join it, and tear it all down after.

    For tests, drills and benchmarks of multi-node behaviour (``ray.cluster_utils.Cluster``; never
    ``ray stop``, which kills every Ray process on the machine). The quiet settings of :func:`init_ray`
    apply, in a fresh temp dir under ``/tmp`` (short: Ray's socket paths have a length limit). Returns
    only when every added node runs tasks (a task pinned to each answered), since ``wait_for_nodes`` can
    return before a node's raylet takes work.

    Teardown: ``ray.shutdown()``, ``Cluster.shutdown()`` (each added node's raylet, then the head's, then
    the GCS), then :func:`_kill_cluster_processes` SIGKILLs whatever process of this cluster still runs,
    before the temp dir is removed; the same when the head fails to start (``Cluster()`` raises: a raylet
    that waited too long for its agents' ports on a loaded machine). Ray alone does not guarantee that nothing is left: a raylet's graceful
    stop (SIGTERM) signals the process groups of the workers still registered with it (``raylet.out``:
    ``Stop: sending SIGTERM to pgid=...``), each worker has a process group of its own, and otherwise a
    worker ends itself when its core worker sees the raylet's pid gone, a check that a worker already
    disconnected (a graceful exit under way) no longer runs. A worker outside both is left with parent 1 in
    its own group: seen once, a ``ray::MapWorker(MapBatches(IngestFromFiles))`` 35 minutes after
    ``tests/test_cluster_two_nodes.py``.

    Args:
        head: ``head_node_args`` (``num_cpus``, ``resources``, ``_system_config`` ...); the dashboard is off.
        workers: one ``add_node`` keyword dict per extra node.
        prefix: the temp dir's name prefix.

    Yields:
        :class:`LocalCluster`; the driver is connected (``ray.init``) until the block ends.

    Raises:
        ray.exceptions.GetTimeoutError: a node did not run a task within 120 s.
    """
    tmp = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    os.environ.update({**QUIET_ENV, "RAY_TMPDIR": tmp})
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    cluster = None
    try:
        cluster = Cluster(initialize_head=True, head_node_args={"include_dashboard": False, **head})
        nodes = [cluster.add_node(**w) for w in workers]
        ray.init(address=cluster.address, **_driver_logging())
        cluster.wait_for_nodes()

        @ray.remote(num_cpus=0)
        def where() -> str:
            return ray.get_runtime_context().get_node_id()

        ids = [ray.get(where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False))
                       .remote(), timeout=120) for n in nodes]
        quiet_ray_data()
        yield LocalCluster(cluster=cluster, nodes=nodes, node_ids=ids, temp_dir=tmp)
    finally:
        try:
            ray.shutdown()
            if cluster is not None:  # None: the head did not start (what it started is killed below)
                cluster.shutdown()
        finally:
            _kill_cluster_processes(tmp)
            shutil.rmtree(tmp, ignore_errors=True)


#: Seconds :func:`_kill_cluster_processes` waits for the processes it killed to be gone.
CLUSTER_KILL_WAIT_S = 5.0


def _cluster_processes(temp_dir: str) -> list[Any]:
    """The processes of the local cluster whose ``RAY_TMPDIR`` is ``temp_dir``, other than this one.

    A process belongs to it when its command line names a path below ``temp_dir`` (the GCS, the raylets
    and their agents: ``--session-dir=<temp_dir>/ray/session_...``), or when its environment has
    ``RAY_TMPDIR=<temp_dir>`` and ``RAY_RAYLET_PID`` (what a raylet gives the workers it starts, inherited
    by their children); a worker's command line is only its title (``ray::MapWorker(...)``). This
    process's other children, which inherit ``RAY_TMPDIR`` but no raylet pid, are not included. Zombies
    (exited, not yet reaped) and processes this user may not read are skipped.

    Returns:
        ``psutil.Process`` objects, in the order ``psutil.process_iter`` gives them.
    """
    below = temp_dir.rstrip(os.sep) + os.sep
    return _processes(lambda cmdline, env: any(below in part for part in cmdline)
                      or (env().get("RAY_TMPDIR") == temp_dir and "RAY_RAYLET_PID" in env()))


def _processes(belongs: Callable[[list[str], Callable[[], dict[str, str]]], bool]) -> list[Any]:
    """The running processes other than this one for which ``belongs(cmdline, environ)`` is true (``environ``
    is read only when called); zombies and processes this user may not read are skipped.

    Returns:
        ``psutil.Process`` objects, in the order ``psutil.process_iter`` gives them.
    """
    import psutil  # after ray: Ray's own copy when the environment has none

    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if belongs(proc.info["cmdline"] or [], proc.environ):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _kill_cluster_processes(temp_dir: str, wait_s: float = CLUSTER_KILL_WAIT_S) -> list[int]:
    """SIGKILL every process of the local cluster in ``temp_dir`` (:func:`_cluster_processes`) and wait.

    Called by :func:`local_cluster` after ``Cluster.shutdown()``, when nothing of the cluster should be
    left; what is found then is a straggler (a worker its raylet did not signal), so there is no graceful
    step.

    Args:
        temp_dir: the cluster's ``RAY_TMPDIR``.
        wait_s: seconds to wait for the killed processes to be gone (exited or zombie).

    Returns:
        The pids still running after ``wait_s`` (:func:`_kill_and_wait`).
    """
    return _kill_and_wait(_cluster_processes(temp_dir), f"local cluster {temp_dir}", wait_s)


def shutdown_ray() -> list[int]:
    """``ray.shutdown()`` (a Ctrl-C during it is held to its end: :func:`aml_ray.interrupts.deferred`); then,
    when this process started the local cluster, SIGKILL the workers of its raylet that still run
    (environment ``RAY_RAYLET_PID`` = that raylet's pid: workers and their children).

    A raylet signals only the workers still registered with it when it stops, and a worker that already
    disconnected no longer watches its raylet's pid; one such worker (``ray::MapWorker(MapBatches(
    AnswerStage))`` of the test session's cluster) was found alive 22 minutes later with parent 1. A joined
    cluster's workers are never touched.

    Returns:
        The pids still running after the kill (:func:`_kill_and_wait`); empty almost always.
    """
    import ray

    from aml_ray import interrupts

    raylet = _own_raylet_pid() if _started_here else None
    with interrupts.deferred():  # interrupted, it left the core worker up and the teardown crashed (SIGSEGV)
        ray.shutdown()
    _rearm_faulthandler()
    if raylet is None or ray.is_initialized():  # still running (a test's stand-in shutdown): nothing to kill
        return []
    return _kill_and_wait(_raylet_processes(raylet), f"raylet {raylet}", CLUSTER_KILL_WAIT_S)


def _rearm_faulthandler() -> None:
    """Put faulthandler's crash report back after ``ray.shutdown()``, when it is enabled (``PYTHONFAULTHANDLER``).

    Ray's core worker puts its own SIGSEGV handler in at ``ray.init`` (it calls faulthandler's after its
    own) and resets the signal to the default action at shutdown, so a crash after the shutdown ended
    the process silently (-11 and no stack: measured with a script that segfaults before and after
    ``ray.shutdown()``).
    """
    if faulthandler.is_enabled():
        faulthandler.disable()
        faulthandler.enable(file=sys.stderr, all_threads=True)


def _own_raylet_pid() -> int | None:
    """The pid of the raylet of the head node this process started (Ray's ``Node``), or None (no head here)."""
    node = getattr(sys.modules["ray"]._private.worker, "_global_node", None)
    if node is None or not getattr(node, "head", False):
        return None
    procs = node.all_processes.get("raylet") or []
    return procs[0].process.pid if procs else None


def _raylet_processes(raylet_pid: int) -> list[Any]:
    """Processes other than this one whose environment says they were started by raylet ``raylet_pid``."""
    wanted = str(raylet_pid)
    return _processes(lambda cmdline, env: env().get("RAY_RAYLET_PID") == wanted)


def _kill_and_wait(procs: list[Any], what: str, wait_s: float) -> list[int]:
    """SIGKILL ``procs`` (``psutil.Process``) and wait up to ``wait_s`` seconds for them to be gone.

    ``psutil.Process.kill`` checks that the pid still names the process found (no reused pid is hit).

    Returns:
        The pids still running after ``wait_s`` (empty unless one is stuck in the kernel); each is logged
        as a warning naming ``what``.
    """
    import time

    import psutil

    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.kill()
    deadline = time.monotonic() + wait_s
    alive = procs
    while alive:
        alive = [p for p in alive if _running(p)]
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    if alive:
        import logging

        logging.getLogger(__name__).warning("%s: processes still running after SIGKILL: %s",
                                            what, [p.pid for p in alive])
    return [p.pid for p in alive]


def _running(proc: Any) -> bool:
    """Whether ``proc`` (a ``psutil.Process``) still runs: neither gone nor a zombie."""
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


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


#: Young-generation threshold of the garbage collector in the hot-path actors (CPython's default: 700).
ACTOR_GC_THRESHOLDS = (20_000, 20, 20)


#: ``prctl`` option number (linux/prctl.h).
_PR_SET_THP_DISABLE = 41


def tune_actor_process() -> bool:
    """Tune this Ray actor's process for many small requests: the garbage collector and huge pages.

    :func:`tune_actor_gc` and :func:`disable_transparent_huge_pages`. Called by the hot-path actors'
    constructors (participant and model clients, the pipeline's stage actors); does nothing outside a
    Ray actor (a driver or a test process keeps its own settings).

    Returns:
        True when this process is a Ray actor (and was tuned).
    """
    if not tune_actor_gc():
        return False
    disable_transparent_huge_pages()
    return True


def disable_transparent_huge_pages() -> bool:
    """Turn transparent huge pages off for this process (Linux ``prctl(PR_SET_THP_DISABLE)``).

    pyarrow's default memory pool, mimalloc, asks the kernel for transparent huge pages
    (``MADV_HUGEPAGE``) and returns freed pages to it about 10 ms later; the next Arrow allocation then
    faults in a fresh 2 MiB page, which the kernel zeroes whole, however little of it is used. A stage
    actor writes an Arrow IPC stream for every block it returns (:func:`use_arrow_ipc_serialization`),
    a few every second, so it paid that again and again (``perf``: the kernel's ``clear_page_erms``
    under ``do_huge_pmd_anonymous_page``, from ``arrow::ipc`` writes in ``store_task_outputs``). With
    4 KiB pages only the touched pages are faulted in: measured cheaper per write, and less of a core
    for the Ingest actor (docs/benchmarks.md).

    Returns:
        True when THP is now off for this process; False where the call is not available (not Linux,
        or a kernel without ``PR_SET_THP_DISABLE``): nothing else changes.
    """
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def tune_actor_gc() -> bool:
    """Make Python's cyclic garbage collector cheap in this Ray actor: freeze start-up objects, collect less often.

    An actor's heap holds Ray's, Arrow's and aiohttp's modules (about 136,000 tracked objects), and each
    request it serves allocates hundreds of short-lived objects, so CPython's defaults (a young
    collection every 700 allocations, traversals of the older generations every 10) spend a tenth of
    the actor's CPU in the collector (``perf``: ``gc_collect_main``, ``visit_decref``,
    ``visit_reachable``). ``gc.freeze()`` moves the objects alive after start-up to a generation the
    collector never traverses, and :data:`ACTOR_GC_THRESHOLDS` collect the young generation every
    20,000 allocations. Objects freed by reference counting (nearly all of them) are freed at once as
    before; only garbage cycles wait longer. Measured: the actor's CPU per Search down to what the same
    client needs in a plain process (docs/benchmarks.md).

    Before freezing, it makes pyarrow's first check for pandas
    (:func:`aml_ray.run.no_pandas.keep_pandas_out_of_pyarrow`): the first ``Table.from_pydict`` or
    ``from_pylist`` of a process with pandas installed (Ray Data needs it) imported pandas, 0.24 s of CPU,
    while the first Searches were in flight (the ``ParticipantClient``'s first ``search_table``:
    docs/benchmarks.md); now nothing imports it, unless Ray Data already had (its stage actors).

    Called by :func:`tune_actor_process`. Does nothing outside a Ray actor: a driver or a test process
    keeps its own settings.

    Returns:
        True when the collector was tuned (this process is a Ray actor).
    """
    import gc

    import ray

    if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return False
    from aml_ray.run.no_pandas import keep_pandas_out_of_pyarrow

    keep_pandas_out_of_pyarrow()  # see above
    gc.freeze()
    gc.set_threshold(*ACTOR_GC_THRESHOLDS)
    return True


def undo_worker_niceness() -> bool:
    """Run every thread of this process at nice 0, the driver's priority, undoing Ray's worker niceness.

    Ray starts every worker process at nice 15 (``RAY_worker_niceness``), so that its driver and raylet
    stay responsive. The actors that time a participant's or a model's calls (``ParticipantClient``,
    ``ModelClient``) then lose the CPU to any nice-0 process on their core, and the latencies they record
    are partly the scheduler's (measured: a higher Search p95 and a lower rate at nice 15;
    docs/benchmarks.md). Linux niceness is per thread, so every thread is
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


def _table_to_ipc(table):
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()  # a pa.Buffer: pickled out of band (protocol 5), read back without a copy


def _table_from_ipc(buffer):
    import pyarrow as pa

    return pa.ipc.open_stream(buffer).read_all()


def use_arrow_ipc_serialization() -> None:
    """Serialize Arrow tables between this process and Ray's object store as one Arrow IPC stream.

    Ray 2.60 pickles a ``pyarrow.Table`` column by column (``ray._private.arrow_serialization``, a
    workaround for ARROW-10739: pickling a sliced array carries the whole buffer) and runs several
    Arrow compute calls per array; a question-evidence block has about 60 arrays with the nested
    memories. One IPC stream measured far cheaper to write and to read back (docs/benchmarks.md), and it
    writes only a slice's own rows, so the bug stays worked around. Every block a stage returns pays
    this once, on the path each question takes.

    Uses Ray's public ``ray.util.register_serializer``, which applies to the calling process only: the
    driver (:func:`aml_ray.run.pipeline.run_pipeline`) and each stage actor (their constructors) call it.
    Idempotent; does nothing where Ray is not initialised (a stage built directly, as in tests).
    """
    import pyarrow as pa
    import ray
    from ray.util import register_serializer

    if not ray.is_initialized():
        return
    register_serializer(pa.Table, serializer=_table_to_ipc, deserializer=_table_from_ipc)
