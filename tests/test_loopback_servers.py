"""The benchmark's loopback participant: its counters, and the hold overrun it reports (scripts/loopback_servers.py)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from scripts.loopback_servers import Counters, ServerProcess


def test_counters_report_the_hold_overrun_per_kind():
    counters = Counters()
    for held_ms in (20.0, 21.0, 22.0, 23.0, 30.0):
        counters.held("search", held_ms / 1000, 0.020)
    counters.held("add", 0.019, 0.020)  # woken early (clock granularity): no overrun, never negative
    late = counters.lateness()
    assert abs(late["search"]["p50"] - 2.0) < 1e-9  # the middle of 0, 1, 2, 3, 10
    assert abs(late["search"]["mean"] - 3.2) < 1e-9  # (0 + 1 + 2 + 3 + 10) / 5
    assert abs(late["search"]["p95"] - 3.0) < 1e-9  # index int(0.95 * 4) = 3 of the sorted overruns
    assert late["add"] == {"mean": 0.0, "p50": 0.0, "p95": 0.0}
    counters.reset()
    assert counters.lateness() == {}


def test_counters_account_the_idle_gaps_between_services(monkeypatch):
    """Idle time is counted only while nothing is held: overlapping services leave no gap, and each gap names
    the request that ended it (the wall-time parts of scripts/bench_serial.py)."""
    clock = iter([1.0, 1.3, 1.5, 1.6, 1.9, 2.0, 2.2])
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    counters = Counters()
    counters.arrive("add")  # 1.0 (arrival time)
    counters.serve_start("add")  # 1.3: the first service, no gap before it
    counters.serve_end()  # 1.5
    counters.arrive("search")  # 1.6
    counters.serve_start("search")  # 1.9: a gap of 0.4 s before search 1
    counters.serve_start("search")  # 2.0: another held at once, no gap
    counters.serve_end()  # (no clock read: one is still held)
    counters.serve_end()  # 2.2
    snap = counters.snapshot()
    assert snap["served_first"] == 1.3 and snap["served_last"] == 2.2
    assert abs(snap["idle_s"] - 0.4) < 1e-9
    assert [(round(a, 6), round(g, 6), kind, n) for a, g, kind, n in snap["gaps"]] == [(1.5, 0.4, "search", 1)]


def test_participant_server_reports_lateness_of_served_searches():
    with ServerProcess("participant", "--latency-ms", "5") as server:
        body = json.dumps({"query": "q", "user_id": "u", "top_k": 3}).encode()
        for _ in range(4):
            req = urllib.request.Request(f"{server.base_url}/search", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert len(json.loads(resp.read())["data"]) == 3
        stats = server.stats()
    assert stats["n"]["search"] == 4
    late = stats["late_ms"]["search"]
    assert 0.0 <= late["p50"] <= late["p95"] < 10_000.0  # a guard: the overrun is the server's lag, never the hold
    assert "add" not in stats["late_ms"]


def _post(base_url: str, path: str, payload: dict | bytes) -> tuple[int, dict]:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    req = urllib.request.Request(f"{base_url}/{path}", data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize("http", ["lean", "aiohttp"])
def test_participant_servers_give_the_same_replies(http):
    add = {"request_id": "r1", "user_id": "eval:u1", "session_id": "s1", "messages": []}
    with ServerProcess("participant", "--latency-ms", "1", "--memories", "4", "--http", http) as server:
        assert _post(server.base_url, "add", add) == (200, {"success": True, "request_id": "r1", "user_id": "eval:u1",
                                                            "session_id": "s1"})
        status, reply = _post(server.base_url, "search", {"query": "q", "user_id": "eval:u1", "top_k": 3})
        stats = server.stats()
    assert status == 200
    assert [m["id"] for m in reply["data"]] == ["eval:u1:chunk-0#0", "eval:u1:chunk-1#0", "eval:u1:chunk-2#0"]
    assert [m["score"] for m in reply["data"]] == [1.0, 0.5, 1.0 / 3]
    assert stats["n"] == {"add": 1, "search": 1}
    assert stats["over_capacity"] == 0


def test_lean_participant_refuses_unknown_routes_and_bad_bodies_and_keeps_serving():
    with ServerProcess("participant", "--latency-ms", "1") as server:
        assert _post(server.base_url, "nowhere", {})[0] == 404
        assert _post(server.base_url, "search", b"{not json")[0] == 400
        assert _post(server.base_url, "search", {"query": "q"}) == (400, {"error": "field 'user_id' is missing"})
        assert _post(server.base_url, "add", {"request_id": "r", "user_id": "u"}) == (
            400, {"error": "field 'session_id' is missing"})
        assert _post(server.base_url, "search", [1, 2])[0] == 400  # JSON, but not an object
        status, reply = _post(server.base_url, "search", {"query": "q", "user_id": "u", "top_k": 2})
        stats = server.stats()
    assert status == 200 and len(reply["data"]) == 2
    assert stats["n"] == {"search": 1}  # the refused requests were never counted as served
    assert stats["max_in_flight"] == 1


def test_lean_participant_queues_requests_over_its_capacity_in_arrival_order():
    """Capacity 2, 100 ms each, 4 Searches at once: two are held at once, the other two wait for a free place."""
    body = json.dumps({"query": "q", "user_id": "u", "top_k": 1}).encode()
    with ServerProcess("participant", "--latency-ms", "100", "--capacity", "2") as server:
        def one(_):
            t0 = time.monotonic()
            assert _post(server.base_url, "search", body)[0] == 200
            return time.monotonic() - t0

        with ThreadPoolExecutor(4) as pool:
            waits = sorted(pool.map(one, range(4)))
        stats = server.stats()
    assert stats["n"]["search"] == 4
    assert stats["max_in_flight"] == 4  # arrived and not yet answered, held or queued
    assert stats["over_capacity"] == 2  # the 3rd and 4th arrived with 2 already held
    assert waits[-1] >= 0.19  # the last one waited a whole hold before its own (0.1998 s seen: clock granularity)
    assert stats["late_ms"]["search"]["p50"] >= 0.0  # how little: the fake clock's test below (no wall-clock bound)


def test_lean_participant_starts_a_queued_hold_when_it_gets_a_place(monkeypatch):
    """Capacity 2, four Searches at once, on a fake clock whose holds end on time: the two that waited for a
    place report no lag, so the wait in the queue is never counted as the server's lag (it would be 100 ms)."""
    import scripts.loopback_servers as loopback

    now, timers = [100.0], []

    class Loop:
        def call_later(self, delay, callback, *args):
            timers.append((now[0] + delay, callback, args))

    class Connection:
        def __init__(self) -> None:
            self.replies: list[int] = []

        def reply(self, status: int, payload: dict) -> None:
            self.replies.append(status)

    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    monkeypatch.setattr(loopback.asyncio, "get_running_loop", Loop)
    server = loopback.LeanParticipant(0.1, 0.1, capacity=2, memories=1)
    connections = [Connection() for _ in range(4)]
    for connection in connections:
        server.request(connection, b"POST", "/search", json.dumps({"query": "q", "user_id": "u", "top_k": 1}).encode())
    assert len(timers) == 2 and len(server.waiting) == 2
    ends = []
    while timers:
        timers.sort(key=lambda timer: timer[0])
        now[0], callback, args = timers.pop(0)  # each hold ends on time
        ends.append(round(now[0] - 100.0, 6))
        callback(*args)
    assert ends == [0.1, 0.1, 0.2, 0.2] and [c.replies for c in connections] == [[200]] * 4
    stats = server.counters.snapshot()
    assert stats["over_capacity"] == 2 and stats["n"] == {"search": 4}
    assert stats["late_ms"]["search"] == pytest.approx({"mean": 0.0, "p50": 0.0, "p95": 0.0}, abs=1e-6)


