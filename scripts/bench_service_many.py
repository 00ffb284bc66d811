"""N participants evaluated at once through the real service's job queue, sharing rate-limited models.

Starts what ``aml-ray serve`` starts, as ``scripts/bench_service_smoke.py`` does (a local Ray cluster,
:func:`aml_ray.run.ray_runtime.init_ray`; the Ray Serve app, :func:`aml_ray.serve_app.deployment.run`; a
fresh SQLite store; the job dispatcher, here allowed ``--n`` jobs at once; the shipped Textual suite with
its data from ``../shared/datasets``), with the locked answer and judge models behind the hosted-like
endpoint (``scripts/model_endpoint.py``: lognormal latency, RPM and TPM limits answering 429 with
Retry-After, in its clock of ``--time-scale`` real seconds per endpoint second). N reference BM25
participants (``aml_ray.reference``, each its own process, Bearer auth) onboard through the public API
(access request, admin approval, key read once) and each submits one SMOKE job; the N ``POST /api/jobs``
go out together, and the dispatcher runs the jobs at once, each in its own job actor.

Per job it prints its wall (from the first submission to the final status seen, polled every 0.2 s)
against its own bound: its fair share of the model budget. The service's prompts are locked, so the
endpoint cannot tell the jobs' calls apart; every job evaluates the same sample with the same system, so
a job's tokens are the total over N, and its share of the budget is TPM / N: its bound is the total
tokens charged at TPM, per model, the larger of the two. The participants' own busy time (a few ms per
request of BM25) is far below it. Then the fairness figure (the largest wall / bound; the target is 1.2),
the questions scored per second over the batch, the 429 share and each model's tokens per tenth of the wall.

    .venv/bin/python scripts/bench_service_many.py --n 8 [--time-scale 1]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_service_smoke import FINAL, SHARED_DATASETS, Participant, onboard, start_service  # noqa: E402
from bench_suite import utilisation  # noqa: E402

MODELS = (("answer", "gpt-4o-mini"), ("judge", "gpt-4o"))


def submit_all(api, jobs: list[dict[str, Any]]) -> None:
    """POST every job's SMOKE submission at once (a thread each); sets each job's ``id`` or ``error``."""
    def submit(job: dict[str, Any]) -> None:
        r = api.post("/api/jobs", headers={"Authorization": f"Bearer {job['key']}"},
                     json={"version_id": job["version_id"], "mode": "smoke", "run_label": job["label"],
                           "track": "textual"})
        if r.status_code == 202:
            job["id"] = r.json()["id"]
        else:
            job["error"] = f"POST /api/jobs answered {r.status_code}: {r.text}"

    threads = [threading.Thread(target=submit, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def poll_all(api, jobs: list[dict[str, Any]], timeout_s: float) -> None:
    """Poll every submitted job every 0.2 s until each is final; sets ``end`` (``time.monotonic()``) and ``job``.

    Raises:
        TimeoutError: a job is not final after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    waiting = [j for j in jobs if "id" in j]
    while waiting:
        for job in list(waiting):
            seen = api.get(f"/api/jobs/{job['id']}", headers={"Authorization": f"Bearer {job['key']}"}).json()
            if seen["status"] in FINAL:
                job["end"], job["job"] = time.monotonic(), seen
                waiting.remove(job)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(waiting)} jobs not final after {timeout_s:.0f} s")
        time.sleep(0.2)


