"""A burst of unauthenticated access requests whose health URL never answers, over real HTTP (uvicorn):
the service answers the burst quickly (rate limit per address, bounded health checks) and keeps serving
its pages while the hanging checks run."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from aml_ray.serve_app.app import create_app
from tests.servers import ThreadServer
from tests.service_db import settings_on
from tests.test_service_api import ADMIN, request_body, stub_base  # noqa: F401  (stub_base is a fixture)

BURST = 48
PER_MINUTE, SLOTS = 10, 4


class Trickle:
    """A loopback HTTP server that answers a status line and then one header byte per second, never ending
    the headers: a client's per-read timeout never fires. :meth:`release` closes every connection."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.sock.settimeout(0.2)
        self.base_url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._accept, daemon=True),
                        threading.Thread(target=self._trickle, daemon=True)]
        for t in self.threads:
            t.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn = self.sock.accept()[0]
                conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                self.held.append(conn)
            except OSError:
                continue

    def _trickle(self) -> None:
        while not self.stop.wait(1.0):
            for conn in list(self.held):
                try:
                    conn.sendall(b"a")
                except OSError:
                    pass

    def release(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=5)
        for conn in self.held:
            conn.close()
        self.sock.close()


@pytest.fixture
def trickle() -> Iterator[Trickle]:
    server = Trickle()
    yield server
    if not server.stop.is_set():
        server.release()


def _until_settled(held: list, quiet_s: float = 1.0) -> None:
    """Wait until the black hole has held the same number (> 0) of connections for ``quiet_s`` seconds."""
    count, since = -1, time.monotonic()
    while count <= 0 or time.monotonic() - since < quiet_s:
        if len(held) != count:
            count, since = len(held), time.monotonic()
        time.sleep(0.05)


def test_a_burst_with_hanging_health_urls_is_bounded_and_pages_stay_served(tmp_path, trickle, stub_base):  # noqa: F811
    with settings_on("sqlite", tmp_path, ADMIN) as settings:
        settings.access_requests_per_minute, settings.max_health_checks = PER_MINUTE, SLOTS
        app = create_app(settings)
        with ThreadServer(app) as server:
            barrier = threading.Barrier(BURST + 1)

            def submit(i: int) -> httpx.Response:
                with httpx.Client(base_url=server.base_url, timeout=120) as http:
                    barrier.wait()
                    return http.post("/api/access-requests", json=request_body(
                        stub_base, system_name=f"Flood {i}", health_url=f"{trickle.base_url}/health"))

            with ThreadPoolExecutor(BURST) as pool:
                futures = [pool.submit(submit, i) for i in range(BURST)]
                barrier.wait()
                _until_settled(trickle.held)  # every health check the service let through now hangs
                with httpx.Client(base_url=server.base_url, timeout=10) as http:
                    # the hanging checks are still running: the board and its page answer anyway
                    board = http.get("/api/leaderboard/textual")
                    page = http.get("/leaderboard/textual")
                trickle.release()  # the hanging checks end (the server hangs up)
                responses = [f.result() for f in futures]
        app.state.service.engine.dispose()
    assert board.status_code == 200 and page.status_code == 200
    codes = [r.status_code for r in responses]
    assert codes.count(429) == BURST - PER_MINUTE, codes
    assert set(codes) <= {429, 503, 422}, codes
    assert codes.count(422) <= SLOTS
    limited = next(r for r in responses if r.status_code == 429)
    assert int(limited.headers["Retry-After"]) >= 1
    assert "at most 10 per minute" in limited.json()["detail"]["reason"]
    hung = [r.json()["detail"]["reason"] for r in responses if r.status_code == 422]
    assert hung and all(reason.startswith("health check failed: GET health_url gave ") for reason in hung)
