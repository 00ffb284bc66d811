"""Loopback servers for benchmarks: an AML participant and an OpenAI-compatible chat-completions model.

Each server runs in its OWN process (``python scripts/loopback_servers.py participant ...``), so it never
shares a GIL with the client being measured. It binds 127.0.0.1 on a free port and prints one line
``PORT <n>`` on stdout when it is ready; :class:`ServerProcess` starts one and reads that line.

Participant (``participant``):
    POST /add     sleeps ``--latency-ms`` (``--add-latency-ms``), echoes the ids (contract-valid 200).
    POST /search  sleeps ``--latency-ms``, returns ``--memories`` items whose ids start with the user_id.
    GET  /stats   counters: adds, searches, first/last arrival times (``time.monotonic`` of the server),
                  the highest number of requests in flight seen, and requests over the capacity.
    POST /reset   zeroes the counters.
    ``--capacity N``: at most N requests are served at once; more wait in a queue (their latency grows)
    and are counted as ``over_capacity`` (a client that holds its declared limit never causes one).
    ``--http lean`` (default): asyncio protocols with httptools (:class:`LeanParticipant`, about 120-145 us
    of CPU per request); ``--http aiohttp``: aiohttp's web server (about 2.5 x that), the earlier server.

Model (``model``):
    POST /v1/chat/completions  sleeps ``--latency-ms``; a prompt that asks for a ``"label"`` (the judge)
                               gets ``{"label": "CORRECT"}``, any other prompt a short answer.
    GET /stats, POST /reset    as above (kinds ``answer`` and ``judge``, first/last arrival), plus
                               ``max_in_flight_by_kind``; with ``--tag-regex R`` also ``calls``: one
                               ``[arrival, done, kind, tag]`` per call in arrival order (``time.monotonic``
                               of the server; ``tag`` = R's first group in the prompt, or ``""``), so a
                               drill can tell which job each call came from.
    POST /hold, POST /go       hold every call (in flight, unanswered) until ``/go``: a drill lets queues
                               build up behind the endpoint's in-flight limit, then lets them drain.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any


class Counters:
    """Arrival counters of one server (first/last arrival give the steady-state rate N/(last-first))."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.n: dict[str, int] = {}
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.in_flight = 0
        self.max_in_flight = 0
        self.over_capacity = 0
        self.timeline: dict[str, dict[int, int]] = {}  # kind -> {100 ms bucket since first arrival: count}
        self.in_flight_by_kind: dict[str, int] = {}
        self.max_in_flight_by_kind: dict[str, int] = {}
        self.calls: list[list] = []  # [arrival, done, kind, tag] (model server with --tag-regex)
        self.arrivals: dict[str, list[float]] = {}  # kind -> arrival times (time.monotonic), in order
        self.late: dict[str, list[float]] = {}  # kind -> per request, ms its hold overran the set latency
        self.serving = 0  # requests being held now (service started, not yet answered)
        self.served_first: float | None = None  # the first service start (time.monotonic)
        self.served_last: float | None = None  # the last service end
        self.idle_s = 0.0  # time with nothing held between the first service start and the last end
        self.gaps: list[tuple] = []  # (start, seconds, the next request's kind, its number) of each idle gap, in order

    def arrive(self, kind: str) -> None:
        now = time.monotonic()
        self.n[kind] = self.n.get(kind, 0) + 1
        first = self.first.setdefault(kind, now)
        self.last[kind] = now
        self.arrivals.setdefault(kind, []).append(now)
        bucket = int((now - first) * 10)
        line = self.timeline.setdefault(kind, {})
        line[bucket] = line.get(bucket, 0) + 1

    def enter(self, kind: str, capacity: int) -> None:
        """One request of ``kind`` starts being served (in-flight peaks, total and per kind)."""
        self.in_flight += 1
        if self.in_flight > capacity:
            self.over_capacity += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        n = self.in_flight_by_kind[kind] = self.in_flight_by_kind.get(kind, 0) + 1
        self.max_in_flight_by_kind[kind] = max(self.max_in_flight_by_kind.get(kind, 0), n)

    def leave(self, kind: str) -> None:
        self.in_flight -= 1
        self.in_flight_by_kind[kind] -= 1

    def held(self, kind: str, held_s: float, delay_s: float) -> None:
        """A request of ``kind`` was held ``held_s`` against a set ``delay_s``: the overrun is this server's own lag.

        The overrun is the time the server's event loop took to resume the request after its sleep (the
        process waiting for a CPU, or the loop busy with other requests), so a benchmark can tell a
        latency the server added from one the client added.
        """
        self.late.setdefault(kind, []).append(max(0.0, held_s - delay_s) * 1000)

    def serve_start(self, kind: str) -> None:
        """A ``kind`` request's service starts (its hold begins): ends an idle gap when nothing else was held."""
        now = time.monotonic()
        if self.serving == 0:
            if self.served_last is not None:
                self.idle_s += now - self.served_last
                self.gaps.append((self.served_last, now - self.served_last, kind, self.n.get(kind, 0)))
            if self.served_first is None:
                self.served_first = now
        self.serving += 1

    def serve_end(self) -> None:
        """A request's service ends (its reply goes out): starts an idle gap when nothing else is held."""
        self.serving -= 1
        if self.serving == 0:
            self.served_last = time.monotonic()

    def lateness(self) -> dict[str, dict[str, float]]:
        """Per kind, the hold overrun in ms: mean, p50 and p95 (:meth:`held`)."""
        out = {}
        for kind, values in self.late.items():
            ordered = sorted(values)
            out[kind] = {"mean": sum(ordered) / len(ordered), "p50": ordered[len(ordered) // 2],
                         "p95": ordered[int(0.95 * (len(ordered) - 1))]}
        return out

    def steady(self, trim: float = 0.1) -> dict[str, float]:
        """Per kind, the arrival rate over the middle ``1 - 2 * trim`` of the arrivals (req/s).

        Leaving out the first and last 10% of arrivals measures the steady state without the ramp-up
        (a pipeline's actors starting, a loop's first connections) and the drain (the last stragglers).
        """
        out = {}
        for kind, times in self.arrivals.items():
            lo, hi = int(trim * len(times)), int((1 - trim) * len(times)) - 1
            if hi - lo >= 10 and times[hi] > times[lo]:
                out[kind] = (hi - lo) / (times[hi] - times[lo])
        return out

    def snapshot(self) -> dict[str, Any]:
        return {"steady": self.steady(), "n": self.n, "first": self.first, "last": self.last, "max_in_flight": self.max_in_flight,
                "over_capacity": self.over_capacity, "pid": os.getpid(), "timeline": self.timeline,
                "max_in_flight_by_kind": self.max_in_flight_by_kind, "calls": self.calls,
                "late_ms": self.lateness(),
                "late_total_s": sum(sum(v) for v in self.late.values()) / 1000,
                # service span and its idle gaps: span = busy + idle (a one-at-a-time server's waiting for work)
                "served_first": self.served_first, "served_last": self.served_last, "idle_s": self.idle_s,
                "gaps": self.gaps,
                # the first two arrivals of each kind: a run's pre-flight probe, then its first request
                "first_two": {kind: times[:2] for kind, times in self.arrivals.items()}}


_FILLER = "x" * 80


def add_reply(body: dict[str, Any]) -> dict[str, Any]:
    """The participant's Add reply: the request's ids echoed (a contract-valid 200 body)."""
    return {"success": True, "request_id": body["request_id"], "user_id": body["user_id"],
            "session_id": body["session_id"]}


def search_reply(body: dict[str, Any], memories: int) -> dict[str, Any]:
    """The participant's Search reply: ``min(memories, top_k)`` items whose ids start with the user_id."""
    uid = body["user_id"]
    n = min(memories, int(body.get("top_k", memories)))
    return {"data": [{"id": f"{uid}:chunk-{i}#0", "content": f"memory {i} for the query: {_FILLER}",
                      "score": 1.0 / (i + 1)} for i in range(n)]}


def participant_app(latency_s: float, add_latency_s: float, capacity: int, memories: int):
    """The participant as an aiohttp application (``--http aiohttp``; the benchmark's server up to stop 18).

    Same routes, replies and counters as :class:`LeanParticipant`, at about 2.5 x its CPU per request.
    """
    from aiohttp import web

    counters = Counters()
    gate = asyncio.Semaphore(capacity)

    async def serve(kind: str, delay: float, request) -> bytes:
        raw = await request.read()
        counters.arrive(kind)
        counters.enter(kind, capacity)
        try:
            async with gate:
                counters.serve_start(kind)
                t0 = time.monotonic()
                await asyncio.sleep(delay)
                counters.held(kind, time.monotonic() - t0, delay)
                counters.serve_end()
        finally:
            counters.leave(kind)
        return raw

    async def add(request):
        return web.json_response(add_reply(json.loads(await serve("add", add_latency_s, request))))

    async def search(request):
        return web.json_response(search_reply(json.loads(await serve("search", latency_s, request)), memories))

    async def stats(_request):
        return web.json_response(counters.snapshot())

    async def reset(_request):
        counters.reset()
        return web.json_response({"ok": True})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.add_routes([web.post("/add", add), web.post("/search", search), web.get("/stats", stats),
                    web.post("/reset", reset)])
    return app


class LeanParticipant:
    """The participant served straight from asyncio protocols, with httptools parsing HTTP/1.1 (the default).

    Why not aiohttp's web server: this server stands in for a participant that, in a real evaluation,
    runs on its own machines, but here it shares the client's 2 cores, so every microsecond it spends
    is taken from the client being measured. Measured with ``scripts/bench_pipeline.py``'s plain
    aiohttp loop (10,000 Searches, 20 ms, 64 in flight, this 2-core machine): aiohttp's web server
    used 275-301 us of CPU per Search, this one 119 us. Routes, replies, counters and the capacity
    queue are the aiohttp application's (:func:`participant_app`, ``--http aiohttp``).

    A request is held with ``loop.call_later`` (no task per request). At most ``capacity`` are held at
    once; later ones wait in arrival order (their latency grows). Requests on one connection are
    answered in order, one at a time (HTTP/1.1 without pipelining, as aiohttp and httpx send them).

    Args:
        latency_s / add_latency_s: how long a Search / an Add is held, seconds.
        capacity: requests held at once.
        memories: items per Search reply (at most the request's top_k).
    """

    def __init__(self, latency_s: float, add_latency_s: float, capacity: int, memories: int):
        self.counters = Counters()
        self.delays = {"search": latency_s, "add": add_latency_s}
        self.capacity, self.memories = capacity, memories
        self.active = 0
        self.waiting: deque[tuple[_Connection, str, dict[str, Any]]] = deque()  # (connection, kind, its reply)

    def protocol(self) -> asyncio.Protocol:
        return _Connection(self)

    def request(self, conn: "_Connection", method: bytes, path: str, raw: bytes) -> None:
        """Route one request; a held one is answered later by :meth:`_release`."""
        kind = path.lstrip("/")
        if method == b"GET" and kind == "stats":
            return conn.reply(200, self.counters.snapshot())
        if method == b"POST" and kind == "reset":
            self.counters.reset()
            return conn.reply(200, {"ok": True})
        if method != b"POST" or kind not in self.delays:
            return conn.reply(404, {"error": f"no route {method.decode()} {path}"})
        try:
            body = json.loads(raw)
        except ValueError:
            return conn.reply(400, {"error": "body is not JSON"})
        try:  # the reply is built at arrival: a body it cannot use is refused now, never held or counted
            reply = add_reply(body) if kind == "add" else search_reply(body, self.memories)
        except KeyError as exc:
            return conn.reply(400, {"error": f"field {exc.args[0]!r} is missing"})
        except (TypeError, ValueError) as exc:
            return conn.reply(400, {"error": f"malformed {kind} body: {exc}"})
        self.counters.arrive(kind)
        self.counters.enter(kind, self.capacity)
        if self.active < self.capacity:
            self._hold(conn, kind, reply)
        else:
            self.waiting.append((conn, kind, reply))

    def _hold(self, conn: "_Connection", kind: str, reply: dict[str, Any]) -> None:
        self.active += 1
        self.counters.serve_start(kind)
        delay = self.delays[kind]
        asyncio.get_running_loop().call_later(delay, self._release, conn, kind, reply, time.monotonic(), delay)

    def _release(self, conn: "_Connection", kind: str, reply: dict[str, Any], t0: float, delay: float) -> None:
        self.counters.held(kind, time.monotonic() - t0, delay)
        self.counters.leave(kind)
        self.active -= 1
        self.counters.serve_end()
        conn.reply(200, reply)
        if self.waiting:
            self._hold(*self.waiting.popleft())


class _Connection(asyncio.Protocol):
    """One client connection of :class:`LeanParticipant`: requests parsed by httptools, answered in order."""

    def __init__(self, server: LeanParticipant):
        import httptools

        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url, self.body = b"", []
        self.pending: deque[tuple[bytes, str, bytes, bool]] = deque()  # requests parsed, not yet routed
        self.busy = False  # a request of this connection is being served

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        import httptools

        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._write(400, b'{"error": "malformed HTTP request"}', keep_alive=False)

    def on_url(self, url: bytes) -> None:  # httptools callback; may come in pieces
        self.url += url

    def on_body(self, body: bytes) -> None:  # httptools callback
        self.body.append(body)

    def on_message_complete(self) -> None:  # httptools callback
        request = (self.parser.get_method(), self.url.decode(), b"".join(self.body), self.parser.should_keep_alive())
        self.url, self.body = b"", []
        self.pending.append(request)
        self._next()

    def _next(self) -> None:
        if self.busy or not self.pending:
            return
        method, path, raw, self.keep_alive = self.pending.popleft()
        self.busy = True
        self.server.request(self, method, path, raw)

    def reply(self, status: int, payload: dict[str, Any]) -> None:
        """Answer the request being served with ``payload`` as JSON, then route the next one."""
        self._write(status, json.dumps(payload).encode(), self.keep_alive)
        self.busy = False
        self._next()

    def _write(self, status: int, data: bytes, keep_alive: bool) -> None:
        if self.transport is None:  # the client went away while its request was held
            return
        reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found"}[status]
        connection = b"keep-alive" if keep_alive else b"close"
        self.transport.write(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                             b"Connection: %s\r\n\r\n%s" % (status, reason, len(data), connection, data))
        if not keep_alive:
            self.transport.close()
            self.transport = None


def model_app(latency_s: float, capacity: int, tag_regex: str | None = None):
    import re

    from aiohttp import web

    counters = Counters()
    gate = asyncio.Semaphore(capacity)
    tag_re = re.compile(tag_regex) if tag_regex else None
    open_ = asyncio.Event()  # cleared by /hold, set by /go
    open_.set()

    async def complete(request):
        body = await request.json()
        prompt = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        judge = '"label"' in prompt
        kind = "judge" if judge else "answer"
        counters.arrive(kind)
        call = None
        if tag_re is not None:
            found = tag_re.search(prompt)
            call = [time.monotonic(), None, kind, found.group(1) if found else ""]
            counters.calls.append(call)
        counters.enter(kind, capacity)
        try:
            await open_.wait()
            async with gate:
                await asyncio.sleep(latency_s)
        finally:
            counters.leave(kind)
            if call is not None:
                call[1] = time.monotonic()
        text = 'Same thing as the gold answer.\n{"label": "CORRECT"}' if judge else "loopback answer"
        return web.json_response({
            "id": "chatcmpl-loopback", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "loopback"),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": 4,
                      "total_tokens": len(prompt) // 4 + 4},
        })

    async def stats(_request):
        return web.json_response(counters.snapshot())

    async def reset(_request):
        counters.reset()
        return web.json_response({"ok": True})

    async def hold(_request):
        open_.clear()
        return web.json_response({"held": True})

    async def go(_request):
        open_.set()
        return web.json_response({"held": False, "at": time.monotonic()})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.add_routes([web.post("/v1/chat/completions", complete), web.get("/stats", stats),
                    web.post("/reset", reset), web.post("/hold", hold), web.post("/go", go)])
    return app


