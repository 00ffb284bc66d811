"""Load drill: the Serve app on loopback under a bounded burst of public-board and job-status reads.

Starts Ray and the service's Ray Serve application on 127.0.0.1 (a fresh SQLite store in a temp folder,
no job worker), seeds a published board and one participant job part-way through its stages through
the store, then drives three endpoints one after the other with aiohttp at a fixed concurrency:

- ``GET /api/leaderboard/textual`` (public JSON),
- ``GET /leaderboard/textual`` (public HTML page),
- ``GET /api/jobs/{id}`` (job status, with the participant's key).

Bounded in count (``--requests`` per endpoint) and time (``--max-seconds`` for the whole drill: a phase
stops sending when the time is up). Every reply is checked (status 200 and the expected content); any
other outcome is an error. Prints requests/s, p50 and p99 latency per endpoint and the error count, and
exits 1 when there was any error. Traffic goes only to the loopback address it started.

    python scripts/drill_load.py [--requests 1000] [--concurrency 32] [--max-seconds 60] [--rows 25]
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import aiohttp
from cryptography.fernet import Fernet
from pydantic import SecretStr

from aml_ray.serve_app.settings import ServiceSettings
from aml_ray.store import make_engine, session_factory, upgrade
from aml_ray.store.synthetic import SyntheticEntry, job_in_progress, publish

HOST = "127.0.0.1"


@dataclass
class Phase:
    """The outcome of one endpoint's phase.

    Attributes:
        name: ``METHOD path`` shown in the report.
        latencies_ms: latency of each successful request, in ms.
        errors: requests that failed (transport error, non-200 status or unexpected body).
        error_kinds: a few examples of the errors (status or exception class).
        wall_s: the phase's wall time in seconds.
        sent: requests sent.
    """

    name: str
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    sent: int = 0


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def free_port() -> int:
    """A free TCP port on the loopback address."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def seed(database_url: str, rows: int) -> tuple[str, str]:
    """A published board of ``rows`` systems and one running job; returns (participant key, job id)."""
    engine = make_engine(database_url)
    upgrade(engine)
    sessions = session_factory(engine)
    start = datetime(2026, 1, 5, tzinfo=timezone.utc)
    with sessions.begin() as session:
        for i in range(rows):
            division = "open_source" if i % 3 == 0 else "commercial"
            publish(session, SyntheticEntry(
                f"System {i:02d}", f"Org {i % 7}", division,
                {"locomo": 0.35 + (i * 37 % 50) / 100, "longmemeval": 0.30 + (i * 53 % 55) / 100},
                coverage=1.0 - (i % 4) / 100, published_at=start + timedelta(days=i)))
        key, job = job_in_progress(session)
        job_id = job.id
    engine.dispose()
    return key, job_id


async def run_phase(session: aiohttp.ClientSession, name: str, url: str, headers: dict[str, str], check,
                    requests: int, concurrency: int, deadline: float) -> Phase:
    """Send ``requests`` GETs to ``url`` with ``concurrency`` in flight, stopping at ``deadline``."""
    phase = Phase(name)
    remaining = [requests]

    async def worker() -> None:
        while remaining[0] > 0 and time.monotonic() < deadline:
            remaining[0] -= 1
            phase.sent += 1
            t0 = time.perf_counter()
            try:
                async with session.get(url, headers=headers) as response:
                    body = await response.read()
                    ok = response.status == 200 and check(body)
                    kind = f"HTTP {response.status}" if response.status != 200 else "unexpected body"
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                ok, kind = False, type(exc).__name__
            if ok:
                phase.latencies_ms.append((time.perf_counter() - t0) * 1000)
            else:
                phase.errors += 1
                phase.error_kinds[kind] = phase.error_kinds.get(kind, 0) + 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    phase.wall_s = time.perf_counter() - t0
    return phase