@pytest.mark.parametrize("kind", ["aiohttp", "uvloop", "httpx"])
def test_bench_plain_loop_reports_its_figures(kind):
    # the bench's baseline (scripts/bench_pipeline.py): the plain loop, run as a child process
    from scripts.bench_pipeline import measure_plain

    # 1,000 Searches: the server's CPU is read from /proc in clock ticks (10 ms); 200 of them (about 20 ms
    # of its CPU) once read as 0 ticks
    with ServerProcess("participant", "--latency-ms", "5", "--capacity", "8") as server:
        res = measure_plain(server, kind, 1000, 8)
        stats = server.stats()
    assert stats["n"]["search"] == 1000 and stats["max_in_flight"] == 8 and stats["over_capacity"] == 0
    # 1,000 Searches held 5 ms each, 8 at a time: 125 rounds (a hold may end up to 1 ms early: the lean
    # server's timers run on uvloop's millisecond clock)
    assert res["wall_s"] >= 125 * 0.004 and res["client_rate"] == pytest.approx(1000 / res["wall_s"])
    assert 0 < res["rate"] <= 8 / 0.004
    assert 0 < res["client_cpu_s"] < res["wall_s"] * 4  # the child's own CPU, its start-up not counted
    assert res["server_cpu_s"] > 0
    assert 0 <= res["steal"] < 1  # the host's share of the machine's CPU time during the loop (/proc/stat)


@pytest.mark.parametrize("extra", [[], ["--instant"]])
def test_bench_client_reports_its_figures(extra, capsys):
    # scripts/bench_client.py: the participant client against a plain loop, in-process, no Ray
    from scripts.bench_client import main

    main(["--queries", "200", "--samples", "4", "--concurrency", "8", "--latency-ms", "5", "--rounds", "1", *extra])
    lines = capsys.readouterr().out.strip().splitlines()
    kinds = [line.split()[2] for line in lines]
    assert kinds == (["client"] if extra == ["--instant"] else ["plain", "client"])
    for line in lines:
        rate = float(line.split()[3].replace(",", ""))
        cpu = float(line.split("CPU")[1].split("us")[0])
        assert rate > 0 and 0 < cpu < 100_000
        if extra != ["--instant"]:
            assert rate <= 8 / 0.004  # 8 in flight, each held about 5 ms