async def _serve(app, port: int) -> None:
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=4096, reuse_address=True)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - the only way to read port 0's choice
    print(f"PORT {bound}", flush=True)
    await asyncio.Event().wait()


async def _serve_lean(server: LeanParticipant, port: int) -> None:
    listening = await asyncio.get_running_loop().create_server(server.protocol, "127.0.0.1", port, backlog=4096,
                                                               reuse_address=True)
    print(f"PORT {listening.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kind", choices=["participant", "model"])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--add-latency-ms", type=float, default=None, help="participant Add latency (default: --latency-ms)")
    p.add_argument("--capacity", type=int, default=100_000, help="requests served at once; more wait in a queue")
    p.add_argument("--memories", type=int, default=10, help="items per Search reply (at most top_k)")
    p.add_argument("--http", choices=["lean", "aiohttp"], default="lean",
                   help="participant: asyncio protocols with httptools (lean, the default) or aiohttp's web server")
    p.add_argument("--tag-regex", default=None,
                   help="model: log every call with this regex's first group in the prompt (GET /stats 'calls')")
    a = p.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is optional
        pass
    if a.kind == "participant":
        add_latency = a.latency_ms if a.add_latency_ms is None else a.add_latency_ms
        settings = (a.latency_ms / 1000, add_latency / 1000, a.capacity, a.memories)
        if a.http == "lean":
            asyncio.run(_serve_lean(LeanParticipant(*settings), a.port))
        else:
            asyncio.run(_serve(participant_app(*settings), a.port))
    else:
        asyncio.run(_serve(model_app(a.latency_ms / 1000, a.capacity, a.tag_regex), a.port))


