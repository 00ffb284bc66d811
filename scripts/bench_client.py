"""The participant client's own cost, in-process: ``ParticipantClient`` against a plain aiohttp loop.

Both run in this process on uvloop (the event loop Ray gives its actors), against the loopback
participant (``scripts/loopback_servers.py``), without Ray. Per round it prints, for each: Searches per
second (whole run and steady state at the server), client CPU per Search, and the event loop's lag
(how late a 2 ms timer fires: p50 and p99, and the sum of lags over 5 ms), which is what a reply waits
before the loop reads it.

``--instant`` replaces the HTTP session with one that answers at once, so only the client's own Python work is timed. Run as a
script, it first turns transparent huge pages off for its process, as the Ray actors do
(:func:`aml_ray.run.ray_runtime.tune_actor_process`).

    python scripts/bench_client.py --samples 10 --rounds 3
    python scripts/bench_client.py --instant
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_pipeline as bench  # noqa: E402
from loopback_servers import ServerProcess, search_reply  # noqa: E402


class _LagMonitor:
    """How late a 2 ms timer fires on the running loop, sampled until :meth:`stop`."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(0.002)
            self.lags.append(time.perf_counter() - t0 - 0.002)

    def stop(self) -> dict[str, float]:
        self._task.cancel()
        lags = sorted(self.lags) or [0.0]
        return {"lag_p50_ms": lags[len(lags) // 2] * 1000, "lag_p99_ms": lags[int(0.99 * (len(lags) - 1))] * 1000,
                "lag_over_5ms_ms": sum(x for x in lags if x > 0.005) * 1000}


class _InstantSession:
    """Stands in for the aiohttp session: every POST answers 200 with one fixed Search body, at once."""

    def __init__(self, raw: bytes):
        self.raw = raw

    def post(self, url, data=None, allow_redirects=False):
        return _InstantReply(self.raw)

    async def close(self) -> None:
        pass


class _InstantReply:
    status, headers = 200, {}

    def __init__(self, raw: bytes):
        self.raw = raw

    async def __aenter__(self):
        await asyncio.sleep(0)  # a reply comes on a later turn of the loop, as a real one does
        return self

    async def __aexit__(self, *exc) -> bool:
        return False

    async def read(self) -> bytes:
        return self.raw


async def client_run(base_url: str, args) -> dict[str, float]:
    """``args.queries`` Searches through one ParticipantClient, one ``search_table`` call per sample, 16 at once."""
    from aml_ray.actors.participant import ParticipantClient, ParticipantSpec

    spec = ParticipantSpec(add_url=f"{base_url}/add", search_url=f"{base_url}/search", max_in_flight=args.concurrency)
    client = ParticipantClient(spec)
    batches = bench.search_items(args.queries, args.samples, args.top_k)
    await client.search_table(batches[0][:1])  # connections and senders up
    if args.instant:
        await client.aclose()
        client._ensure()  # new senders: they take the session when they first run, after the swap below
        real, raw = client._client, json.dumps(search_reply(batches[0][0]["request"], args.memories)).encode()
        client._client = _InstantSession(raw)
        await real.close()
    slots = asyncio.Semaphore(16)

    async def one(batch: list[dict]) -> None:
        async with slots:
            await client.search_table(batch)

    monitor = _LagMonitor()
    c0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one(b) for b in batches))
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    out = monitor.stop()
    await client.aclose()
    n = len(batches) * len(batches[0])
    return {"client_rate": n / wall, "cpu_us": cpu / n * 1e6, **out}


async def plain_run(base_url: str, args) -> dict[str, float]:
    monitor = _LagMonitor()
    c0 = time.process_time()
    wall = await bench.plain_aiohttp(f"{base_url}/search", args.queries, args.concurrency)
    cpu = time.process_time() - c0
    return {"client_rate": args.queries / wall, "cpu_us": cpu / args.queries * 1e6, **monitor.stop()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queries", type=int, default=10_000)
    p.add_argument("--samples", type=int, default=100, help="one search_table call per sample")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--memories", type=int, default=10)
    p.add_argument("--top-k", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds: plain loop, then client")
    p.add_argument("--instant", action="store_true", help="client only, its session answering at once")
    args = p.parse_args(argv)
    import uvloop

    with ServerProcess("participant", "--latency-ms", str(args.latency_ms), "--capacity", str(args.concurrency),
                       "--memories", str(args.memories)) as server:
        for r in range(args.rounds):
            kinds = ["client"] if args.instant else ["plain", "client"]
            for kind in kinds:
                server.reset()
                res = uvloop.run((plain_run if kind == "plain" else client_run)(server.base_url, args))
                steady = "" if args.instant else f"  steady at the server {server.steady_rate('search'):,.0f}"
                print(f"round {r + 1} {kind:6} {res['client_rate']:7,.0f} Searches/s{steady}  "
                      f"CPU {res['cpu_us']:5.1f} us/Search  loop lag p50 {res['lag_p50_ms']:.2f} ms, "
                      f"p99 {res['lag_p99_ms']:.1f} ms, over 5 ms {res['lag_over_5ms_ms']:.0f} ms in all", flush=True)


if __name__ == "__main__":
    from aml_ray.run.ray_runtime import disable_transparent_huge_pages

    disable_transparent_huge_pages()  # as in the Ray actors (aml_ray.run.ray_runtime.tune_actor_process)
    main()
