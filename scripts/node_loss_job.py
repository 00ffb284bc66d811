"""Node-loss drill: a LoCoMo job on a two-node local Ray cluster loses its worker node mid-run.

A head node (the driver's, 1 CPU) and a worker node (2 CPUs and a ``worker_node`` resource) run under
``ray.cluster_utils.Cluster`` (never ``ray stop``). Every stage actor (with both models offline, the one
Ingest actor that also answers and judges) is placed on the worker node
(``PipelineOptions.stage_scheduling`` = soft node affinity), so the loss of that node takes all of them at
once. The participant is the reference memory system run as the
chaos participant with every request slowed (``slow=1.0``, ``slow_s``), so the Adds take seconds.
When the Add journals (``evidence/adds/<sample>.jsonl``) hold ``--remove-after`` rows (or, with
``--remove-at-stage STAGE``, once that stage reported progress), the worker node is killed
(``remove_node``, not graceful unless ``--graceful``); the job must finish on the head alone.
``--health-check-ms`` shortens the GCS health check (Ray's default declares a killed node dead after
about 15 s).

Printed: the figures (seconds from the removal until the GCS declared the node dead, to the next
journalled Add and to the next progress count; total wall time; Adds re-sent and acknowledged without
storing; duplicate messages stored) and one ``RESULT {json}`` line for ``tests/test_node_loss.py``::

    python scripts/node_loss_job.py OUT_DIR [--samples 2] [--slow-s 0.25] [--remove-after 10]
        [--remove-at-stage add --max-in-flight 16] [--health-check-ms 1000] [--graceful]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCOMO_FILE = REPO.parent / "shared" / "datasets" / "locomo" / "locomo10.json"


def journal_rows(run_root: Path, seen: dict[str, int]) -> int:
    """Add rows journalled so far: complete lines of every ``evidence/adds/<sample>.jsonl``.

    A sample whose Adds finished has its journal replaced by Parquet, so ``seen`` keeps each sample's
    highest count (updated in place) and the total is their sum.
    """
    for path in (run_root / "evidence" / "adds").glob("*.jsonl"):
        try:
            n = path.read_bytes().count(b"\n")
        except OSError:  # replaced by the sample's Parquet file between glob and read
            continue
        seen[path.name] = max(seen.get(path.name, 0), n)
    return sum(seen.values())


class Watcher(threading.Thread):
    """Polls the Add journals and the progress counts; removes the worker node once, at the threshold.

    Args:
        cluster: the ``ray.cluster_utils.Cluster``.
        node: the worker node to remove.
        worker_id: its node id.
        run_root: the run directory.
        remove_after: journalled Add rows that trigger the removal.
        remove_at_stage: instead, remove it once this stage (``add``, ``search``, ``answer``, ``judge``)
            reported its first finished unit (``add``: the first sample's Adds are done, its questions are
            being searched).
        graceful: let the node's processes shut down gracefully (False: killed, like a lost machine).
    """

    def __init__(self, cluster, node, worker_id: str, run_root: Path, remove_after: int, graceful: bool,
                 remove_at_stage: str | None = None):
        super().__init__(daemon=True)
        self.cluster, self.node, self.worker_id, self.run_root = cluster, node, worker_id, run_root
        self.remove_after, self.graceful, self.remove_at_stage = remove_after, graceful, remove_at_stage
        self.counts_at_removal: dict[str, int] = {}
        self.stop = threading.Event()
        self.t0 = time.perf_counter()
        self.removed_at: float | None = None  # seconds since t0
        self.removal_s: float | None = None  # how long remove_node itself took
        self.rows_at_removal = 0
        self.node_dead_at: float | None = None  # when the GCS stopped listing the node as alive
        self.rows_at_dead = 0
        self.first_add_after: float | None = None  # first Add journalled once the node was declared dead
        self.progress: list[tuple[float, dict[str, int]]] = []  # (seconds since t0, counts)
        self.error: str | None = None

    def on_progress(self, kind: str, counts: dict[str, int]) -> None:
        """``evaluate``'s progress callback: keeps the counts with their time."""
        if kind == "done":
            self.progress.append((time.perf_counter() - self.t0, dict(counts)))

    def run(self) -> None:
        try:
            seen: dict[str, int] = {}
            while not self.stop.wait(0.05):
                rows = journal_rows(self.run_root, seen)
                now = time.perf_counter() - self.t0
                counts = self.progress[-1][1] if self.progress else {}
                due = (rows >= self.remove_after if self.remove_at_stage is None
                       else counts.get(self.remove_at_stage, 0) > 0)
                if self.removed_at is None and due:
                    self.rows_at_removal, self.removed_at, self.counts_at_removal = rows, now, counts
                    self.cluster.remove_node(self.node, allow_graceful=self.graceful)
                    self.removal_s = time.perf_counter() - self.t0 - now
                    self.rows_at_removal = journal_rows(self.run_root, seen)  # rows the dying node wrote
                    continue
                if self.removed_at is not None and self.node_dead_at is None and not self._alive():
                    self.node_dead_at, self.rows_at_dead = time.perf_counter() - self.t0, rows
                if self.node_dead_at is not None and self.first_add_after is None and rows > self.rows_at_dead:
                    self.first_add_after = now
        except Exception as exc:  # noqa: BLE001 - reported in RESULT, the job's assertions decide
            self.error = f"{type(exc).__name__}: {exc}"

    def _alive(self) -> bool:
        import ray

        return any(n["NodeID"] == self.worker_id and n["Alive"] for n in ray.nodes())

    def first_progress_after(self) -> float | None:
        """Time of the first progress count that grew after the removal (any stage)."""
        if self.removed_at is None:
            return None
        before = [c for t, c in self.progress if t <= self.removed_at]
        base = sum(before[-1].values()) if before else 0
        for t, c in self.progress:
            if t > self.removed_at and sum(c.values()) > base:
                return t
        return None


