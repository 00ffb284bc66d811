"""N participants evaluated at once, each with its own capacity, sharing rate-limited model endpoints.

Runs N jobs (``--n 1 4 8 16``), one per participant, each :func:`aml_ray.run.pipeline.run_pipeline` in a
thread of one driver on one Ray: the dispatch path of the service's ``JobWorker``, which runs each
queued job in a thread of its driver (the service's HTTP queue and database are not in it). Each
participant is a loopback server (``scripts/loopback_servers.py``) serving at most its declared
capacity (cycling through ``--capacities``); the answer and judge models are the hosted-like endpoint
(``scripts/model_endpoint.py``), shared by every job through the cluster's ``ModelClient`` actors.

Per participant it prints the job's wall against its own bound, the larger of its participant's busy
time at its capacity ((Adds + Searches) x latency / capacity) and its fair share of the model budget
(its tokens charged, per model, at TPM / N: every job has the same questions), and the ratio; then the
fairness figure (the largest ratio; the target is 1.2), the aggregate throughput (questions/s) and each
model's tokens charged per tenth of the wall against its TPM.

    .venv/bin/python scripts/bench_many_participants.py --n 1 4 8
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_suite import utilisation  # noqa: E402
from drill_many_participants import JobPlan, _run_job  # noqa: E402
from loopback_servers import ServerProcess  # noqa: E402

TAG_REGEX = r"\[job:([a-z]+)\]"


def _name(i: int) -> str:
    return "p" + "".join(chr(ord("a") + int(d)) for d in f"{i:02d}")


def one_round(args, n: int) -> dict[str, Any]:
    """``n`` jobs at once; their figures and the endpoint's."""
    import contextlib

    from aml_ray.config import ModelEndpoint

    ts = args.time_scale
    plans = [JobPlan(_name(i), args.samples, args.questions, args.latency_ms, args.capacities[i % len(args.capacities)])
             for i in range(n)]
    model_flags = ["--p50-ms", str(args.p50_ms), "--p99-ms", str(args.p99_ms), "--rpm", str(args.rpm), "--tpm",
                   str(args.tpm), "--time-scale", str(ts), "--window-s", "60", "--tag-regex", TAG_REGEX]
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench_many_") as tmp:
        parts = [stack.enter_context(ServerProcess("participant", "--latency-ms", str(p.latency_ms), "--capacity",
                                                   str(p.max_in_flight))) for p in plans]
        model = stack.enter_context(ServerProcess("hosted", *model_flags))
        answer, judge = (ModelEndpoint(role=role, base_url=f"{model.base_url}/v1", model=name, max_in_flight=32,
                                       rpm=args.rpm / ts, tpm=args.tpm / ts)
                         for role, name in (("answer", "gpt-4o-mini"), ("judge", "gpt-4o")))
        records = {p.name: {"run_id": f"{p.name}-{uuid.uuid4().hex[:8]}"} for p in plans}
        threads = [threading.Thread(target=_run_job, args=(p, s.base_url, answer, judge, Path(tmp), records[p.name]),
                                    daemon=True) for p, s in zip(plans, parts)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=args.timeout_s)
        wall = time.monotonic() - t0
        pstats = [s.stats() for s in parts]
        mstats = model.stats()
    tokens: dict[str, dict[str, int]] = {}
    admitted: dict[str, list[tuple[float, int]]] = {}
    first_call: dict[str, float] = {}  # each job's first model call admitted (the endpoint's monotonic clock)
    for arrival, done, kind, tag, status, cost in mstats["calls"]:
        if status == 200:
            tokens.setdefault(tag, {}).setdefault(kind, 0)
            tokens[tag][kind] += cost
            admitted.setdefault(kind, []).append((arrival, cost))
            first_call[tag] = min(first_call.get(tag, arrival), arrival)
    per_s = args.tpm / 60 / ts
    tenths = {kind: utilisation(calls, t0, wall, per_s) for kind, calls in sorted(admitted.items())}
    jobs = []
    for p, st in zip(plans, pstats):
        rec = records[p.name]
        busy = (st["n"].get("add", 0) + st["n"].get("search", 0)) * p.latency_ms / 1000 / p.max_in_flight
        share = max(tokens.get(p.name, {}).values(), default=0) / (per_s / n)
        b = max(busy, share)
        w = rec.get("end", time.monotonic()) - rec.get("start", t0)
        jobs.append({"name": p.name, "capacity": p.max_in_flight, "wall_s": w, "busy_s": busy, "model_share_s": share,
                     "bound_s": b, "ratio": w / b if b else float("nan"), "scored": rec.get("scored"),
                     "error": rec.get("error"), "over_capacity": st["over_capacity"],
                     "first_call_s": first_call.get(p.name, float("nan")) - t0})
    models = mstats["models"]
    return {"n": n, "wall_s": wall, "jobs": jobs, "questions": n * args.samples * args.questions, "tenths": tenths,
            "calls": sum(m["calls"] for m in models.values()), "rejected": sum(m["rejected_429"] for m in models.values())}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--capacities", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--questions", type=int, default=25, help="per sample")
    ap.add_argument("--latency-ms", type=float, default=50.0, help="participant Add and Search")
    ap.add_argument("--p50-ms", type=float, default=700.0)
    ap.add_argument("--p99-ms", type=float, default=5000.0)
    ap.add_argument("--rpm", type=float, default=500.0)
    ap.add_argument("--tpm", type=float, default=200_000.0)
    ap.add_argument("--time-scale", type=float, default=0.05)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ap.add_argument("--nodes", type=int, default=1,
                    help="local Ray nodes; more than 1: a ray.cluster_utils.Cluster with --num-cpus on each node")
    args = ap.parse_args(argv)
    import contextlib

    import ray

    from aml_ray.run._ray_internals import SYSTEM_CONFIG
    from aml_ray.run.ray_runtime import init_ray, local_cluster, shutdown_ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    with contextlib.ExitStack() as stack:
        # Ray as the platform starts it (``aml-ray serve`` and ``aml-ray run`` call init_ray): its system config
        if args.nodes > 1:
            stack.enter_context(local_cluster({"num_cpus": args.num_cpus, "_system_config": SYSTEM_CONFIG},
                                              [{"num_cpus": args.num_cpus}] * (args.nodes - 1)))
        else:
            init_ray(num_cpus=args.num_cpus)
            stack.callback(shutdown_ray)
        print(f"Ray: {args.nodes} node(s) x {args.num_cpus} CPUs; {os.cpu_count()} CPUs on this machine")
        rounds(args)


