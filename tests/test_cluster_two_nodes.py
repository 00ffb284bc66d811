"""A job across a two-node local Ray cluster (``ray.cluster_utils.Cluster``), never ``ray stop``.

The cluster runs in a subprocess (this file run as a script), because the test session keeps a single
``ray.init`` per process (``tests/conftest.py``) and a Cluster needs its own. The script starts a head
node and a second node (1 CPU each), waits until a task pinned to the second node has run, evaluates
one LoCoMo conversation against the reference memory system with the offline answerer and judge,
and prints one ``RESULT {json}`` line: the node of every pipeline actor and the question counts.

Nothing of the cluster outlives it: a ``ray::MapWorker(MapBatches(IngestFromFiles))`` of this test was
once found alive 35 minutes after the suite (parent 1, its own process group, the session dir deleted).
The script therefore leaves a straggler of the same kind on the second node, a process started from a
worker there that has parent 1, a session of its own and the worker's environment, and checks, after
the cluster's block has ended and again after the script has exited, that no process whose command
line or environment names the cluster's temp dir or GCS address is still running.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
LOCOMO_FILE = REPO.parent / "shared" / "datasets" / "locomo" / "locomo10.json"


def test_job_runs_across_two_nodes(tmp_path):
    assert LOCOMO_FILE.is_file(), f"{LOCOMO_FILE} is missing"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, __file__, str(tmp_path)], capture_output=True, text=True,
                          timeout=240, env=env, cwd=REPO)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout[-3000:], proc.stderr[-3000:])
    res = json.loads(lines[-1][len("RESULT "):])
    assert len(res["alive_nodes"]) == 2
    # the pipeline's stage actors (Ray Data spreads them) ran on both nodes
    stage_nodes = {node for name, node in res["actors"] if name.startswith("MapWorker(")}
    assert stage_nodes == set(res["alive_nodes"]), res["actors"]
    # every scorable question of conv-26 was scored; category 5 excluded, as on one node
    assert res["status"] == "completed"
    assert res["scored"] == res["scorable"] == 152 and res["excluded"] == 47
    assert res["add_rows"] == res["chunks"] and res["add_failed"] == 0
    # the straggler ran until the block ended; after it, and after the driver exited, nothing of the
    # session runs (its temp dir and GCS address name no live process)
    assert res["straggler_alive_in_block"] is True
    assert res["survivors_after_block"] == [], res["survivors_after_block"]
    assert _survivors(res["temp_dir"], res["gcs_address"]) == []


#: A driver whose local_cluster head cannot start (``CPU`` given as a custom resource: ``Cluster()``
#: raises); it prints the temp dirs with the prefix that exist afterwards.
FAILED_START = """
import glob, sys
from aml_ray.run.ray_runtime import local_cluster
prefix = sys.argv[1]
try:
    with local_cluster({"num_cpus": 1, "resources": {"CPU": 1}}, [], prefix=prefix):
        pass
except Exception as exc:
    print("RAISED", type(exc).__name__)
print("LEFT", sorted(glob.glob("/tmp/" + prefix + "*")))
"""


def test_a_cluster_whose_head_fails_to_start_leaves_no_temp_dir(tmp_path):
    # the driver's cluster temp dir is removed even when Cluster() itself raises (it was left behind)
    prefix = f"amlc-fail-{os.getpid()}-"
    proc = subprocess.run([sys.executable, "-c", FAILED_START, prefix], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-2:] == ["RAISED AssertionError", "LEFT []"], proc.stdout


def _survivors(temp_dir: str, gcs_address: str, wait_s: float = 5.0) -> list[str]:
    """``"pid cmdline"`` of each process other than this one, not a zombie, whose command line or
    environment names ``temp_dir`` or ``gcs_address``, still there after up to ``wait_s`` seconds."""
    names = re.compile(re.escape(temp_dir) + "(?![^/])|" + re.escape(gcs_address) + r"(?!\d)")
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for proc in psutil.process_iter(["cmdline", "status"]):
            if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            try:
                texts = [*(proc.info["cmdline"] or ()), *proc.environ().values()]
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if any(names.search(t) for t in texts):
                found.append(f"{proc.pid} {' '.join(proc.info['cmdline'] or ())[:200]}")
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.2)


#: Started by a task on the second node: a shell that starts, in a new session, a sleeper that inherits
#: the worker's environment, and exits at once, so the sleeper has parent 1 (or a subreaper) and its
#: own process group, like the orphaned MapWorker; the shell prints the sleeper's pid.
STRAGGLER = 'setsid "$0" -c "import time; time.sleep(900)" </dev/null >/dev/null 2>&1 & echo $!'


def _run(out_dir: Path) -> dict:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from aml_ray.actors.participant import ParticipantSpec
    from aml_ray.config import model_endpoint_from_env
    from aml_ray.run.evaluation import EvaluationConfig, evaluate
    from aml_ray.run.pipeline import PipelineOptions
    from aml_ray.run.ray_runtime import local_cluster
    from aml_ray.reference.server import ReferenceServer

    @ray.remote(num_cpus=0)
    def leave_straggler() -> int:
        return int(subprocess.run(["sh", "-c", STRAGGLER, sys.executable], capture_output=True, text=True,
                                  check=True).stdout)

    with local_cluster({"num_cpus": 1, "resources": {"head_node": 1}},
                       [{"num_cpus": 1, "resources": {"second_node": 1}}]) as local:
        second = local.node_ids[0]
        temp_dir, gcs_address = local.temp_dir, local.cluster.address
        straggler = ray.get(leave_straggler.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(second, soft=False)).remote())
        with ReferenceServer(out_dir / "ref") as ref:
            spec = ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url)
            result = evaluate(EvaluationConfig(
                dataset="locomo", participant=spec, out_dir=out_dir / "run", data_path=LOCOMO_FILE,
                answer=model_endpoint_from_env("answer", {}), judge=model_endpoint_from_env("judge", {}),
                limit_samples=1, run_label="two-nodes",
                # three stage actors to spread: the Ray Data layout (by default the models run inside Ingest)
                options=PipelineOptions(models_inline=False)))
        actors = [(a["ActorClassName"], a["Address"]["NodeID"]) for a in ray._private.state.actors().values()]
        alive = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
        q = result.questions
        info = result.run_info
        res = {"alive_nodes": alive, "second_node": second, "actors": actors, "status": info["status"],
               "scorable": info["dataset"]["scorable_questions"], "chunks": info["dataset"]["chunks"],
               "scored": int((q["status"] == "scored").sum()), "excluded": int(q["excluded"].sum()),
               "add_rows": info["evidence"]["add_rows"], "add_failed": info["adds"]["failed"],
               "straggler_alive_in_block": psutil.pid_exists(straggler), "temp_dir": temp_dir,
               "gcs_address": gcs_address}
    res["survivors_after_block"] = _survivors(temp_dir, gcs_address)
    return res


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    print("RESULT " + json.dumps(_run(Path(sys.argv[1]))), flush=True)
