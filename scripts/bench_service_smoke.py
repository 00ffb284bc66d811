"""Benchmark: how soon a SMOKE job of the real service reaches the participant (issue 29).

Starts what ``aml-ray serve`` starts, the way ``scripts/drill_load.py`` and ``tests/test_service_flow.py``
do: a local Ray cluster (:func:`aml_ray.run.ray_runtime.init_ray`) and the service's Ray Serve app
(:func:`aml_ray.serve_app.deployment.run`) on 127.0.0.1, a fresh SQLite store in a temp folder, the job
dispatcher on, the shipped Textual suite with its data from ``../shared/datasets`` (a smoke job runs its
first bundle, LoCoMo, with 1 sample) and the locked models behind the loopback model server
(``scripts/loopback_servers.py model``). ``AML_ALLOW_LOOPBACK`` is on (the documented operator switch
for test set-ups); no quota or security rule is changed.

The participants: two processes of the reference BM25 memory system (``aml_ray.reference``, Bearer auth;
a stub that only echoes, like the loopback participant, fails the smoke's conformance battery, so no
Add of the run would ever come), each wrapped in a recorder that notes ``time.time()``, path and
``user_id`` of every request it receives (``GET /arrivals``). Every clock here is the machine's wall
clock, so the recorder's, this script's and the service's timestamps compare directly.

Each participant onboards through the public API as a participant would (access request, admin
approval, the key read once from the status endpoint), then SMOKE jobs are submitted one after the
other (``POST /api/jobs`` with the participant's key; the smoke quota is 1 per hour per key, hence
one participant per job): the first on a fresh service (cold), the next ones on the same, now warm,
service. For each job it prints, in seconds from the submission:

- the job's own timestamps (store: created, started, finished) and the Ray actors that came alive
  during the job (GCS actor table: the job actor, or the next standby job actor when the job ran in the
  standby the dispatcher kept, the shared client actors, the Ray Data pools);
- the first request at the participant (conformance battery), the battery's last request, the
  pre-flight probe, the first Add and first Search of the run, the last request;
- the end (the final status seen by polling ``GET /api/jobs/{id}`` every 0.2 s);
- the job's own timings: conformance checks' ``elapsed_ms``, run.json's ``timings`` and ``wall_s``;

and the machine's load average at start and end. Everything it starts (Ray, Serve, the servers, the
temp folder, the Ray session folder) is stopped or removed at the end.

    .venv/bin/python scripts/bench_service_smoke.py [--jobs 2] [--model-latency-ms 20] [--num-cpus N] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHARED_DATASETS = REPO.parent / "shared" / "datasets"
HOST = "127.0.0.1"
FINAL = ("completed", "failed", "partial")


# --- the participant: the reference memory system behind a request recorder (its own process) ----------

class Recorder:
    """ASGI middleware: notes ``[time.time(), method, path, user_id]`` of every request; serves them at ``GET /arrivals``."""

    def __init__(self, app):
        self.app, self.log = app, []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t, path = time.time(), scope["path"]
        if path == "/arrivals":
            body = json.dumps(self.log).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            return await send({"type": "http.response.body", "body": body})
        raw, more = b"", scope["method"] == "POST"
        while more:
            msg = await receive()
            raw += msg.get("body", b"")
            more = msg.get("more_body", False)
        try:
            user = json.loads(raw).get("user_id") if raw else None
        except (ValueError, AttributeError):
            user = None
        self.log.append([t, scope["method"], path, user])
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def participant_main(db: Path, parent_pid: int) -> int:
    """The participant process: reference app (Bearer, secret from ``$AML_REFERENCE_SECRET``) + :class:`Recorder`."""
    from aml_ray.reference.app import create_app
    from aml_ray.reference.server import SECRET_ENV, die_with_parent, serve_on

    if not die_with_parent(parent_pid, True):
        return 1
    app = create_app(db, auth="Bearer", secret=os.environ[SECRET_ENV])
    try:
        serve_on(Recorder(app), HOST, 0, "warning")  # prints READY http://host:port
    finally:
        app.state.store.close()
    return 0


class Participant:
    """One recorded reference participant in a subprocess (context manager)."""

    def __init__(self, work: Path, name: str):
        self.secret = "msk-bench-" + secrets.token_hex(12)
        self.db, self.log = work / f"{name}.sqlite3", work / f"{name}.stderr"
        self.proc: subprocess.Popen | None = None
        self.base = ""

    def __enter__(self) -> Participant:
        from aml_ray.reference.server import SECRET_ENV

        cmd = [sys.executable, __file__, "--participant", str(self.db), str(os.getpid())]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log.open("w"), text=True,
                                     env={**os.environ, SECRET_ENV: self.secret})
        line = self.proc.stdout.readline()
        if not line.startswith("READY "):
            self.__exit__()
            raise RuntimeError(f"participant did not start: {line!r}; {self.log.read_text()[-2000:]}")
        self.base = line.split()[1]
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def arrivals(self) -> list[list]:
        import httpx

        return httpx.get(f"{self.base}/arrivals", timeout=10).json()


# --- the service, through its API ----------------------------------------------------------------------

def onboard(api, admin: str, p: Participant, name: str) -> tuple[str, str]:
    """Access request -> admin approval -> key read once from the status endpoint; returns (key, version id)."""
    body = {"contact_name": "Bench", "contact_email": "bench@example.org", "organization": "Bench Lab",
            "system_name": name, "version_label": "v1", "track": "textual", "division": "open_source",
            "add_url": f"{p.base}/add", "search_url": f"{p.base}/search", "health_url": f"{p.base}/health",
            "auth_scheme": "Bearer", "memory_system_key": p.secret, "max_in_flight": 16,
            "repository_url": "https://github.com/example/bm25-memory", "commit": "0123abc",
            "attribution": "BM25 (Robertson et al.); bm25s"}
    r = api.post("/api/access-requests", json=body)
    r.raise_for_status()
    a = api.post(f"/api/admin/access-requests/{r.json()['id']}/approve", headers={"Authorization": f"Bearer {admin}"})
    a.raise_for_status()
    s = api.post("/api/access-requests/status", json={"status_token": r.json()["status_token"]})
    s.raise_for_status()
    return s.json()["leaderboard_key"], s.json()["version_id"]


def _ts(value: str | None) -> float | None:
    if not value:
        return None
    dt = datetime.fromisoformat(value)
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()


def actors_alive_since(t0: float) -> list[tuple[float, str]]:
    """(alive at, class name) of the Ray actors that came alive at or after ``t0`` (GCS actor table)."""
    import ray

    rows = [(a["StartTime"] / 1000, a["ActorClassName"]) for a in ray._private.state.actors().values()
            if a["StartTime"] and a["StartTime"] / 1000 >= t0]
    return sorted(rows)


def run_job(api, key: str, version_id: str, label: str, p: Participant, runs_dir: Path,
            timeout_s: float) -> dict[str, Any]:
    """Submit one smoke job, poll it to its end, and collect every timestamp (``time.time()``)."""
    auth = {"Authorization": f"Bearer {key}"}
    t_submit = time.time()
    r = api.post("/api/jobs", headers=auth, json={"version_id": version_id, "mode": "smoke", "run_label": label,
                                                  "track": "textual"})
    t_answered = time.time()
    if r.status_code != 202:
        raise RuntimeError(f"POST /api/jobs answered {r.status_code}: {r.text}")
    job_id = r.json()["id"]
    deadline = t_submit + timeout_s
    while True:
        job = api.get(f"/api/jobs/{job_id}", headers=auth).json()
        if job["status"] in FINAL:
            t_end = time.time()
            break
        if time.time() > deadline:
            raise TimeoutError(f"job {job_id} still {job['status']} after {timeout_s:.0f} s")
        time.sleep(0.2)
    arrivals = [a for a in p.arrivals() if a[0] >= t_submit]
    run_json = runs_dir / job_id / "locomo" / "run.json"
    return {"job": job, "t_submit": t_submit, "t_answered": t_answered, "t_end": t_end, "arrivals": arrivals,
            "actors": actors_alive_since(t_submit),
            "run_info": json.loads(run_json.read_text()) if run_json.exists() else None}


def classify(arrivals: list[list]) -> dict[str, list[list]]:
    """Arrivals by kind: conformance (``check:`` ids in any case, the health GET), pre-flight probe, run Adds/Searches."""
    out: dict[str, list[list]] = {"conformance": [], "preflight": [], "add": [], "search": [], "other": []}
    for a in arrivals:
        _, method, path, user = a
        if (user or "").lower().startswith("check:") or (method == "GET" and path == "/health"):  # isolation: CHECK:
            out["conformance"].append(a)
        elif (user or "").startswith("eval:") and user.endswith(":preflight"):
            out["preflight"].append(a)
        elif (user or "").startswith("eval:") and path in ("/add", "/search"):
            out[path[1:]].append(a)
        else:
            out["other"].append(a)
    return out


def report(name: str, fig: dict[str, Any]) -> dict[str, float | None]:
    """Print one job's breakdown; returns its three headline figures."""
    t0, job, info = fig["t_submit"], fig["job"], fig["run_info"] or {}

    def rel(t: float | None) -> str:
        return f"{t - t0:8.3f}" if t is not None else "       -"

    kinds = classify(fig["arrivals"])
    first = min((a[0] for a in fig["arrivals"]), default=None)
    first_add = kinds["add"][0][0] if kinds["add"] else None
    rows = [("POST /api/jobs answered (202)", fig["t_answered"]),
            ("job created_at (store)", _ts(job["created_at"])),
            ("job started_at (store: runner in its actor)", _ts(job["started_at"])),
            ("first request at the participant", first),
            ("  conformance: first / last request", None),
            ("  pre-flight probe (first request)", kinds["preflight"][0][0] if kinds["preflight"] else None),
            ("FIRST ADD of the run", first_add),
            ("  first Search of the run", kinds["search"][0][0] if kinds["search"] else None),
            ("  last request at the participant", max((a[0] for a in fig["arrivals"]), default=None)),
            ("job finished_at (store)", _ts(job["finished_at"])),
            ("END: final status seen (poll 0.2 s)", fig["t_end"])]
    conf = kinds["conformance"]
    print(f"\n== {name}: job {job['id']} status {job['status']}"
          + (f" ({job['error_summary']})" if job["error_summary"] else ""))
    print("   seconds after the submission (POST /api/jobs sent):")
    for label, t in rows:
        if label.startswith("  conformance"):
            span = f"{rel(conf[0][0])} / {rel(conf[-1][0]).strip()}" if conf else "       -"
            print(f"   {label:<46} {span}   ({len(conf)} requests)")
        else:
            print(f"   {label:<46} {rel(t)}")
    print(f"   requests: conformance {len(conf)}, pre-flight {len(kinds['preflight'])}, run Adds "
          f"{len(kinds['add'])}, run Searches {len(kinds['search'])}, other {len(kinds['other'])}")
    # the runner's start in its actor: the standby the dispatcher kept (alive before the submission), or an
    # actor started for the claim; a JobActor that comes alive during the job is then the next standby
    actor = _ts(job["started_at"])
    pre = kinds["preflight"][0][0] if kinds["preflight"] else None
    if None not in (actor, first, pre, first_add) and conf:
        later = sum(1 for t, _ in fig["actors"] if pre <= t <= first_add)
        print(f"   breakdown: submission -> runner started {actor - t0:.3f} s | -> first request {first - actor:.3f} s"
              f" | conformance {conf[-1][0] - conf[0][0]:.3f} s | -> pre-flight {pre - conf[-1][0]:.3f} s | pre-flight"
              f" -> first Add {first_add - pre:.3f} s ({later} actor processes came alive in it) | first Add -> end "
              f"{fig['t_end'] - first_add:.3f} s")
    print("   Ray actors that came alive during the job (alive = constructor done):")
    for t, cls in fig["actors"]:
        print(f"     {rel(t)}  {cls[:70]}")
    checks = (job.get("conformance") or {}).get("checks") or []
    if checks:
        total = sum(c.get("elapsed_ms") or 0 for c in checks) / 1000
        slow = sorted(checks, key=lambda c: -(c.get("elapsed_ms") or 0))[:4]
        print(f"   job's conformance report: {len(checks)} checks, {total:.3f} s in all; slowest: "
              + ", ".join(f"{c['name']} {c['elapsed_ms'] / 1000:.3f} s" for c in slow))
    if info:
        print(f"   run.json: started_at {rel(_ts(info.get('started_at'))).strip()} s, finished_at "
              f"{rel(_ts(info.get('finished_at'))).strip()} s, timings {info.get('timings')}, wall_s {info.get('wall_s')} "
              "(wall_s counts from the job actor's worker process start, which Ray may have started earlier)")
    return {"first_request": first - t0 if first else None, "first_add": first_add - t0 if first_add else None,
            "end": fig["t_end"] - t0}