def rounds(args) -> None:
    """Each ``--n`` round in turn, its figures printed."""
    for n in args.n:
        load0 = os.getloadavg()[0]
        r = one_round(args, n)
        worst = max(j["ratio"] for j in r["jobs"])
        print(f"N={n}: wall {r['wall_s']:.1f} s, {r['questions'] / r['wall_s']:.1f} questions/s in all; "
              f"429s {r['rejected']} / {r['calls']} model calls; fairness (largest wall / own bound) {worst:.2f}; "
              f"load {load0:.1f} -> {os.getloadavg()[0]:.1f}")
        for kind, shares in r["tenths"].items():
            print(f"  {kind} model's tokens charged per tenth of the wall, as a share of its TPM: "
                  + " ".join(f"{u:.0%}" for u in shares))
        for j in r["jobs"]:
            print(f"  {j['name']} capacity {j['capacity']:>2}: wall {j['wall_s']:6.1f} s = {j['ratio']:.2f} x bound "
                  f"{j['bound_s']:.1f} s (participant busy {j['busy_s']:.1f} s, model share {j['model_share_s']:.1f} s); "
                  f"first model call at {j['first_call_s']:.1f} s; scored {j['scored']}, over capacity {j['over_capacity']}" + (f"; {j['error']}" if j["error"] else ""))


if __name__ == "__main__":
    main()
