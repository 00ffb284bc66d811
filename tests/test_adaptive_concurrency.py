"""Concurrency that finds the participant's capacity, and latency that tells the truth (issues 29 and 25.5).

Against real loopback participants in their own processes (scripts/loopback_servers.py): one that serves
one request at a time (``--capacity 1``) and one that serves all it is sent. The client runs in this
process (no Ray). Assertions against real participants are those that hold at any speed of the machine
(the limit's range, what the participant saw, the accounting of each request's time); where the limit
goes and the latency it reports are printed by scripts/bench_adaptive.py, and the limit's rules are
checked on a simulated clock (``_simulate``).
"""

from __future__ import annotations

import asyncio
import statistics

import pytest

from aml_ray.actors.participant import ParticipantClient
from aml_ray.contract import AddRequest, Message
from scripts import bench_adaptive
from scripts.bench_adaptive import spec_for
from scripts.loopback_servers import ServerProcess

SERVICE_MS = bench_adaptive.SERVICE_MS


@pytest.mark.parametrize("scenario, declared", [("serial", 8), ("beside_adds", 8), ("adds_in_order", 64),
                                                 ("keeps_up", 16)])
async def test_the_adaptive_limit_against_a_real_participant_stays_within_the_declared_one(scenario, declared):
    """The scenarios of scripts/bench_adaptive.py, which prints where the limit goes and the latency it reports
    (both depend on the machine's speed:
    a loaded machine slows loopback replies, and the limit backs off before the declared one). Here what holds at
    any speed: every request answered, the limit starts with one request alone (the endpoint's probe) and
    stays in [1, declared], the participant never sees more than declared, a request's time is its wait for
    a slot plus its time at the participant."""
    figures = await bench_adaptive.SCENARIOS[scenario](SERVICE_MS)
    limit, outs = figures["limit"], figures["outcomes"]
    assert [o["status"] for o in outs] == ["ok"] * len(outs)
    assert limit["declared"] == declared and 1 <= limit["min"] <= limit["final"] <= limit["max"] <= declared, limit
    assert limit["trajectory"][0] == [0, 1] and limit["trajectory"][-1][1] == limit["final"], limit
    assert 1 <= figures["server_max_in_flight"] <= declared
    assert all(o["elapsed_ms"] >= o["queue_ms"] + o["latency_ms"] - 1 for o in outs)
    assert "search" in limit["unloaded_ms"]  # the lone latency the limit compares the others with


async def test_searches_queued_for_a_one_at_a_time_participant_wait_in_the_client():
    """60 Searches at once, at most 8 in flight, served one at a time: the median Search waited for a slot at
    least 10 services (it cannot be sent before 22 others were served); the wait is queue_ms, not latency."""
    figures = await bench_adaptive.serial(SERVICE_MS)
    assert figures["queue_p50_services"] >= 10, figures["queue_p50_ms"]


async def test_a_fixed_limit_never_moves_and_keeps_no_baseline():
    """The adaptive limit off: 8 allowed from the first request to the last, no unloaded latency kept."""
    figures = await bench_adaptive.SCENARIOS["fixed"](SERVICE_MS)
    limit = figures["limit"]
    assert [o["status"] for o in figures["outcomes"]] == ["ok"] * 40
    assert limit["min"] == limit["max"] == limit["final"] == 8 and limit["unloaded_ms"] == {}, limit
    assert 1 <= figures["server_max_in_flight"] <= 8 and figures["queue_p50_services"] >= 2


def test_replies_sent_below_the_limit_never_raise_it():
    """The same at the limit's level, the window that mixes both: a sample's last Adds (one in flight, each
    at its unloaded 300 ms) and its first Searches at a one-at-a-time participant (one sent alone, 35 ms,
    then two in flight, 70 ms). The window's median ratio is 1 (the Adds), but only one of its four replies
    was sent with the limit filled: it stays at 2 (it went to 4, and the participant got 4 at once)."""
    from aml_ray.actors.adaptive import AdaptiveLimit

    limit = AdaptiveLimit(64, initial=2)
    seen = []
    for _ in range(30):
        limit.record("add", 300.0, alone=True, at_limit=False)
        seen.append(limit.allowed())
    limit.record("search", 35.0, alone=True, at_limit=False)
    for _ in range(40):
        limit.record("search", 35.0 * limit.allowed())  # as many in flight as allowed: at the limit
        seen.append(limit.allowed())
    assert max(seen) == 2 and min(seen) == 1, seen