class ServerProcess:
    """Start one loopback server in a subprocess; use as a context manager.

    Args:
        kind: ``"participant"`` or ``"model"``, or ``"hosted"``: the hosted-API-like model endpoint of
            ``scripts/model_endpoint.py`` (lognormal latency, RPM/TPM limits with 429s).
        *args: extra command-line flags (``"--latency-ms", "20"``...).

    Attributes:
        base_url: ``http://127.0.0.1:<port>`` once started.
    """

    def __init__(self, kind: str, *args: str):
        here = Path(__file__).resolve()
        self.cmd = ([sys.executable, str(here.with_name("model_endpoint.py")), *args] if kind == "hosted"
                    else [sys.executable, str(here), kind, *args])
        self.proc: subprocess.Popen | None = None
        self.base_url = ""

    def __enter__(self) -> "ServerProcess":
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError(f"loopback server did not start: {self.cmd!r} printed {line!r}")
        self.base_url = f"http://127.0.0.1:{int(line.split()[1])}"
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def stats(self) -> dict[str, Any]:
        import urllib.request

        with urllib.request.urlopen(f"{self.base_url}/stats", timeout=10) as resp:
            return json.loads(resp.read())

    def reset(self) -> None:
        self.post("reset")

    def post(self, path: str) -> dict[str, Any]:
        """POST ``/<path>`` (``reset``; the model server's ``hold`` and ``go``) and return the JSON reply."""
        import urllib.request

        req = urllib.request.Request(f"{self.base_url}/{path}", data=b"{}", method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def rate(self, kind: str) -> tuple[int, float | None]:
        """(arrivals, whole-run rate (N-1)/(last-first) in req/s) for ``kind`` since the last reset."""
        s = self.stats()
        n = s["n"].get(kind, 0)
        if n < 2:
            return n, None
        span = s["last"][kind] - s["first"][kind]
        return n, (n - 1) / span if span > 0 else None

    def steady_rate(self, kind: str) -> float | None:
        """The arrival rate of ``kind`` over the middle 80% of its arrivals (:meth:`Counters.steady`)."""
        return self.stats()["steady"].get(kind)


if __name__ == "__main__":
    main()
