"""aml_ray.run.ray_runtime: a local cluster's start survives Ray's fixed node-start timeout (init_ray), nothing of
a cluster started here outlives it (shutdown_ray); Arrow tables cross Ray's object store as one IPC stream
(use_arrow_ipc_serialization); hot-path actors tune the garbage collector and turn transparent huge pages off
(tune_actor_process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from aml_ray.run.evidence import QUESTION_SCHEMA, empty_question_row, to_table
from aml_ray.run.ray_runtime import (ACTOR_GC_THRESHOLDS, LOCAL_START_ATTEMPTS, _table_to_ipc, tune_actor_process,
                                    use_arrow_ipc_serialization)


def _questions(n: int) -> pa.Table:
    return to_table([empty_question_row() | {"question_id": f"q{i}", "question": "When did Caroline go? " * 4,
                                             "memories": [{"id": f"m{k}", "content": "memory " * 20, "score": 0.5}
                                                          for k in range(10)]}
                     for i in range(n)], QUESTION_SCHEMA)


def test_a_slice_is_serialized_without_the_rest_of_its_buffers():
    whole = _questions(1_000)
    part = whole.slice(500, 10)
    assert _table_to_ipc(part).size < _table_to_ipc(whole).size / 50  # ARROW-10739 stays worked around


def test_tables_round_trip_through_the_object_store(ray_session):
    import ray

    use_arrow_ipc_serialization()
    use_arrow_ipc_serialization()  # idempotent
    table = _questions(300)
    part = table.slice(100, 7)
    assert ray.get(ray.put(part)).equals(part)

    @ray.remote(num_cpus=0)
    def stage_output(n: int) -> pa.Table:
        use_arrow_ipc_serialization()
        return _questions(n).slice(2, n - 3)  # a stage actor's block, as the pipeline's stages return them

    back = ray.get(stage_output.remote(20))
    assert back.schema.equals(QUESTION_SCHEMA) and back.num_rows == 17
    assert back.column("question_id").to_pylist() == [f"q{i}" for i in range(2, 19)]
    assert back.column("memories")[0].as_py()[3] == {"id": "m3", "content": "memory " * 20, "score": 0.5,
                                                     "created_at": None, "parts": None}
    assert ray.get(ray.put(QUESTION_SCHEMA.empty_table())).num_rows == 0


def _thp_enabled() -> str:
    return Path("/proc/self/status").read_text().split("THP_enabled:")[1].split()[0]


def test_gc_and_huge_pages_are_tuned_in_an_actor_and_left_alone_in_the_driver(ray_session):
    import gc

    import ray

    before = gc.get_threshold(), gc.get_freeze_count(), _thp_enabled()
    assert tune_actor_process() is False  # the driver (here: the test process) keeps its own settings
    assert (gc.get_threshold(), gc.get_freeze_count(), _thp_enabled()) == before
    assert before[2] == "1"  # huge pages allowed, as every process starts

    @ray.remote(num_cpus=0)
    class Probe:
        def __init__(self):
            self.thp_before = _thp_enabled()
            self.tuned = tune_actor_process()

        def state(self):
            return self.tuned, gc.get_threshold(), gc.get_freeze_count(), self.thp_before, _thp_enabled()

    probe = Probe.remote()
    tuned, thresholds, frozen, thp_before, thp_after = ray.get(probe.state.remote())
    ray.kill(probe)
    assert tuned is True and thresholds == ACTOR_GC_THRESHOLDS
    assert (thp_before, thp_after) == ("1", "0")  # huge pages: on as Ray started it, off once tuned
    assert frozen > 10_000  # the start-up objects (Ray's own modules) are out of the collector's reach


def test_disabling_huge_pages_keeps_arrow_writes_working():
    # in a child process: the flag is per process and inherited, and this test process must keep its own
    import subprocess
    import sys

    code = ("from aml_ray.run.ray_runtime import disable_transparent_huge_pages, _table_to_ipc\n"
            "import pyarrow as pa\n"
            "print(disable_transparent_huge_pages())\n"
            "print(open('/proc/self/status').read().split('THP_enabled:')[1].split()[0])\n"
            "t = pa.table({'x': list(range(100_000))})\n"
            "print(pa.ipc.open_stream(_table_to_ipc(t)).read_all().equals(t))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["True", "0", "True"]
    assert _thp_enabled() == "1"


def test_ray_data_map_tasks_run_without_the_memory_poll_thread(ray_session):
    # quiet_ray_data (called where a pipeline's Ray Data stages are built) turns Ray Data's per-task memory
    # poll off: no thread reading the process's memory beside every map task (Ray's default, 1 s, starts one
    # named after its target, poll_uss)
    import threading

    import ray.data

    from aml_ray.run.ray_runtime import quiet_ray_data

    quiet_ray_data()

    assert ray.data.DataContext.get_current().memory_usage_poll_interval_s is None

    def polling(batch: dict) -> dict:
        return {"poll": [any("poll_uss" in t.name for t in threading.enumerate())] * len(batch["id"])}

    rows = ray.data.range(4, override_num_blocks=2).map_batches(polling, num_cpus=0.1).take_all()
    assert [r["poll"] for r in rows] == [False] * 4


_OWN_CLUSTER_STRAGGLER = """
import json, os, subprocess, sys
import ray
from aml_ray.run.ray_runtime import init_ray, shutdown_ray

STRAGGLER = 'setsid "$0" -c "import time; time.sleep(900)" </dev/null >/dev/null 2>&1 & echo $!'

@ray.remote(num_cpus=0)
def leave_straggler() -> int:
    return int(subprocess.run(["sh", "-c", STRAGGLER, sys.executable], capture_output=True, text=True,
                              check=True).stdout)