def _simulate(limit, service_ms: float, capacity: int, replies: int, add_every: int = 0) -> list[int]:
    """Replies of a participant serving ``capacity`` at once: latency = service x ceil(in flight / capacity)."""
    seen = []
    for i in range(replies):
        n = limit.allowed()
        kind, service = ("add", 15 * service_ms) if add_every and i % add_every == 0 else ("search", service_ms)
        limit.record(kind, service * -(-n // capacity) * (1.0 + 0.05 * (i % 3)))
        seen.append(limit.allowed())
    return seen


def _simulate_two_samples(limit, add_ms: float = 300.0, search_ms: float = 35.0,
                          samples: tuple[tuple[int, int], ...] = ((19, 150), (30, 120))) -> dict:
    """The serial bench's shape (scripts/bench_serial.py) as events: a FIFO participant serving one request at a
    time (Add 300 ms, Search 35 ms, +0/5/10 %), two samples at once, each sample's Adds one after another,
    then all of its Searches. The client sends Adds first and sends while fewer than ``limit.allowed()`` are
    in flight; an endpoint that wants a probe (AdaptiveLimit.wants_probe) waits for nothing in flight and
    holds every other send until its reply, as ParticipantClient._sender does.

    Returns ``{"search_p50", "share_at_most_2" (of replies seen at an allowed limit <= 2), "wall_ms"}``."""
    import heapq

    adds_left = [a for a, _ in samples]
    add_queue, search_queue = list(range(len(samples))), []
    at_server: list[dict] = []  # FIFO, the head in service
    events: list = []  # (reply time, sequence, request)
    now, in_flight, sends, sequence, probing = 0.0, 0, 0, 0, False
    search_ms_seen, allowed_seen = [], []

    def serve_head():
        nonlocal sequence
        sequence += 1
        head = at_server[0]
        service = (add_ms if head["kind"] == "add" else search_ms) * (1.0 + 0.05 * (sequence % 3))
        heapq.heappush(events, (now + service, sequence, head))

    while True:
        while in_flight < limit.allowed() and (add_queue or search_queue) and not probing:
            kind = "add" if add_queue else "search"
            if limit.wants_probe(kind):
                if in_flight:
                    break
                probing = True
            sample = (add_queue if kind == "add" else search_queue).pop(0)
            sends += 1
            at_server.append({"kind": kind, "sample": sample, "sent": now, "alone": in_flight == 0, "n": sends})
            in_flight += 1
            if len(at_server) == 1:
                serve_head()
        if not events:
            return {"search_p50": statistics.median(search_ms_seen), "wall_ms": now,
                    "share_at_most_2": sum(a <= 2 for a in allowed_seen) / len(allowed_seen)}
        now, _, done = heapq.heappop(events)
        at_server.pop(0)
        if at_server:
            serve_head()
        in_flight, probing = in_flight - 1, False
        limit.record(done["kind"], now - done["sent"], alone=done["alone"] and sends == done["n"])
        allowed_seen.append(limit.allowed())
        if done["kind"] == "search":
            search_ms_seen.append(now - done["sent"])
        elif adds_left[done["sample"]] > 1:
            adds_left[done["sample"]] -= 1
            add_queue.append(done["sample"])
        else:
            search_queue.extend([done["sample"]] * samples[done["sample"]][1])


@pytest.mark.parametrize("declared", [8, 64])
def test_searches_that_only_ever_ran_beside_adds_are_compared_with_a_lone_one(declared):
    """Found by the serial bench (docs/benchmarks.md): sample A's Searches started while sample B's Adds were
    in flight at a limit of 2, so no Search ever ran alone and their baseline (the 10th percentile of their
    own latencies) was already a queued latency: the limit grew to 8 (16 of 64) and a 35 ms Search was
    reported at 294 ms (513 ms). A probe gives each endpoint one lone latency to check the baseline with."""
    from aml_ray.actors.adaptive import AdaptiveLimit

    run = _simulate_two_samples(AdaptiveLimit(declared))
    assert run["share_at_most_2"] >= 0.9, run
    assert run["search_p50"] <= 2.2 * 35.0, run
    assert run["wall_ms"] <= 1.01 * (49 * 300.0 + 270 * 35.0) * 1.05, run  # the server never waited


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


def test_the_unloaded_latency_of_each_endpoint_is_its_baseline_not_its_queued_time():
    """At a one-at-a-time participant (35 ms a Search, 525 ms an Add) the replies' time there is queued time at
    two in flight; :meth:`AdaptiveLimit.unloaded_ms` gives each endpoint's service time, what run.json reports
    beside the latencies (``participant_concurrency.unloaded_ms``). A fixed limit keeps none."""
    from aml_ray.actors.adaptive import AdaptiveLimit

    limit = AdaptiveLimit(64)
    seen = _simulate(limit, 35.0, 1, 600, add_every=7)
    unloaded = limit.unloaded_ms()
    assert max(seen[-100:]) == 2 and unloaded.keys() == {"search", "add"}
    assert unloaded["search"] == pytest.approx(35.0, rel=0.1) and unloaded["add"] == pytest.approx(525.0, rel=0.1)
    fixed = AdaptiveLimit(8, enabled=False)
    _simulate(fixed, 35.0, 1, 50)
    assert fixed.unloaded_ms() == {}


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


def test_a_seeded_endpoint_needs_no_probe_of_its_own_and_counts_no_reply():
    """The pre-flight's lone latencies seed the limit (AdaptiveLimit.seed): each seeded endpoint is past its
    probe, the limit is where it was, and the seed is no reply of the limit's (no window, no decision)."""
    from aml_ray.actors.adaptive import AdaptiveLimit

    limit = AdaptiveLimit(8, initial=2)
    limit.seed("add", 300.0)
    assert not limit.wants_probe("add") and limit.wants_probe("search")
    assert limit.describe() | {"trajectory": None} == {
        "adaptive": True, "declared": 8, "min": 2, "max": 2, "final": 2, "decisions": 0, "replies": 0,
        "trajectory": None}
    # the seed is the endpoint's unloaded latency: four replies at twice it read as queueing, and the limit falls
    for _ in range(4):
        limit.record("add", 600.0)
    assert limit.allowed() == 1 and limit.describe()["decisions"] == 1


async def test_a_client_seeded_with_the_preflights_latencies_starts_at_two_in_flight():
    """The head start's client (aml_ray.run.head_start) gets the pre-flight probe's lone latencies: its first two
    Adds go at once, so a stall of the driver (the Ray start's imports hold the interpreter for tens of
    milliseconds) finds the next Add already at the participant. Unseeded, the first Add goes alone (the
    endpoint's probe) and the limit starts at 1: one Add at a time at the server."""
    def adds(client: ParticipantClient):
        return [client.add(AddRequest(user_id=f"u{i}", session_id="s1", request_id=f"u{i}:chunk-0",
                                      messages=[Message(role="user", content=f"hello {i}")])) for i in range(2)]

    peaks = {}
    with ServerProcess("participant", "--latency-ms", "5", "--add-latency-ms", "150", "--capacity", "64") as server:
        for seeded in ("no", "made with them", "after open"):
            server.reset()
            spec = spec_for(server, 64)
            client = ParticipantClient(spec, lone_latencies={spec.add_url: 150.0} if seeded == "made with them" else None)
            if seeded == "after open":  # the head start's: its senders run, parked at the limit of 1, when seeded
                client.open()
                await asyncio.sleep(0.05)
                client.seed({spec.add_url: 150.0})
            try:
                outs = await asyncio.gather(*adds(client))
            finally:
                await client.aclose()
            assert [o["status"] for o in outs] == ["ok", "ok"]
            peaks[seeded] = server.stats()["max_in_flight"]
    assert peaks == {"no": 1, "made with them": 2, "after open": 2}


async def test_slots_held_back_for_another_clients_requests_keep_the_declared_limit_across_both():
    """At the head start's handover (aml_ray.run.pipeline._hand_over) the client actor holds back a slot for each
    Add the head start still has out: with 1 of a declared 2 held back, three Adds go one at a time; once it
    is given back, two at once. ``hold_back``'s limit starts a fresh limit at the other client's (2 here),
    and its lone latencies spare the endpoint a probe of its own."""
    def adds(client: ParticipantClient, tag: str):
        return [client.add(AddRequest(user_id=f"{tag}{i}", session_id="s1", request_id=f"{tag}{i}:chunk-0",
                                      messages=[Message(role="user", content=f"hello {i}")])) for i in range(3)]

    with ServerProcess("participant", "--latency-ms", "5", "--add-latency-ms", "100", "--capacity", "64") as server:
        spec = spec_for(server, 2)
        client = ParticipantClient(spec)
        try:
            client.hold_back(1, {spec.add_url: 100.0}, 2)
            assert client.concurrency()["final"] == 2 and not client.limit.wants_probe(client._target(spec.add_url))
            server.reset()
            assert [o["status"] for o in await asyncio.gather(*adds(client, "a"))] == ["ok"] * 3
            held_peak = server.stats()["max_in_flight"]
            client.give_back(1)
            server.reset()
            assert [o["status"] for o in await asyncio.gather(*adds(client, "b"))] == ["ok"] * 3
            free_peak = server.stats()["max_in_flight"]
        finally:
            await client.aclose()
    assert (held_peak, free_peak) == (1, 2)