async def drive(base: str, key: str, job_id: str, rows: int, args) -> list[Phase]:
    """Warm up, then run the three phases within the drill's time budget."""
    deadline = time.monotonic() + args.max_seconds

    def board_ok(body: bytes) -> bool:
        return len(json.loads(body)["rows"]) == rows

    def page_ok(body: bytes) -> bool:
        return body.count(b"<tr data-system=") == rows

    def job_ok(body: bytes) -> bool:
        job = json.loads(body)
        return job["id"] == job_id and job["status"] == "running" and len(job["stages"]) == 4

    targets = [("GET /api/leaderboard/textual", f"{base}/api/leaderboard/textual", {}, board_ok),
               ("GET /leaderboard/textual", f"{base}/leaderboard/textual", {}, page_ok),
               ("GET /api/jobs/{id}", f"{base}/api/jobs/{job_id}", {"Authorization": f"Bearer {key}"}, job_ok)]
    timeout = aiohttp.ClientTimeout(total=10)
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        for name, url, headers, check in targets:  # warm-up, not counted
            await run_phase(session, name, url, headers, check, 20, 4, deadline)
        return [await run_phase(session, name, url, headers, check, args.requests, args.concurrency, deadline)
                for name, url, headers, check in targets]


def wait_ready(base: str, timeout_s: float = 60.0) -> None:
    """Serve answers 404 until the routes are deployed: wait for a 200."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/api/leaderboard/textual", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the Serve app at {base} was not ready within {timeout_s:.0f} s")


def report(phases: list[Phase], args, setup_s: float) -> int:
    """Print the table; returns the total error count."""
    print(f"load drill: Ray Serve app on {HOST} (loopback), {args.rows} published rows, concurrency "
          f"{args.concurrency}, up to {args.requests} requests per endpoint, {args.max_seconds:.0f} s cap "
          f"(setup {setup_s:.1f} s; machine load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    print(f"{'endpoint':<30} {'sent':>6} {'ok':>6} {'errors':>6} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}")
    total_errors = 0
    for p in phases:
        ok = len(p.latencies_ms)
        rate = p.sent / p.wall_s if p.wall_s else 0.0
        print(f"{p.name:<30} {p.sent:>6} {ok:>6} {p.errors:>6} {rate:>8.1f} {percentile(p.latencies_ms, 0.5):>8.1f} "
              f"{percentile(p.latencies_ms, 0.99):>8.1f}")
        if p.error_kinds:
            print(f"{'':<30} errors: {p.error_kinds}")
        total_errors += p.errors
    short = [p.name for p in phases if p.sent < args.requests]
    if short:
        print(f"time cap reached before all requests were sent: {', '.join(short)}")
    print(f"errors: {total_errors}")
    return total_errors


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1000, help="requests per endpoint (default 1000)")
    ap.add_argument("--concurrency", type=int, default=32, help="requests in flight (default 32)")
    ap.add_argument("--max-seconds", type=float, default=60.0, help="time cap of the drive (default 60)")
    ap.add_argument("--rows", type=int, default=25, help="published rows on the board (default 25)")
    ap.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray cluster")
    args = ap.parse_args(argv)
    if not 1 <= args.requests <= 100_000 or not 1 <= args.concurrency <= 256 or not 0 < args.max_seconds <= 600:
        ap.error("bounds: 1 <= --requests <= 100000, 1 <= --concurrency <= 256, 0 < --max-seconds <= 600")
    assert ipaddress.ip_address(HOST).is_loopback

    import ray
    from ray import serve

    from aml_ray.run.ray_runtime import init_ray
    from aml_ray.serve_app.deployment import run

    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="aml-load-drill-"))
    settings = ServiceSettings(database_url=f"sqlite:///{work / 'aml.sqlite3'}",
                               master_keys=[SecretStr(Fernet.generate_key().decode())], run_worker=False,
                               health_check=False, runs_dir=work / "runs")
    key, job_id = seed(settings.database_url, args.rows)
    started = init_ray(num_cpus=args.num_cpus)
    port = free_port()
    try:
        run(settings, host=HOST, port=port)
        base = f"http://{HOST}:{port}"
        wait_ready(base)
        setup_s = time.perf_counter() - t0
        phases = asyncio.run(drive(base, key, job_id, args.rows, args))
    finally:
        serve.shutdown()
        if started:
            ray.shutdown()
    errors = report(phases, args, setup_s)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