assert init_ray(num_cpus=1)
pid = ray.get(leave_straggler.remote(), timeout=120)
print(json.dumps({"straggler": pid, "still_running": shutdown_ray()}))
"""


def test_no_worker_of_a_cluster_started_here_outlives_its_shutdown(tmp_path):
    """shutdown_ray: a process a worker of this process's own cluster started in a session of its own (parent
    1, its own process group, the worker's environment, as the MapWorker found alive 22 minutes after a test
    session's end) is killed; plain ``ray.shutdown()`` left it running."""
    import json
    import os
    import subprocess
    import sys
    import time

    import psutil

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run([sys.executable, "-c", _OWN_CLUSTER_STRAGGLER], capture_output=True, text=True,
                         timeout=240, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    said = json.loads(out.stdout.strip().splitlines()[-1])
    pid = said["straggler"]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            alive = psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            alive = False
        if not alive:
            break
        time.sleep(0.1)
    if alive:
        psutil.Process(pid).kill()
    assert not alive and said["still_running"] == []


def test_a_crash_after_ray_shutdown_still_prints_every_threads_stack():
    """``ray.shutdown()`` resets SIGSEGV to the default action (Ray's core worker had put its own handler in
    at ``ray.init``): a crash after it ended the process with -11 and nothing on the console, as the
    clean-clone CI's ``aml-ray run`` did after its "interrupted" message. :func:`shutdown_ray` enables
    faulthandler again. The child starts a local cluster of its own (no ``RAY_ADDRESS``)."""
    code = ("import ctypes\n"
            "from aml_ray.run.ray_runtime import init_ray, shutdown_ray\n"
            "init_ray(num_cpus=1)\n"
            "shutdown_ray()\n"
            "ctypes.string_at(0)\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**env, "PYTHONFAULTHANDLER": "1"})
    assert out.returncode == -11
    assert "Fatal Python error: Segmentation fault" in out.stderr and 'line 5 in <module>' in out.stderr, out.stderr


_REGISTRATION_CODE = """
import json, psutil, ray
from aml_ray.run.ray_runtime import _own_raylet_pid, init_ray
init_ray(num_cpus=2)
under = []
for proc in psutil.Process(_own_raylet_pid()).children(recursive=True):
    try:
        under.append(" ".join(proc.cmdline()).split()[0][:100])  # a Ray process's title: ray::DashboardAgent
    except psutil.Error:
        pass
print(json.dumps(under))
ray.shutdown()
"""


def test_a_cluster_started_here_starts_no_worker_at_the_drivers_registration():
    """The raylet answers a driver's registration only after starting the workers it prestarts, and the
    driver waits for that answer holding the GIL. A cluster ``init_ray`` starts prestarts none
    (``prestart_worker_first_driver`` in :data:`aml_ray.run._ray_internals.SYSTEM_CONFIG`): once ``init_ray``
    returns, the raylet runs its two agents and no worker; the first actors' workers start when they are
    created."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run([sys.executable, "-c", _REGISTRATION_CODE], capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    under = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted(under) == ["ray::DashboardAgent", "ray::RuntimeEnvAgent"], under


_TIMED_OUT_START = """
import json, subprocess, sys
from pathlib import Path
import psutil, ray
from aml_ray.run import ray_runtime

real_init, calls, left = ray.init, [], []

def init(**kwargs):
    calls.append(kwargs["address"])
    if len(calls) == 1:  # what a loaded machine gives: the node's processes run, its registration came too late
        raylet = str(Path(ray.__file__).parent / "core/src/ray/raylet/raylet")
        left.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", raylet],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        raise Exception("The current node timed out during startup. This could happen because some of the "
                        "raylet failed to startup or the GCS has become overloaded.")  # Ray 2.60's words
    return real_init(**kwargs)

ray.init = init
try:
    started = ray_runtime.init_ray(num_cpus=1)
    left_exit = left[0].poll()
    answer = ray.get(ray.remote(lambda: 42).remote(), timeout=120)
    ray_runtime.shutdown_ray()
finally:
    for proc in left:
        proc.kill()  # a no-op once it is gone
print(json.dumps({"started": started, "calls": calls, "answer": answer, "left_exit": left_exit}))
"""


def test_a_local_start_that_hits_rays_node_timeout_is_made_again_without_the_first_starts_processes():
    """Ray waits a fixed 30 s for the node ``ray.init`` starts to register; beside two CPU hogs a test's
    ``aml-ray run`` exceeded it and exited 1. ``init_ray`` kills what that start left running (here a process
    named like the raylet) and starts once more; the second start's cluster runs tasks."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run([sys.executable, "-c", _TIMED_OUT_START], capture_output=True, text=True, timeout=240,
                         env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert said == {"started": True, "calls": ["local", "local"], "answer": 42, "left_exit": -9}, said
    assert "did not start" in out.stderr and f"start 1 of {LOCAL_START_ATTEMPTS}, starting again" in out.stderr, \
        out.stderr[-2000:]


def test_a_local_start_that_fails_otherwise_is_not_made_again(monkeypatch):
    """Only Ray's node-start timeout is worth a second start; any other failure of ``ray.init`` is raised at once."""
    import ray

    from aml_ray.run import ray_runtime

    calls = []

    def init(**kwargs):
        calls.append(kwargs["address"])
        raise ValueError("num_cpus must be positive")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray_runtime, "_started_here", False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", "/tmp/aml-ray-not-started")
    monkeypatch.setattr(ray_runtime, "cluster_address", lambda address=None: None)
    with pytest.raises(ValueError, match="num_cpus must be positive"):
        ray_runtime.init_ray(num_cpus=1)
    assert calls == ["local"]
