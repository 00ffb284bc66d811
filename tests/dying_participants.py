"""Loopback participants that fail part-way: one that dies after N Adds, one that always fails one Add.

Both follow the AML contract otherwise (echo byte for byte, ``success: true``; Search returns the user's
own messages that share a word with the query). The pre-flight probe's Adds (user_id ending
``:preflight``) are not counted.
"""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.retry import RetryPolicy
from tests.servers import ThreadServer

_WORD = re.compile(r"\w+")
#: Quick retries for tests: 2 attempts, waits of at most 20 ms.
FAST_RETRY = RetryPolicy(max_attempts=2, backoff_base_s=0.005, backoff_max_s=0.02, retry_after_cap_s=0.05)


class FailingParticipant:
    """A contract-following participant on a free loopback port that fails as told.

    Args:
        die_after_adds: after this many Adds of the run (probe excluded) answered, the next one is never
            answered and the server stops listening (its connection drops, later ones are refused, as for
            a killed process); None never.
        fail_chunk: an Add whose request_id ends with ``:chunk-<n>`` gets HTTP 503 every time.
        refuse_search_of: a Search for a user of this dataset (user_id ``eval:<run>:<dataset>:<sample>``,
            the pre-flight probe's excepted) gets HTTP 400, which stops that dataset's run after its Adds.
    """

    def __init__(self, *, die_after_adds: int | None = None, fail_chunk: int | None = None,
                 refuse_search_of: str | None = None):
        self.refuse_search_of = refuse_search_of
        self.adds = 0
        self.searches = 0
        self.memories: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.die_after_adds, self.fail_chunk = die_after_adds, fail_chunk
        self._server = ThreadServer(self._app())
        self.base_url = self._server.base_url

    def _app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        async def health() -> JSONResponse:
            return JSONResponse({"status": "ok"})

        @app.post("/add")
        async def add(request: Request) -> JSONResponse:
            body = await request.json()
            rid = body["request_id"]
            if self.fail_chunk is not None and rid.endswith(f":chunk-{self.fail_chunk}"):
                return JSONResponse({"detail": "unavailable"}, status_code=503)
            if not body["user_id"].endswith(":preflight") and self.die_after_adds is not None \
                    and self.adds >= self.die_after_adds:
                # die: stop listening at uvicorn's next tick (0.1 s) and never answer this request; its
                # connection closes with the server's loop, later ones are refused
                self._server.server.should_exit = self._server.server.force_exit = True
                await asyncio.sleep(5)
            with self._lock:
                if not body["user_id"].endswith(":preflight"):
                    self.adds += 1
                for m in body["messages"]:
                    self.memories.append({"id": f"m{len(self.memories)}", "user_id": body["user_id"],
                                          "content": m["content"]})
            return JSONResponse({"success": True, "request_id": rid, "user_id": body["user_id"],
                                 "session_id": body["session_id"]})

        @app.post("/search")
        async def search(request: Request) -> JSONResponse:
            body = await request.json()
            self.searches += 1
            if self.refuse_search_of and f":{self.refuse_search_of}:" in body["user_id"] \
                    and not body["user_id"].endswith(":preflight"):
                return JSONResponse({"detail": "search refused for this dataset"}, status_code=400)
            words = set(_WORD.findall(str(body["query"]).lower()))
            hits = [m for m in self.memories if m["user_id"] == body["user_id"]
                    and words & set(_WORD.findall(m["content"].lower()))][: body["top_k"]]
            return JSONResponse({"data": [{"id": m["id"], "content": m["content"]} for m in hits]})

        return app

    def spec(self, **kw: Any) -> ParticipantSpec:
        """A spec for this server with :data:`FAST_RETRY` (overridable)."""
        return ParticipantSpec(**{"add_url": f"{self.base_url}/add", "search_url": f"{self.base_url}/search",
                                  "health_url": f"{self.base_url}/health", "retry": FAST_RETRY, **kw})

    def __enter__(self) -> FailingParticipant:
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(*exc)
