"""The adaptive in-flight limit against real loopback participants: where it goes and what latency it reports.

Each scenario runs ``ParticipantClient`` in this process (no Ray) against a participant of
``scripts/loopback_servers.py`` in its own process, and returns its figures: the client's limit
(:meth:`~aml_ray.actors.participant.ParticipantClient.concurrency`: min, max, final, unloaded latency),
the most requests the server held or queued at once, and the median Search latency and queue wait
against the server's set service time. The figures depend on the machine's speed (a loaded machine
slows loopback replies and the limit backs off), so they are printed here, not asserted in the tests;
tests/test_adaptive_concurrency.py runs the scenarios for their speed-independent facts and checks the
limit's rules on a simulated clock.

Scenarios (the expectation on a quiet machine in brackets):

- ``serial``: max_in_flight 8 against a one-at-a-time participant [limit 1-2, Search p50 within 2.2x of
  the service time, the wait shown as queue_ms];
- ``beside_adds``: a sample's Searches start while another sample's Adds, 10x slower, still go in order at
  a one-at-a-time participant [final limit <= 2, Search p50 within 3x its service time];
- ``adds_in_order``: one sample's Adds one at a time, then its Searches [the limit never above 2];
- ``fixed``: the same as ``serial`` with the adaptive limit off [8 in flight, p50 >= 5 services];
- ``keeps_up``: max_in_flight 16 against a participant that serves all it is sent [the limit and the
  server reach 16].

    python scripts/bench_adaptive.py                 # every scenario, one JSON line each
    python scripts/bench_adaptive.py --only keeps_up --service-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aml_ray.actors.participant import ParticipantClient, ParticipantSpec  # noqa: E402
from aml_ray.contract import AddRequest, Message, SearchRequest  # noqa: E402
from scripts.loopback_servers import ServerProcess  # noqa: E402

#: The loopback participant's service time per Search, ms (a scenario's Adds take a multiple of it).
SERVICE_MS = 20.0


def spec_for(server: ServerProcess, max_in_flight: int, **kw) -> ParticipantSpec:
    """The spec of ``server``'s /add and /search with ``max_in_flight`` (and any other ParticipantSpec field)."""
    return ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search",
                           max_in_flight=max_in_flight, **kw)


def _adds(sample: str, n: int) -> list[AddRequest]:
    return [AddRequest(request_id=f"{sample}-{i}", user_id=sample, session_id="s",
                       messages=[Message(role="user", content=f"turn {i}")]) for i in range(n)]


def _searches(sample: str, n: int) -> list[tuple[SearchRequest, str]]:
    return [(SearchRequest(query=f"q{i}", user_id=sample, top_k=5), f"ref-{i}") for i in range(n)]


def _figures(client: ParticipantClient, server: ServerProcess, searches: list[dict], others: list[dict],
             service_ms: float) -> dict[str, Any]:
    """A scenario's figures: ``outcomes`` (every Add's and Search's outcome dict), ``limit`` (the client's
    concurrency description), ``server_max_in_flight``, and the Search medians in ms and as multiples of
    ``service_ms``."""
    latency = statistics.median(o["latency_ms"] for o in searches)
    queued = statistics.median(o["queue_ms"] for o in searches)
    return {"outcomes": others + searches, "limit": client.concurrency(),
            "server_max_in_flight": server.stats()["max_in_flight"], "search_p50_ms": latency,
            "search_p50_services": latency / service_ms, "queue_p50_ms": queued,
            "queue_p50_services": queued / service_ms}


async def serial(service_ms: float = SERVICE_MS, *, adaptive: bool = True, searches: int = 60) -> dict[str, Any]:
    """max_in_flight 8, ``searches`` Searches at once, a one-at-a-time participant (``fixed``: ``adaptive`` off)."""
    with ServerProcess("participant", "--latency-ms", str(service_ms), "--capacity", "1") as server:
        client = ParticipantClient(spec_for(server, 8, adaptive_concurrency=adaptive))
        try:
            outs = await client.search_many(_searches("u1", searches))
        finally:
            await client.aclose()
        return _figures(client, server, outs, [], service_ms)


async def beside_adds(service_ms: float = SERVICE_MS) -> dict[str, Any]:
    """Sample a's 10 Adds then 80 Searches, beside sample b's 20 Adds (each 10x a Search), one at a time."""
    with ServerProcess("participant", "--latency-ms", str(service_ms / 2), "--add-latency-ms",
                       str(service_ms * 5), "--capacity", "1") as server:
        client = ParticipantClient(spec_for(server, 8))

        async def sample_a() -> list[dict]:
            await client.add_in_order(_adds("a", 10))
            return await client.search_many(_searches("a", 80))

        try:
            searched, added = await asyncio.gather(sample_a(), client.add_in_order(_adds("b", 20)))
        finally:
            await client.aclose()
        return _figures(client, server, searched, added, service_ms / 2)


async def adds_in_order(service_ms: float = SERVICE_MS) -> dict[str, Any]:
    """One sample: 30 Adds in order (each 2x a Search), then 80 Searches; max_in_flight 64, one at a time."""
    with ServerProcess("participant", "--latency-ms", str(service_ms), "--add-latency-ms", str(service_ms * 2),
                       "--capacity", "1") as server:
        client = ParticipantClient(spec_for(server, 64))
        try:
            added = await client.add_in_order(_adds("a", 30))
            searched = await client.search_many(_searches("a", 80))
        finally:
            await client.aclose()
        return _figures(client, server, searched, added, service_ms)


async def keeps_up(service_ms: float = SERVICE_MS) -> dict[str, Any]:
    """max_in_flight 16, 400 Searches at once, a participant that serves all it is sent."""
    with ServerProcess("participant", "--latency-ms", str(service_ms)) as server:
        client = ParticipantClient(spec_for(server, 16))
        try:
            outs = await client.search_many(_searches("u1", 400))
        finally:
            await client.aclose()
        return _figures(client, server, outs, [], service_ms)


SCENARIOS = {"serial": serial, "beside_adds": beside_adds, "adds_in_order": adds_in_order,
             "fixed": lambda service_ms: serial(service_ms, adaptive=False, searches=40), "keeps_up": keeps_up}


def main(argv: list[str] | None = None) -> None:
    """Run the scenarios and print one JSON line each (the figures, without the outcome dicts)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=sorted(SCENARIOS), action="append", help="Run only this scenario (repeatable).")
    p.add_argument("--service-ms", type=float, default=SERVICE_MS, help="The participant's Search service time.")
    args = p.parse_args(argv)
    for name in args.only or SCENARIOS:
        figures = asyncio.run(SCENARIOS[name](args.service_ms))
        outcomes = figures.pop("outcomes")
        limit = figures.pop("limit")
        print(json.dumps({"scenario": name, "requests": len(outcomes),
                          "ok": sum(o["status"] == "ok" for o in outcomes),
                          **{k: limit[k] for k in ("declared", "min", "max", "final", "unloaded_ms")},
                          **{k: round(v, 2) if isinstance(v, float) else v for k, v in figures.items()}}), flush=True)


if __name__ == "__main__":
    main()
