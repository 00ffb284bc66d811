"""The benchmark's loopback participant: its counters, and the hold overrun it reports (scripts/loopback_servers.py)."""

from __future__ import annotations

import json
import urllib.request

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
    assert 0.0 <= late["p50"] <= late["p95"] < 1000.0  # an idle loopback server resumes within a second
    assert "add" not in stats["late_ms"]