def start_service(stack: contextlib.ExitStack, settings, num_cpus: int | None) -> tuple[str, str | None]:
    """Start what ``aml-ray serve`` starts on 127.0.0.1: a local Ray cluster (:func:`init_ray`, unless one is up)
    and the Serve app with ``settings``, both stopped when ``stack`` unwinds (Ray last).

    Returns:
        ``(the service's base URL, the Ray session folder when this call started Ray, else None)``.
    """
    import ray
    from ray import serve

    from aml_ray.run.ray_runtime import init_ray
    from aml_ray.serve_app.deployment import run
    from drill_load import free_port, wait_ready

    session_dir = None
    if init_ray(num_cpus=num_cpus):  # stopped last (the stack unwinds in reverse)
        stack.callback(ray.shutdown)
        session_dir = ray._private.worker._global_node.get_session_dir_path()
    port = free_port()
    stack.callback(serve.shutdown)
    run(settings, host=HOST, port=port)
    base = f"http://{HOST}:{port}"
    wait_ready(base)
    return base, session_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2, help="smoke jobs one after the other (default 2: cold, warm)")
    ap.add_argument("--model-latency-ms", type=float, default=20.0, help="loopback model server latency")
    ap.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray cluster (default all)")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="most seconds one job may take")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder and the Ray session folder")
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

    load_start = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="aml-bench-smoke-"))
    os.environ["AML_DATA_DIR"] = str(work / "data")  # cache and defaults of this process and Ray's workers
    admin = "admin-" + secrets.token_hex(16)
    session_dir = None
    figures: list[tuple[str, dict]] = []
    heads: list[tuple[str, dict]] = []
    try:
        with contextlib.ExitStack() as stack:
            model = stack.enter_context(ServerProcess("model", "--latency-ms", str(args.model_latency_ms)))
            participants = [stack.enter_context(Participant(work, f"participant-{i}")) for i in range(args.jobs)]
            models = {role: ModelEndpoint(role=role, base_url=f"{model.base_url}/v1", model="gpt-4o-mini",
                                          api_key=SecretStr("sk-bench"), cache_path=None)
                      for role in ("answer", "judge")}
            settings = ServiceSettings(
                database_url=f"sqlite:///{work / 'aml.sqlite3'}",
                master_keys=[SecretStr(Fernet.generate_key().decode())], admin_token=SecretStr(admin),
                allow_loopback=True, runs_dir=work / "runs", datasets_dir=SHARED_DATASETS, **models)
            t_setup = time.perf_counter()
            base, session_dir = start_service(stack, settings, args.num_cpus)
            print(f"service up in {time.perf_counter() - t_setup:.1f} s (Ray start + Serve deploy) at {base}; "
                  f"load average at start {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f} "
                  f"on {os.cpu_count()} CPUs", flush=True)
            with httpx.Client(base_url=base, timeout=60.0) as api:
                for i, p in enumerate(participants):
                    key, version_id = onboard(api, admin, p, f"Bench system {i}")
                    name = f"job {i + 1} ({'cold: first job on this service' if i == 0 else 'warm'})"
                    figures.append((name, run_job(api, key, version_id, f"smoke-bench-{i}", p,
                                                  settings.runs_dir, args.timeout_s)))
                    time.sleep(1.0)  # let the finished job's actor exit before the next submission
            heads = [(name, report(name, fig)) for name, fig in figures]
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
            if session_dir:
                shutil.rmtree(session_dir, ignore_errors=True)
        else:
            print(f"kept: {work} and {session_dir}")
    load_end = os.getloadavg()
    print("\nsummary (seconds from the submission):")
    print(f"   {'job':<40} {'first request':>14} {'first Add':>10} {'end':>8}")
    for name, h in heads:
        cells = [f"{h[k]:.3f}" if h[k] is not None else "-" for k in ("first_request", "first_add", "end")]
        print(f"   {name:<40} {cells[0]:>14} {cells[1]:>10} {cells[2]:>8}")
    print(f"load average: start {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}, "
          f"end {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f} (1, 5, 15 min) on {os.cpu_count()} CPUs")
    return 0 if all(fig["job"]["status"] == "completed" for _, fig in figures) else 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--participant":
        sys.exit(participant_main(Path(sys.argv[2]), int(sys.argv[3])))
    sys.exit(main())
