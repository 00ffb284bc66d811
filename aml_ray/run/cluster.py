"""A warm local Ray cluster that ``aml-ray run`` joins instead of starting one (``aml-ray cluster up|down``).

``up`` runs ``ray start --head --block`` in a session of its own with the settings of a cluster aml-ray
starts (:data:`aml_ray.run.ray_runtime.QUIET_ENV`, :data:`aml_ray.run._ray_internals.SYSTEM_CONFIG`, no
dashboard, bound to 127.0.0.1), starts the cluster's client registry for as long as the cluster is up
(:func:`aml_ray.actors.shared.start_registry`: a run on the cluster then does not wait for its worker
process to start before its first Add), and records its address and process in
``<temp dir>/aml-ray-cluster.json`` (:func:`state_file`). :func:`running_address` reads that file back for
:func:`aml_ray.run.ray_runtime.cluster_address`: the recorded process still runs and the GCS port accepts a
connection, else there is no warm cluster (a stale file is ignored). ``down`` sends that process SIGINT (the
Ctrl-C that ends ``ray start --block`` at a terminal), on which it stops every process of its node, and removes
the file; never ``ray stop``, which stops every Ray cluster on the machine. Not SIGTERM: on SIGTERM Ray first
drains the node for Serve's sake, for up to 30 s, and the client registry, a detached actor that holds its
worker, keeps the node from draining, so every stop would wait the whole 30 s.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger("aml_ray.run.cluster")

#: The state file's name inside the cluster's temp dir.
STATE_NAME = "aml-ray-cluster.json"
#: What ``ray start`` prints once the node runs (its ``--block`` loop starts right after).
STARTED_LINE = "Ray runtime started."
#: Seconds a connection to the GCS port may take before the cluster counts as down.
CONNECT_TIMEOUT_S = 0.5
#: What ``up`` runs (``python -c``, the address as its argument) to start the new cluster's registry for good:
#: a driver of its own, so the calling process never connects to Ray.
START_REGISTRY = ("import logging, sys, ray\n"
                  "from aml_ray.actors.shared import start_registry\n"
                  "ray.init(address=sys.argv[1], logging_level=logging.ERROR, log_to_driver=False)\n"
                  "print('client registry', start_registry(), flush=True)\n"
                  "ray.shutdown()\n")


@dataclass(frozen=True)
class WarmCluster:
    """A warm cluster's record.

    Attributes:
        address: the GCS address, ``127.0.0.1:<port>`` (what ``ray.init(address=...)`` takes).
        pid: the ``ray start --block`` process that owns the node.
        temp_dir: the cluster's ``RAY_TMPDIR`` (its sessions and ``ray start``'s output, ``aml-ray-cluster.log``).
        num_cpus: the CPUs it offers.
    """

    address: str
    pid: int
    temp_dir: str
    num_cpus: int


def state_file(temp_dir: str) -> Path:
    """``<temp_dir>/aml-ray-cluster.json``: the warm cluster's record."""
    return Path(temp_dir) / STATE_NAME


