"""Concurrency that finds the participant's capacity, and latency that tells the truth (issues 29 and 25.5).

Against real loopback participants in their own processes (scripts/loopback_servers.py): one that serves
one request at a time (``--capacity 1``) and one that serves all it is sent. The client runs in this
process (no Ray). Assertions are on the limit's range and on the ratio of recorded latencies to the
server's set service time, never on wall-clock speed.
"""

from __future__ import annotations

import statistics

import pytest

from aml_ray.actors.participant import ParticipantClient, ParticipantSpec
from aml_ray.contract import SearchRequest
from scripts.loopback_servers import ServerProcess

SERVICE_MS = 20.0


def _spec(server: ServerProcess, max_in_flight: int, **kw) -> ParticipantSpec:
    return ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search",
                           max_in_flight=max_in_flight, **kw)


async def _searches(client: ParticipantClient, n: int) -> list[dict]:
    reqs = [(SearchRequest(query=f"q{i}", user_id="u1", top_k=5), f"ref-{i}") for i in range(n)]
    try:
        return await client.search_many(reqs)
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def serial_server():
    with ServerProcess("participant", "--latency-ms", str(SERVICE_MS), "--capacity", "1") as server:
        yield server


async def test_a_one_at_a_time_participant_gets_one_or_two_in_flight_and_its_true_latency(serial_server):
    """max_in_flight 8 against a serial participant: the reported p50 is the service time, the wait is queue_ms."""
    serial_server.reset()
    client = ParticipantClient(_spec(serial_server, 8))
    outs = await _searches(client, 60)
    limit = client.concurrency()
    stats = serial_server.stats()
    assert [o["status"] for o in outs] == ["ok"] * 60
    assert limit["declared"] == 8 and 1 <= limit["min"] and limit["max"] <= 2 and limit["final"] <= 2
    assert stats["max_in_flight"] <= 2  # requests held or queued at the server at once
    latency = statistics.median(o["latency_ms"] for o in outs)
    queued = statistics.median(o["queue_ms"] for o in outs)
    # at most 2 in flight: a Search's time at the participant is its service time, or one more ahead of it
    assert SERVICE_MS * 0.9 <= latency <= SERVICE_MS * 2.2, latency
    # 60 queued at once, served one at a time: the median Search waited for about 30 services
    assert queued >= 10 * SERVICE_MS, queued
    assert all(o["elapsed_ms"] >= o["queue_ms"] + o["latency_ms"] - 1 for o in outs)


async def test_a_fixed_limit_queues_at_the_participant_instead(serial_server):
    """The same run with the adaptive limit off: 8 in flight, and each Search's time there is 8 services."""
    serial_server.reset()
    client = ParticipantClient(_spec(serial_server, 8, adaptive_concurrency=False))
    outs = await _searches(client, 40)
    assert serial_server.stats()["max_in_flight"] == 8
    assert statistics.median(o["latency_ms"] for o in outs) >= 5 * SERVICE_MS
    assert client.concurrency()["min"] == client.concurrency()["max"] == 8


async def test_a_participant_that_keeps_up_gets_its_declared_limit():
    with ServerProcess("participant", "--latency-ms", str(SERVICE_MS)) as server:
        client = ParticipantClient(_spec(server, 16))
        outs = await _searches(client, 400)
        stats = server.stats()
    limit = client.concurrency()
    assert [o["status"] for o in outs] == ["ok"] * 400
    # it reaches the declared 16 and the server sees 16 at once; where it ends depends on the machine: its
    # own load (not the participant's) slows some loopback replies and the limit backs off (final 11 and 5
    # seen on 2 busy cores, 16 on a quiet one), so the final value is not asserted
    assert limit["max"] == 16 and stats["max_in_flight"] == 16
    assert limit["trajectory"][0] == [0, 1] and limit["trajectory"][-1][1] == limit["final"]


def _simulate(limit, service_ms: float, capacity: int, replies: int, add_every: int = 0) -> list[int]:
    """Replies of a participant serving ``capacity`` at once: latency = service x ceil(in flight / capacity)."""
    seen = []
    for i in range(replies):
        n = limit.allowed()
        kind, service = ("add", 15 * service_ms) if add_every and i % add_every == 0 else ("search", service_ms)
        limit.record(kind, service * -(-n // capacity) * (1.0 + 0.05 * (i % 3)))
        seen.append(limit.allowed())
    return seen


@pytest.mark.parametrize("capacity, low, high", [(1, 1, 2), (4, 3, 8), (64, 64, 64)])
def test_the_limit_settles_near_the_capacity(capacity, low, high):
    from aml_ray.actors.adaptive import AdaptiveLimit

    seen = _simulate(AdaptiveLimit(64), 35.0, capacity, 3000)
    assert low <= min(seen[-500:]) and max(seen[-500:]) <= high, (min(seen[-500:]), max(seen[-500:]))


def test_adds_and_searches_each_compare_with_their_own_baseline():
    """A 15x slower Add among Searches does not read as queueing at a participant that keeps up."""
    from aml_ray.actors.adaptive import AdaptiveLimit

    seen = _simulate(AdaptiveLimit(32), 35.0, 1000, 2000, add_every=7)
    assert min(seen[-500:]) == 32


def test_bad_arguments_are_named():
    from aml_ray.actors.adaptive import AdaptiveLimit

    with pytest.raises(ValueError, match="max_limit"):
        AdaptiveLimit(0)
    with pytest.raises(ValueError, match="tolerance"):
        AdaptiveLimit(8, tolerance=1.0)


def test_a_participant_that_keeps_up_keeps_its_limit_when_the_client_machine_is_busy():
    """Latency jitter from a busy client machine (replies read 20-34 ms after sending, a few at 12 ms when the
    event loop happened to be free) at any number in flight: the participant keeps up, and its limit must
    reach and keep the declared 16. A baseline at the least latency seen (12 ms) read every reply as
    queued and held it far below (5-11 of 16 were seen on busy cores)."""
    from aml_ray.actors.adaptive import AdaptiveLimit

    limit = AdaptiveLimit(16)
    seen = []
    for i in range(3000):
        jittered = 20.0 * (1.0 + 0.7 * ((i * 7919) % 100) / 100)
        limit.record("search", 12.0 if i % 50 == 0 else jittered)
        seen.append(limit.allowed())
    assert min(seen[-1000:]) == 16, (min(seen[-1000:]), limit.describe()["trajectory"][-5:])