def scored(runs_dir: Path, job: dict[str, Any]) -> int:
    """Questions scored by the job's runs (each bundle's run.json under ``runs_dir/<job id>``)."""
    total = 0
    for path in (runs_dir / job.get("id", "-")).glob("*/run.json"):
        total += json.loads(path.read_text())["outcome"]["counts"]["questions"]["scored"]
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=8, help="participants, one SMOKE job each, submitted at once")
    ap.add_argument("--p50-ms", type=float, default=700.0)
    ap.add_argument("--p99-ms", type=float, default=5000.0)
    ap.add_argument("--rpm", type=float, default=500.0, help="per model, in the endpoint's clock")
    ap.add_argument("--tpm", type=float, default=200_000.0, help="per model, in the endpoint's clock")
    ap.add_argument("--time-scale", type=float, default=1.0, help="real seconds per endpoint second")
    ap.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray cluster (default all)")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="most seconds the batch may take")
    args = ap.parse_args(argv)
    locomo = SHARED_DATASETS / "locomo" / "locomo10.json"
    if not locomo.is_file():
        ap.error(f"{locomo} is missing (the smoke job's bundle)")

    import httpx
    from cryptography.fernet import Fernet
    from pydantic import SecretStr

    from aml_ray.config import ModelEndpoint
    from aml_ray.serve_app.settings import ServiceSettings
    from loopback_servers import ServerProcess

    ts = args.time_scale
    load_start = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="aml-bench-service-many-"))
    os.environ["AML_DATA_DIR"] = str(work / "data")  # cache and defaults of this process and Ray's workers
    admin = "admin-" + secrets.token_hex(16)
    session_dir = None
    try:
        with contextlib.ExitStack() as stack:
            model = stack.enter_context(ServerProcess(
                "hosted", "--p50-ms", str(args.p50_ms), "--p99-ms", str(args.p99_ms), "--rpm", str(args.rpm),
                "--tpm", str(args.tpm), "--time-scale", str(ts), "--window-s", "60"))
            participants = [stack.enter_context(Participant(work, f"participant-{i}")) for i in range(args.n)]
            models = {role: ModelEndpoint(role=role, base_url=f"{model.base_url}/v1", model=name, max_in_flight=32,
                                          rpm=args.rpm / ts, tpm=args.tpm / ts, api_key=SecretStr("sk-bench"),
                                          cache_path=None)
                      for role, name in MODELS}
            settings = ServiceSettings(
                database_url=f"sqlite:///{work / 'aml.sqlite3'}",
                master_keys=[SecretStr(Fernet.generate_key().decode())], admin_token=SecretStr(admin),
                allow_loopback=True, runs_dir=work / "runs", datasets_dir=SHARED_DATASETS,
                max_concurrent_jobs=args.n, **models)
            base, session_dir = start_service(stack, settings, args.num_cpus)
            with httpx.Client(base_url=base, timeout=60.0) as api:
                jobs = []
                for i, p in enumerate(participants):
                    key, version_id = onboard(api, admin, p, f"Bench system {i}")
                    jobs.append({"name": f"participant-{i}", "key": key, "version_id": version_id,
                                 "label": f"many-{i}"})
                print(f"service up, {args.n} participants onboarded; {args.n} SMOKE jobs submitted at once; "
                      f"models p50 {args.p50_ms:.0f} / p99 {args.p99_ms:.0f} ms, {args.rpm:,.0f} RPM / "
                      f"{args.tpm:,.0f} TPM each, time scale {ts}", flush=True)
                t0 = time.monotonic()
                submit_all(api, jobs)
                poll_all(api, jobs, args.timeout_s)
                wall = time.monotonic() - t0
            mstats = model.stats()
            for job in jobs:
                job["scored"] = scored(settings.runs_dir, job)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if session_dir:
            shutil.rmtree(session_dir, ignore_errors=True)
    return report(args, jobs, mstats, t0, wall, load_start)


def report(args, jobs: list[dict[str, Any]], mstats: dict[str, Any], t0: float, wall: float,
           load_start: float) -> int:
    """Print the batch's figures and each job's; 0 when every job completed, else 1."""
    per_s = args.tpm / 60 / args.time_scale  # each model's tokens per real second at its TPM
    tokens = {kind: m["tokens_charged"] for kind, m in mstats["models"].items()}
    admitted = {kind: m["admitted"] for kind, m in mstats["models"].items()}  # (time.monotonic(), tokens) each
    bound = max(tokens.values(), default=0) / per_s  # each job's share: total / N tokens at TPM / N
    calls = sum(m["calls"] for m in mstats["models"].values())
    refused = sum(m["rejected_429"] for m in mstats["models"].values())
    worst = max(((j["end"] - t0) / bound for j in jobs if "end" in j), default=float("nan")) if bound else float("nan")
    questions = sum(j.get("scored", 0) for j in jobs)
    print(f"N={args.n}: wall {wall:.1f} s, {questions} questions scored, {questions / wall:.1f} questions/s in all; "
          f"429s {refused} / {calls} model calls ({refused / max(calls, 1):.2%}); fairness (largest wall / own bound) "
          f"{worst:.2f}; load {load_start:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"  each job's bound: {bound:.1f} s (the models' tokens, {', '.join(f'{k} {v:,}' for k, v in tokens.items())},"
          f" at TPM: each job's share of both)")
    for kind, calls_of in sorted(admitted.items()):
        print(f"  {kind} model's tokens charged per tenth of the wall, as a share of its TPM: "
              + " ".join(f"{u:.0%}" for u in utilisation(calls_of, t0, wall, per_s)))
    ok = True
    for job in jobs:
        seen = job.get("job") or {}
        ok = ok and seen.get("status") == "completed"
        if "end" not in job:
            print(f"  {job['name']}: {job.get('error', 'no final status')}")
            continue
        w = job["end"] - t0
        print(f"  {job['name']}: {seen.get('status')}, wall {w:6.1f} s = {w / bound:.2f} x bound {bound:.1f} s; "
              f"scored {job['scored']}" + (f"; {seen['error_summary']}" if seen.get("error_summary") else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