def read_state(temp_dir: str) -> WarmCluster | None:
    """The record in ``temp_dir``, or None when there is none or it cannot be read (a half-written file)."""
    try:
        return WarmCluster(**json.loads(state_file(temp_dir).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def is_up(cluster: WarmCluster) -> bool:
    """Whether ``cluster``'s ``ray start`` process still runs and its GCS port accepts a connection."""
    import psutil

    try:
        if psutil.Process(cluster.pid).status() == psutil.STATUS_ZOMBIE:
            return False
    except psutil.Error:
        return False
    host, _, port = cluster.address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            return True
    except (OSError, ValueError):
        return False


def running_address(temp_dir: str) -> str | None:
    """The address of the warm cluster recorded in ``temp_dir`` when it is up (:func:`is_up`), else None."""
    cluster = read_state(temp_dir)
    return cluster.address if cluster is not None and is_up(cluster) else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read_from(path: Path, offset: int) -> str:
    """The text of ``path`` from byte ``offset`` on."""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def up(temp_dir: str, *, num_cpus: int | None = None, timeout_s: float = 120.0) -> tuple[WarmCluster, bool]:
    """Start the warm cluster in ``temp_dir``, unless one is up there already.

    Args:
        temp_dir: its ``RAY_TMPDIR`` (created when missing).
        num_cpus: the CPUs it offers (default: all of the machine's).
        timeout_s: seconds to wait for ``ray start`` to say the node runs, and then for the client registry
            to start. A start that ends in Ray's fixed 30 s node-start timeout (a loaded machine:
            :mod:`aml_ray.run._ray_internals`) is made again, up to
            :data:`~aml_ray.run.ray_runtime.LOCAL_START_ATTEMPTS` starts, each with ``timeout_s`` of its own
            (beside two CPU hogs and a test session, one start took 50 s of ``ray start``'s imports and
            Ray's wait before it ended so).

    Returns:
        ``(the cluster, True)`` when this call started it; ``(the one already up, False)`` otherwise.

    Raises:
        RuntimeError: ``ray start`` exited or stayed silent for ``timeout_s`` (on its last start), or the
            client registry did not start within ``timeout_s``; the message holds the end of their output
            (``<temp_dir>/aml-ray-cluster.log``), and what it started is stopped.
    """
    import psutil

    from aml_ray.run._ray_internals import NODE_START_TIMEOUT, SYSTEM_CONFIG
    from aml_ray.run.ray_runtime import LOCAL_START_ATTEMPTS, QUIET_ENV

    existing = read_state(temp_dir)
    if existing is not None and is_up(existing):
        return existing, False
    Path(temp_dir).mkdir(parents=True, exist_ok=True)
    cpus = num_cpus or psutil.cpu_count() or 1
    env = {**os.environ, **QUIET_ENV, "RAY_TMPDIR": temp_dir}
    env.pop("RAY_ADDRESS", None)
    log = Path(temp_dir) / "aml-ray-cluster.log"
    log.write_text("")
    for attempt in range(1, LOCAL_START_ATTEMPTS + 1):
        port, since, deadline = _free_port(), log.stat().st_size, time.monotonic() + timeout_s
        cmd = [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", "--port", str(port),
               "--node-ip-address", "127.0.0.1", "--num-cpus", str(cpus), "--include-dashboard", "false",
               "--disable-usage-stats", "--system-config", json.dumps(SYSTEM_CONFIG)]
        with open(log, "a") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)  # a terminal's Ctrl-C never reaches it
        cluster = WarmCluster(address=f"127.0.0.1:{port}", pid=proc.pid, temp_dir=temp_dir, num_cpus=cpus)
        while STARTED_LINE not in (said := _read_from(log, since)):
            if proc.poll() is not None or time.monotonic() > deadline:
                _stop(proc.pid, timeout_s=30)
                said = _read_from(log, since)  # to its last line
                if NODE_START_TIMEOUT in said and attempt < LOCAL_START_ATTEMPTS:
                    break  # Ray's fixed 30 s node-start wait ran out (a loaded machine): start once more
                tail = log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"ray start did not start the cluster (exit {proc.poll()}); its output "
                                   f"({log}):\n{tail}")
            time.sleep(0.1)
        else:  # the node runs: no other start
            break
    with open(log, "a") as out:
        try:
            started = subprocess.run([sys.executable, "-c", START_REGISTRY, cluster.address], env=env,
                                     stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                     timeout=timeout_s).returncode == 0
        except subprocess.TimeoutExpired:
            started = False
    if not started:
        _stop(proc.pid, timeout_s=30)
        tail = log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"the cluster's client registry did not start; the output ({log}):\n{tail}")
    state_file(temp_dir).write_text(json.dumps(asdict(cluster)))
    return cluster, True


def down(temp_dir: str, *, timeout_s: float = 60.0) -> WarmCluster | None:
    """Stop the warm cluster recorded in ``temp_dir`` and remove its record.

    Args:
        temp_dir: its ``RAY_TMPDIR``.
        timeout_s: seconds to wait for ``ray start --block`` to stop its node after SIGINT; then SIGKILL.

    Returns:
        The cluster it stopped, or None when no record was there (a stale record is removed too).
    """
    cluster = read_state(temp_dir)
    if cluster is not None:
        _stop(cluster.pid, timeout_s=timeout_s)
    state_file(temp_dir).unlink(missing_ok=True)
    return cluster


def _stop(pid: int, *, timeout_s: float) -> None:
    """SIGINT the ``ray start --block`` process ``pid`` (Ctrl-C: it stops its node's processes, then exits) and
    wait up to ``timeout_s`` for it to end; then SIGKILL it and every process below it (the GCS, the raylet,
    its agents and workers) that still runs, and log a warning that says so."""
    import psutil

    try:
        proc = psutil.Process(pid)
        below = proc.children(recursive=True)
        proc.send_signal(signal.SIGINT)
    except psutil.Error:
        return
    try:
        proc.wait(timeout=timeout_s)
    except psutil.TimeoutExpired:
        log.warning("ray start --block (pid %d) did not stop its node within %.0f s of SIGINT; killing it and "
                    "its %d processes", pid, timeout_s, len(below))
        for p in [proc, *below]:
            with contextlib.suppress(psutil.Error):
                p.kill()
    except psutil.Error:
        pass
