"""N participants evaluated at once, each with its own capacity, sharing rate-limited model endpoints.

Runs N jobs (``--n 1 4 8 16``), one per participant, each :func:`aml_ray.run.pipeline.run_pipeline` on one Ray,
in a Ray actor of its own (``--jobs-in actors``, the default: the service's layout, where each job runs in a
job actor, :mod:`aml_ray.serve_app.job_actor`, whose process also runs the job's Ingest stage,
:mod:`aml_ray.run.local_ingest`) or in a thread of this driver (``--jobs-in threads``: each job's Ingest is an
actor of its own); the service's HTTP queue and database are not in it. Each
participant is a loopback server (``scripts/loopback_servers.py``) serving at most its declared
capacity (cycling through ``--capacities``); the answer and judge models are the hosted-like endpoint
(``scripts/model_endpoint.py``), shared by every job through the cluster's ``ModelClient`` actors.

Per participant it prints the job's wall (from the launch of every job, its actor's start included) against
its own bound, the larger of its participant's busy time at its capacity ((Adds + Searches) x latency /
capacity) and its fair share of the model budget (its tokens charged, per model, at TPM / N: every job has
the same questions), and the ratio; then the fairness figure (the largest ratio; the target is 1.2), the aggregate throughput (questions/s) and each
model's tokens charged per tenth of the wall against its TPM.

    .venv/bin/python scripts/bench_many_participants.py --n 1 4 8
"""

from __future__ import annotations

import argparse
import dataclasses
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
#: This folder, put on a job actor's ``sys.path`` for the drill's job function.
SCRIPTS = str(Path(__file__).resolve().parent)


def _name(i: int) -> str:
    return "p" + "".join(chr(ord("a") + int(d)) for d in f"{i:02d}")


def _job_in_actor(plan: tuple, base_url: str, answer, judge, out: Path, record: dict[str, Any]) -> dict[str, Any]:
    """:func:`drill_many_participants._run_job` of the :class:`~drill_many_participants.JobPlan` whose fields are
    ``plan`` in this worker process (a ``_JobProcess`` actor; the drill's module is imported here, so its plan
    travels as a tuple); its record (start and end on the machine's monotonic clock, which every process shares)."""
    sys.path.insert(0, SCRIPTS)
    from drill_many_participants import JobPlan as Plan, _run_job as run_job

    run_job(Plan(*plan), base_url, answer, judge, out, record)
    return record


def _in_actors(plans, base_urls: list[str], answer, judge, out: Path, records: dict[str, dict[str, Any]],
               timeout_s: float) -> dict[str, dict[str, Any]]:
    """Each plan's job in a Ray actor of its own (0 CPUs, as the service's job actors), all at once; their records."""
    import ray

    job_process = ray.remote(num_cpus=0, max_restarts=0)(_JobProcess)
    actors = [job_process.remote() for _ in plans]
    refs = [a.run.remote(dataclasses.astuple(p), url, answer, judge, out, records[p.name])
            for a, p, url in zip(actors, plans, base_urls)]
    try:
        done = ray.get(refs, timeout=timeout_s)
    finally:
        for a in actors:
            ray.kill(a)
    return {p.name: rec for p, rec in zip(plans, done)}


class _JobProcess:
    """A job's process, as the service's job actor is one (no store, no lease: only the job's run)."""

    def run(self, plan: tuple, base_url: str, answer, judge, out: Path, record: dict[str, Any]) -> dict[str, Any]:
        return _job_in_actor(plan, base_url, answer, judge, out, record)


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
        t0 = time.monotonic()
        if args.jobs_in == "actors":
            records.update(_in_actors(plans, [s.base_url for s in parts], answer, judge, Path(tmp), records,
                                      args.timeout_s))
        else:
            threads = [threading.Thread(target=_run_job, daemon=True,
                                        args=(p, s.base_url, answer, judge, Path(tmp), records[p.name]))
                       for p, s in zip(plans, parts)]
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
        w = rec.get("end", time.monotonic()) - t0  # from the bench's launch: a job actor's start counts
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
    ap.add_argument("--jobs-in", choices=["actors", "threads"], default="actors",
                    help="each job in a Ray actor of its own (the service's job actors) or in a thread of this driver")
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
        print(f"Ray: {args.nodes} node(s) x {args.num_cpus} CPUs; {os.cpu_count()} CPUs on this machine; "
              f"each job in {'a Ray actor of its own' if args.jobs_in == 'actors' else 'a thread of this driver'}")
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
