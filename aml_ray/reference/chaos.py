"""Fault injection for the reference memory system: the chaos participant of the fault drills.

:class:`ChaosMiddleware` wraps the reference app (ASGI) and, per POST to ``/add`` or ``/search``, draws
one fault from a :class:`FaultPlan` with a seeded RNG (so a drill is repeatable). Faults:

- ``429``: HTTP 429 with ``Retry-After`` (``retry_after_s``), nothing stored.
- ``500`` / ``503``: HTTP 500 / 503, nothing stored.
- ``slow``: the reply waits ``slow_s`` (past the platform's timeout) before it is sent; an Add has
  not been applied when the client gives up (the handler runs after the wait).
- ``drop``: the connection is cut mid-response (declared Content-Length, short body), nothing stored.
- ``commit_timeout`` (Add only): the write is applied and committed, then the reply waits ``slow_s``:
  the client times out and retries the same request_id, which the store de-duplicates.
- ``malformed``: HTTP 200 with a body that is not JSON (a contract error: it stops the stage).

Spec strings (CLI ``--faults``): ``"429=0.05,503=0.05,slow=0.03,drop=0.03,commit_timeout=0.04,seed=7"``;
optional ``slow_s=`` and ``retry_after_s=``.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass, field

KINDS = ("429", "500", "503", "slow", "drop", "commit_timeout", "malformed")


@dataclass
class FaultPlan:
    """Fault rates (probability per request, summing to at most 1) and their parameters.

    Attributes:
        rates: kind -> probability, kinds from :data:`KINDS`.
        seed: RNG seed.
        slow_s: how long ``slow`` and ``commit_timeout`` replies wait, seconds.
        retry_after_s: the ``Retry-After`` value of ``429`` replies, seconds.
    """

    rates: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    slow_s: float = 3.0
    retry_after_s: float = 1.0

    def __post_init__(self) -> None:
        unknown = set(self.rates) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
        if any(r < 0 for r in self.rates.values()) or sum(self.rates.values()) > 1:
            raise ValueError(f"fault rates must be >= 0 and sum to at most 1, got {self.rates}")

    @classmethod
    def parse(cls, spec: str) -> "FaultPlan":
        """Parse ``"429=0.05,drop=0.02,seed=3,slow_s=2"``.

        Raises:
            ValueError: a malformed item, naming it.
        """
        plan: dict[str, float] = {}
        extra: dict[str, float] = {}
        for item in filter(None, (p.strip() for p in spec.split(","))):
            key, sep, value = item.partition("=")
            try:
                number = float(value)
            except ValueError:
                raise ValueError(f"fault spec item {item!r} must be KIND=NUMBER") from None
            if not sep:
                raise ValueError(f"fault spec item {item!r} must be KIND=NUMBER")
            (extra if key in ("seed", "slow_s", "retry_after_s") else plan)[key] = number
        return cls(rates=plan, seed=int(extra.get("seed", 0)), slow_s=extra.get("slow_s", 3.0),
                   retry_after_s=extra.get("retry_after_s", 1.0))


class ChaosMiddleware:
    """ASGI middleware injecting the faults of a :class:`FaultPlan` into ``POST /add`` and ``/search``.

    ``injected`` counts the faults drawn, by kind (served at ``GET /stats`` by the reference app).
    """

    def __init__(self, app, plan: FaultPlan):
        self.app = app
        self.plan = plan
        self.rng = random.Random(plan.seed)
        self.injected: Counter[str] = Counter()

    def _draw(self, path: str) -> str | None:
        x = self.rng.random()
        for kind in KINDS:
            rate = self.plan.rates.get(kind, 0.0)
            if kind == "commit_timeout" and path != "/add":
                continue
            if x < rate:
                return kind
            x -= rate
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in ("/add", "/search"):
            return await self.app(scope, receive, send)
        kind = self._draw(scope["path"])
        if kind is None:
            return await self.app(scope, receive, send)
        self.injected[kind] += 1
        if kind in ("429", "500", "503"):
            headers = [(b"content-type", b"application/json")]
            if kind == "429":
                headers.append((b"retry-after", str(self.plan.retry_after_s).encode()))
            body = b'{"detail":{"reason":"injected fault"}}'
            await send({"type": "http.response.start", "status": int(kind), "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return None
        if kind == "drop":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", b"512")]})
            await send({"type": "http.response.body", "body": b'{"success": tr', "more_body": False})
            return None
        if kind == "malformed":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b"{not json"})
            return None
        if kind == "slow":
            await asyncio.sleep(self.plan.slow_s)
            return await self.app(scope, receive, send)

        # commit_timeout: apply the write now, hold the reply past the client's timeout
        async def late_send(message):
            if message["type"] == "http.response.start":
                await asyncio.sleep(self.plan.slow_s)
            await send(message)

        return await self.app(scope, receive, late_send)
