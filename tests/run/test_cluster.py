"""The warm cluster (aml_ray.run.cluster, ``aml-ray cluster up|down``): ``up`` starts the client registry for
as long as the cluster is up, ``aml-ray run`` joins it and leaves it up, ``RAY_AUTH_MODE`` reaches only a
cluster a process starts, a stale record is ignored, and ``down`` leaves no process of it. A real ``ray start --head --block`` in a temp dir of its own (never ``ray stop``)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from aml_ray.run import cluster
from scripts.loopback_servers import ServerProcess

AML_RAY = str(Path(sys.executable).with_name("aml-ray"))


def _env(temp_dir: str) -> dict[str, str]:
    """The environment of a command run beside the warm cluster: its temp dir, no address, no auth setting."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    return {**env, "RAY_TMPDIR": temp_dir, "ANSWER_API_BASE": "", "JUDGE_API_BASE": ""}


def _joined(warm: cluster.WarmCluster, code: str) -> subprocess.CompletedProcess:
    """``python -c code`` joined to ``warm`` through ``RAY_ADDRESS``; its output captured."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**_env(warm.temp_dir), "RAY_ADDRESS": warm.address})


@pytest.fixture(scope="module")
def warm() -> Iterator[cluster.WarmCluster]:
    """``aml-ray cluster up --num-cpus 2`` in a short temp dir of its own; ``aml-ray cluster down`` after."""
    temp_dir = tempfile.mkdtemp(prefix="amlw-", dir="/tmp")  # short: Ray's socket paths have a length limit
    up = subprocess.run([AML_RAY, "cluster", "up", "--num-cpus", "2"], capture_output=True, text=True, timeout=600,
                        env=_env(temp_dir))
    assert up.returncode == 0, up.stdout + up.stderr
    record = cluster.read_state(temp_dir)
    assert record is not None and f"Ray cluster started at {record.address}" in " ".join(up.stdout.split())
    try:
        yield record
    finally:
        down = subprocess.run([AML_RAY, "cluster", "down"], capture_output=True, text=True, timeout=300,
                              env=_env(temp_dir))
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert down.returncode == 0, down.stdout + down.stderr


def test_up_again_finds_the_cluster_already_up(warm):
    again = subprocess.run([AML_RAY, "cluster", "up"], capture_output=True, text=True, timeout=120,
                           env=_env(warm.temp_dir))
    assert again.returncode == 0 and "already up" in again.stdout, again.stdout + again.stderr
    assert cluster.read_state(warm.temp_dir) == warm
    status = subprocess.run([AML_RAY, "cluster", "status"], capture_output=True, text=True, timeout=120,
                            env=_env(warm.temp_dir))
    assert status.returncode == 0 and warm.address in status.stdout


def test_up_starts_the_client_registry_for_as_long_as_the_cluster_is_up(warm):
    """Before any run, the cluster's client registry is alive and never exits idle: a run on the cluster does
    not wait for the registry's worker process to start."""
    code = ("import json, ray\n"
            "from aml_ray.actors.shared import NAMESPACE, REGISTRY_NAME\n"
            "ray.init()\n"
            "registry = ray.get_actor(REGISTRY_NAME, namespace=NAMESPACE)\n"
            "print(json.dumps(ray.get(registry.describe.remote(), timeout=60)))\n")
    found = _joined(warm, code)
    assert found.returncode == 0, found.stderr[-2000:]
    registry = json.loads(found.stdout.strip().splitlines()[-1])
    assert registry["idle_exit_s"] is None and len(registry["token"]) == 8


def test_aml_ray_run_joins_the_warm_cluster_and_leaves_it_up(warm, tmp_path, locomo_file):
    out = tmp_path / "run"
    with ServerProcess("participant", "--latency-ms", "1", "--add-latency-ms", "1", "--capacity", "64") as server:
        res = subprocess.run([AML_RAY, "run", "--participant", server.base_url, "--data", str(locomo_file),
                              "--limit-samples", "1", "--retrieval-only", "--out", str(out)],
                             capture_output=True, text=True, timeout=600, env=_env(warm.temp_dir))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "completed"
    assert info["ray_cluster"]["started_here"] is False
    assert info["ray_cluster"]["address"].rpartition(":")[2] == warm.address.rpartition(":")[2]  # its GCS port
    assert "ray_shutdown_s" in info["timings"] and cluster.is_up(warm)  # disconnected; the cluster runs on


