"""Loopback HTTP servers for tests: real uvicorn in a background thread, on a free port."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

#: Seconds a server may take to start before the test fails: a guard, generous for a loaded machine.
START_GUARD_S = 60


class ThreadServer:
    """A real uvicorn server for an ASGI app on a free loopback port, in a background thread.

    Use as a context manager; ``base_url`` is ``http://127.0.0.1:<port>``.
    """

    def __init__(self, app) -> None:
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "ThreadServer":
        self.thread.start()
        deadline = time.monotonic() + START_GUARD_S
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError(f"loopback test server did not start in {START_GUARD_S} s")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
