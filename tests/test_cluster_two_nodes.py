"""A job across a two-node local Ray cluster (``ray.cluster_utils.Cluster``), never ``ray stop``.

The cluster runs in a subprocess (this file run as a script), because the test session keeps a single
``ray.init`` per process (``tests/conftest.py``) and a Cluster needs its own. The script starts a head
node and a second node (1 CPU each), waits until a task pinned to the second node has run, evaluates
one LoCoMo conversation against the reference memory system with the offline answerer and judge,
and prints one ``RESULT {json}`` line: the node of every pipeline actor and the question counts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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


def _run(out_dir: Path) -> dict:
    import ray

    from aml_ray.actors.participant import ParticipantSpec
    from aml_ray.config import model_endpoint_from_env
    from aml_ray.run.evaluation import EvaluationConfig, evaluate
    from aml_ray.run.ray_runtime import local_cluster
    from aml_ray.reference.server import ReferenceServer

    with local_cluster({"num_cpus": 1, "resources": {"head_node": 1}},
                       [{"num_cpus": 1, "resources": {"second_node": 1}}]) as local:
        second = local.node_ids[0]
        with ReferenceServer(out_dir / "ref") as ref:
            spec = ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url)
            result = evaluate(EvaluationConfig(
                dataset="locomo", participant=spec, out_dir=out_dir / "run", data_path=LOCOMO_FILE,
                answer=model_endpoint_from_env("answer", {}), judge=model_endpoint_from_env("judge", {}),
                limit_samples=1, run_label="two-nodes"))
        actors = [(a["ActorClassName"], a["Address"]["NodeID"]) for a in ray._private.state.actors().values()]
        alive = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
        q = result.questions
        info = result.run_info
        return {"alive_nodes": alive, "second_node": second, "actors": actors, "status": info["status"],
                "scorable": info["dataset"]["scorable_questions"], "chunks": info["dataset"]["chunks"],
                "scored": int((q["status"] == "scored").sum()), "excluded": int(q["excluded"].sum()),
                "add_rows": info["evidence"]["add_rows"], "add_failed": info["adds"]["failed"]}


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    print("RESULT " + json.dumps(_run(Path(sys.argv[1]))), flush=True)