def test_auth_mode_is_set_only_for_a_cluster_the_process_starts(warm):
    """Joining (here through ``RAY_ADDRESS``) leaves ``RAY_AUTH_MODE`` unset; starting a local cluster sets it
    to ``disabled`` for that cluster."""
    code = ("import json, os, ray\n"
            "from aml_ray.run.ray_runtime import init_ray, shutdown_ray, started_here\n"
            "assert init_ray(num_cpus=1)\n"
            "print(json.dumps([started_here(), os.environ.get('RAY_AUTH_MODE')]))\n"
            "shutdown_ray()\n")
    joined = _joined(warm, code)
    own_tmp = tempfile.mkdtemp(prefix="amlo-", dir="/tmp")
    try:
        own = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                             env=_env(own_tmp))
    finally:
        shutil.rmtree(own_tmp, ignore_errors=True)
    assert joined.returncode == 0 and own.returncode == 0, joined.stderr[-2000:] + own.stderr[-2000:]
    assert json.loads(joined.stdout.strip().splitlines()[-1]) == [False, None]
    assert json.loads(own.stdout.strip().splitlines()[-1]) == [True, "disabled"]


def test_a_stale_record_is_ignored(tmp_path):
    """A record whose process has ended (a machine restarted, a killed ``ray start``) names no cluster: the
    run starts its own."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    cluster.state_file(str(tmp_path)).write_text(json.dumps(
        {"address": "127.0.0.1:9", "pid": int(dead.stdout), "temp_dir": str(tmp_path), "num_cpus": 1}))
    assert cluster.running_address(str(tmp_path)) is None
    assert cluster.running_address(str(tmp_path / "nothing")) is None


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_down_stops_every_process_of_the_cluster(caplog):
    """``ray start --block`` stops its node itself, without Ray's 30 s drain wait that SIGTERM starts (the
    detached client registry keeps the node from draining): nothing is left for ``down`` to kill."""
    temp_dir = tempfile.mkdtemp(prefix="amld-", dir="/tmp")
    try:
        warm, started = cluster.up(temp_dir, num_cpus=1)
        assert started and cluster.running_address(temp_dir) == warm.address
        owner = psutil.Process(warm.pid)
        below = owner.children(recursive=True)
        assert any(p.name() == "raylet" for p in below) and any(p.name() == "gcs_server" for p in below)
        with caplog.at_level(logging.WARNING, logger="aml_ray.run.cluster"):
            assert cluster.down(temp_dir, timeout_s=15) == warm
        assert [r.getMessage() for r in caplog.records] == []
        assert [p.pid for p in [owner, *below] if _running(p)] == []
        assert cluster.read_state(temp_dir) is None and cluster.down(temp_dir) is None
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


_TIMED_OUT_RAY = """#!/bin/sh
# the first 'ray start' ends as Ray's does when its node does not register within 30 s; later ones are the real one
if [ ! -e "$0.tried" ]; then
  touch "$0.tried"
  echo "Exception: The current node timed out during startup. This could happen because some of the raylet"
  exit 1
fi
exec {ray} "$@"
"""


def test_up_starts_again_when_rays_node_start_times_out(tmp_path, monkeypatch):
    """Beside two CPU hogs ``ray start`` gave up after Ray's fixed 30 s node-start wait and ``aml-ray cluster up``
    failed; ``up`` starts it once more (here a ``ray`` whose first start ends so), and both outputs stay in its log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ray").write_text(_TIMED_OUT_RAY.format(ray=Path(sys.executable).with_name("ray")))
    (bin_dir / "python").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")  # keeps the venv
    for name in ("ray", "python"):
        (bin_dir / name).chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    temp_dir = tempfile.mkdtemp(prefix="amlr-", dir="/tmp")
    try:
        started, new = cluster.up(temp_dir, num_cpus=1, timeout_s=300)
        assert new and cluster.is_up(started) and (bin_dir / "ray.tried").exists()
        log = (Path(temp_dir) / "aml-ray-cluster.log").read_text()
        assert "The current node timed out during startup" in log and cluster.STARTED_LINE in log
    finally:
        cluster.down(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
