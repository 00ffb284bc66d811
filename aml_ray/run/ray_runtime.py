"""Starting (or joining) Ray with the settings measured on small machines (docs/ray-notes.md).

Which cluster (:func:`cluster_address`): an ``address`` passed in, else ``$RAY_ADDRESS``, else the local
cluster ``aml-ray cluster up`` keeps warm (:mod:`aml_ray.run.cluster`), else a new local cluster that this
process starts with ``ray.init`` and stops with ``ray.shutdown()`` (:func:`shutdown_ray`). Joining a warm
cluster skips the cluster's start (seconds on a small machine; docs/benchmarks.md).

A cluster this process starts is quiet: usage stats off, token auth off (``RAY_AUTH_MODE=disabled``, set
only for such a cluster), no dashboard, a private temp dir, and aml-ray's system config
(:mod:`aml_ray.run._ray_internals`). ``address="local"`` is passed, so a stale address file from an earlier
``ray start`` is never joined by accident.

Console (:func:`set_verbose`; ``aml-ray run`` calls it with its ``--verbose`` flag): quiet keeps Ray's own
Python log lines off the console, since a user cannot act on them and they read as failures (Ray Data's
``max_errored_blocks`` advice, "Exception occurred in user code" when the contract stops a run). The run
reports its own errors, and ``run.json`` and the evidence name each one. What quiet keeps off the console:

- the workers' output (``log_to_driver=False``); it stays in ``<session>/logs/worker-*.out|err``;
- Ray Data's console handler; its errors stay in the session's ``logs/ray-data/`` files;
- the driver's ``ray`` Python logger below critical (it writes no file: ``--verbose`` to see it).

Verbose gives Ray's defaults (``ray`` logger at info, Ray Data's console lines, the workers' output).
Without a call (tests, the service, scripts) the ``ray`` logger prints warnings and Ray Data errors.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aml_ray.run._ray_internals import SYSTEM_CONFIG, node_start_timed_out

#: The environment of a cluster this process starts (``RAY_AUTH_MODE`` never reaches a cluster it joins).
QUIET_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "RAY_DEDUP_LOGS": "0"}

#: Tries :func:`init_ray` (and ``aml-ray cluster up``) gives the start of a local cluster that ends in Ray's
#: node-start timeout. Each such start costs about 45 s. The raylet gives its dashboard agent a fixed 15 s to
#: start (a Python process: importing ``ray.dashboard.agent`` alone is 0.6 s of CPU), which a 2-core machine at
#: load 15-21 exceeded three starts in a row; the load comes and goes, so a start made again can get through.
LOCAL_START_ATTEMPTS = 5

#: This process started the local cluster it is connected to (:func:`init_ray`; :func:`shutdown_ray`).
_started_here = False
#: None: no :func:`set_verbose` call (library defaults); False: quiet console; True: Ray's defaults.
_verbose: bool | None = None


def set_verbose(verbose: bool) -> None:
    """Show Ray's own log lines on this process's console (True) or keep them off it (False).

    Call it before Ray starts: the logger settings apply at the next :func:`init_ray` or
    :func:`local_cluster`, Ray Data's at the next :func:`quiet_ray_data`; see the module docstring for what
    quiet keeps off the console and where those lines still go.
    """
    global _verbose
    _verbose = verbose


def default_temp_dir() -> str:
    """``$RAY_TMPDIR``, else ``<system temp>/aml-ray``: the temp dir of the clusters aml-ray starts (short:
    Ray's socket paths have a length limit)."""
    return os.environ.get("RAY_TMPDIR") or str(Path(tempfile.gettempdir()) / "aml-ray")


def cluster_address(address: str | None = None) -> str | None:
    """The address of the cluster :func:`init_ray` joins, or None when it starts a local one.

    ``address``, else ``$RAY_ADDRESS``, else the warm cluster of ``aml-ray cluster up`` in
    :func:`default_temp_dir` when it is up (:func:`aml_ray.run.cluster.running_address`); ``"local"`` in
    either of the first two means a new local cluster.
    """
    from aml_ray.run.cluster import running_address

    given = address or os.environ.get("RAY_ADDRESS")
    if given:
        return None if given == "local" else given
    return running_address(default_temp_dir())


def init_ray(*, num_cpus: int | None = None, address: str | None = None) -> bool:
    """Initialise Ray unless it already is: join the cluster :func:`cluster_address` names, or start a local one.

    Args:
        num_cpus: CPUs for a local cluster started here (default: all of the machine's); ignored when joining.
        address: a cluster address; default :func:`cluster_address`'s choice.

    Returns:
        True when this call connected this process to Ray (the caller then calls :func:`shutdown_ray`),
        False when Ray was running in this process already.

    Raises:
        Exception: Ray's node-start timeout on the last of :data:`LOCAL_START_ATTEMPTS` starts of a local
            cluster. Ray waits a fixed 30 s for the node it starts to register (no setting changes it:
            :mod:`aml_ray.run._ray_internals`), and the raylet a fixed 15 s for its agents' ports, which a
            loaded machine can exceed (the raylet then aborts); each start that ends so is logged as a
            warning, its processes are killed (:func:`_start_processes`) and the start is made again, in a
            new session dir.
        Whatever else ``ray.init`` raises, at once.
    """
    import ray

    global _started_here
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    join = cluster_address(address)
    kwargs: dict[str, Any] = {"include_dashboard": False, **_driver_logging()}
    if join is None:
        for key, value in QUIET_ENV.items():  # the cluster started here inherits them
            os.environ.setdefault(key, value)
        tmp = os.environ.setdefault("RAY_TMPDIR", default_temp_dir())
        Path(tmp).mkdir(parents=True, exist_ok=True)
        kwargs.update(num_cpus=num_cpus, _system_config=SYSTEM_CONFIG)
    _started_here = join is None  # before ray.init: a Ctrl-C inside it still leaves through shutdown_ray
    if join is not None:
        ray.init(address=join, **kwargs)
        return True
    for attempt in range(1, LOCAL_START_ATTEMPTS):
        before = {p.pid for p in _children()}
        try:
            ray.init(address="local", **kwargs)
            return True
        except Exception as exc:
            if not node_start_timed_out(exc):
                raise
            import logging

            logging.getLogger(__name__).warning("Ray's local cluster did not start (%s); start %d of %d, "
                                                "starting again", exc, attempt, LOCAL_START_ATTEMPTS)
            _kill_and_wait(_start_processes(before), "a local cluster's timed-out start", CLUSTER_KILL_WAIT_S)
    ray.init(address="local", **kwargs)
    return True


def _children() -> list[Any]:
    """This process's descendants (``psutil.Process`` objects), or an empty list when they cannot be read."""
    import psutil

    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def _start_processes(before: set[int]) -> list[Any]:
    """The processes a ``ray.init`` that failed left running: this process's descendants not in ``before``
    (pids) whose command line names a path in Ray's package (the GCS and raylet binaries, the agents'
    scripts) or below this process's ``RAY_TMPDIR``. A failed ``ray.init`` keeps no handle on them, and they
    live as long as this process (Ray's fate sharing ends them only with it); other children this process
    started meanwhile (a reference system) name neither path and are left alone."""
    import psutil
    import ray

    roots = [str(Path(ray.__file__).parent) + os.sep]
    if os.environ.get("RAY_TMPDIR"):
        roots.append(os.environ["RAY_TMPDIR"].rstrip(os.sep) + os.sep)
    found = []
    for proc in _children():
        if proc.pid in before:
            continue
        with contextlib.suppress(psutil.Error):
            if any(root in part for part in proc.cmdline() for root in roots):
                found.append(proc)
    return found


def started_here() -> bool:
    """Whether this process started the local cluster it is connected to (no other process uses it)."""
    ray = sys.modules.get("ray")
    return _started_here and ray is not None and ray.is_initialized()


def _driver_logging() -> dict[str, Any]:
    """``ray.init`` arguments for the driver's ``ray`` logger and the workers' output (module docstring)."""
    if _verbose:
        return {"log_to_driver": True, "logging_level": "info"}
    return {"log_to_driver": False, "logging_level": "warning" if _verbose is None else "critical"}


def quiet_ray_data() -> None:
    """Ray Data's settings for this process's pipelines: its console lines and progress bars off (the CLI shows
    its own; see the module docstring), and no per-task memory poll.

    Called where a Ray Data pipeline is built (:func:`aml_ray.run.pipeline._ray_data_stages`), not when Ray
    starts: importing ``ray.data`` costs about 0.3 s of CPU, which a single-stage job, run without Ray
    Data, need not spend. Idempotent.
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
    the GCS), then :func:`kill_cluster_processes` SIGKILLs whatever process of this cluster still runs,
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
            kill_cluster_processes(tmp)
            shutil.rmtree(tmp, ignore_errors=True)


#: Seconds :func:`kill_cluster_processes` waits for the processes it killed to be gone.
CLUSTER_KILL_WAIT_S = 5.0


def cluster_processes(temp_dir: str) -> list[Any]:
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


def kill_cluster_processes(temp_dir: str, wait_s: float = CLUSTER_KILL_WAIT_S) -> list[int]:
    """SIGKILL every process of the local cluster in ``temp_dir`` (:func:`cluster_processes`) and wait.

    Called by :func:`local_cluster` after ``Cluster.shutdown()``, when nothing of the cluster should be
    left; what is found then is a straggler (a worker its raylet did not signal), so there is no graceful
    step.

    Args:
        temp_dir: the cluster's ``RAY_TMPDIR``.
        wait_s: seconds to wait for the killed processes to be gone (exited or zombie).

    Returns:
        The pids still running after ``wait_s`` (:func:`_kill_and_wait`).
    """
    return _kill_and_wait(cluster_processes(temp_dir), f"local cluster {temp_dir}", wait_s)


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

    global _started_here
    raylet = _own_raylet_pid() if _started_here else None
    with interrupts.deferred():  # interrupted, it left the core worker up and the teardown crashed (SIGSEGV)
        ray.shutdown()
    _rearm_faulthandler()
    if not ray.is_initialized():
        _started_here = False
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
    """The pid of the raylet this process started (a child of this process named ``raylet``: ``ray.init``
    starts the head node's processes as its children), or None (no raylet of this process runs)."""
    import psutil

    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error):
                if child.name() == "raylet":
                    return child.pid
    return None


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


def in_ray_actor() -> bool:
    """Whether this process is a Ray actor's worker (False in a driver, a test process, or before Ray starts)."""
    import ray

    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


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

    Called by :func:`tune_actor_process`. Does nothing outside a Ray actor: a driver or a test process
    keeps its own settings.

    Returns:
        True when the collector was tuned (this process is a Ray actor).
    """
    import gc

    if not in_ray_actor():
        return False
    gc.freeze()
    gc.set_threshold(*ACTOR_GC_THRESHOLDS)
    return True


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

    Ray 2.60 pickles a ``pyarrow.Table`` column by column (its Arrow serialization module, a
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