def run(out_dir: Path, *, samples: int, slow_s: float, remove_after: int, graceful: bool,
        health_check_ms: int | None = None, remove_at_stage: str | None = None,
        max_in_flight: int = 64) -> dict:
    """Start the cluster, run the job, remove the worker node midway and report.

    Args:
        out_dir: where the reference store and the run directory go.
        samples: LoCoMo conversations to evaluate.
        slow_s: seconds every Add and Search reply is held by the chaos participant.
        remove_after: journalled Add rows before the worker node is removed.
        remove_at_stage: remove it once this stage reported its first batch, instead.
        max_in_flight: the participant's declared concurrency (lower: Search takes longer).
        graceful: remove the node gracefully (default False: its processes are killed).
        health_check_ms: the GCS's node health-check period and timeout (3 misses declare a node dead);
            None keeps Ray's defaults (a killed node is declared dead after about 15 s).

    Returns:
        The figures and counts printed as ``RESULT``.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from aml_ray.actors.participant import ParticipantSpec
    from aml_ray.config import model_endpoint_from_env
    from aml_ray.run.evaluation import EvaluationConfig, evaluate
    from aml_ray.run.pipeline import PipelineOptions
    from aml_ray.run.ray_runtime import local_cluster
    from aml_ray.reference.server import ReferenceServer

    t_start = time.perf_counter()
    head_args: dict = {"num_cpus": 1, "resources": {"head_node": 1}}
    if health_check_ms:
        head_args["_system_config"] = {"health_check_period_ms": health_check_ms,
                                       "health_check_timeout_ms": health_check_ms,
                                       "health_check_failure_threshold": 3}
    with local_cluster(head_args, [{"num_cpus": 2, "resources": {"worker_node": 1}}], prefix="amlnl-") as local:
        cluster, worker, worker_id = local.cluster, local.nodes[0], local.node_ids[0]
        head_id = ray.get_runtime_context().get_node_id()
        cluster_ready_s = time.perf_counter() - t_start
        # every stage actor on the worker node; soft, so restarts go to the head once the node is gone
        stages_on_worker = PipelineOptions(stage_scheduling=NodeAffinitySchedulingStrategy(worker_id, soft=True))
        run_root = out_dir / "run"
        with ReferenceServer(out_dir / "ref", faults=f"slow=1.0,slow_s={slow_s}") as ref:
            spec = ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url, max_in_flight=max_in_flight)
            cfg = EvaluationConfig(
                dataset="locomo", participant=spec, out_dir=run_root, data_path=LOCOMO_FILE,
                answer=model_endpoint_from_env("answer", {}), judge=model_endpoint_from_env("judge", {}),
                limit_samples=samples, run_label="node-loss", options=stages_on_worker)
            watcher = Watcher(cluster, worker, worker_id, run_root, remove_after, graceful, remove_at_stage)
            watcher.start()
            try:
                result = evaluate(cfg, on_progress=watcher.on_progress)
            finally:
                watcher.stop.set()
                watcher.join(timeout=30)
            stats = ref.stats()
        job_s = time.perf_counter() - watcher.t0
        actors = [{"class": a["ActorClassName"], "node": a["Address"]["NodeID"], "state": a["State"],
                   "restarts": a.get("NumRestarts", 0)} for a in ray._private.state.actors().values()]
        alive = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
        q = result.questions
        info = result.run_info
        return {
            "head_node": head_id, "worker_node": worker_id, "alive_nodes": alive, "actors": actors,
            "status": info["status"], "scorable": info["dataset"]["scorable_questions"],
            "scored": int((q["status"] == "scored").sum()), "excluded": int(q["excluded"].sum()),
            "question_rows": q.height, "distinct_questions": q["question_id"].n_unique(),
            "chunks": info["dataset"]["chunks"], "messages": info["dataset"]["messages"],
            "add_rows": info["evidence"]["add_rows"], "adds_ok": info["adds"]["ok"],
            "memories": stats["memories"], "duplicate_messages": stats["duplicate_messages"],
            # the pre-flight's probe Add stores one message of its own (aml_ray.run.preflight)
            "probe_messages": int(bool(info.get("preflight", {}).get("steps", {}).get("add", {}).get("ok"))),
            "duplicate_adds_acknowledged": stats["duplicate_adds_acknowledged"],
            "rows_at_removal": watcher.rows_at_removal, "counts_at_removal": watcher.counts_at_removal,
            "rows_at_dead": watcher.rows_at_dead, "removed_at_s": watcher.removed_at,
            "remove_node_call_s": watcher.removal_s, "watcher_error": watcher.error,
            "node_dead_s": None if watcher.node_dead_at is None or watcher.removed_at is None
            else watcher.node_dead_at - watcher.removed_at,
            "recover_add_s": None if watcher.first_add_after is None or watcher.removed_at is None
            else watcher.first_add_after - watcher.removed_at,
            "recover_progress_s": None if watcher.removed_at is None or watcher.first_progress_after() is None
            else watcher.first_progress_after() - watcher.removed_at,
            "progress": [(round(t, 2), c) for t, c in watcher.progress],
            "cluster_ready_s": cluster_ready_s, "job_s": job_s, "total_s": time.perf_counter() - t_start,
        }


def main() -> None:
    """Parse arguments, run the drill, print the figures and the ``RESULT`` line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--slow-s", type=float, default=0.25, help="seconds each participant reply is held")
    ap.add_argument("--remove-after", type=int, default=10, help="journalled Adds before the removal")
    ap.add_argument("--remove-at-stage", choices=["add", "search", "answer", "judge"], default=None,
                    help="remove once this stage reported its first batch (instead of --remove-after)")
    ap.add_argument("--max-in-flight", type=int, default=64, help="the participant's declared concurrency")
    ap.add_argument("--graceful", action="store_true", help="remove the node gracefully (default: kill)")
    ap.add_argument("--health-check-ms", type=int, default=None,
                    help="GCS health-check period/timeout in ms, 3 misses = dead (default: Ray's, about 15 s)")
    args = ap.parse_args()
    res = run(args.out_dir, samples=args.samples, slow_s=args.slow_s, remove_after=args.remove_after,
              graceful=args.graceful, health_check_ms=args.health_check_ms,
              remove_at_stage=args.remove_at_stage, max_in_flight=args.max_in_flight)

    def fmt(x: float | None) -> str:
        return "never" if x is None else f"{x:.1f} s"

    print(f"cluster ready (2 nodes)           : {fmt(res['cluster_ready_s'])}")
    if res["removed_at_s"] is None:
        print("worker node removed at            : never (the threshold was not reached)")
    else:
        print(f"worker node removed at            : {fmt(res['removed_at_s'])} into the job, "
              f"{res['rows_at_removal']}/{res['chunks']} Adds journalled, progress {res['counts_at_removal']} "
              f"(remove_node took {fmt(res['remove_node_call_s'])})")
    print(f"node declared dead by the GCS     : {fmt(res['node_dead_s'])} after the removal")
    print(f"first Add journalled after that   : {fmt(res['recover_add_s'])} after the removal")
    print(f"first progress after removal      : {fmt(res['recover_progress_s'])} after it")
    print(f"job wall time                     : {fmt(res['job_s'])} (total with cluster start "
          f"{fmt(res['total_s'])})")
    print(f"questions scored / scorable       : {res['scored']} / {res['scorable']} "
          f"({res['question_rows']} rows, {res['distinct_questions']} distinct)")
    print(f"Add rows / chunks                 : {res['add_rows']} / {res['chunks']}")
    print(f"messages stored / sent            : {res['memories']} / {res['messages']} + {res['probe_messages']} probe; duplicates "
          f"{res['duplicate_messages']}; Adds re-sent and acknowledged {res['duplicate_adds_acknowledged']}")
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
