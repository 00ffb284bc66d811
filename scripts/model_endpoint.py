"""A hosted-API-like OpenAI-compatible chat-completions endpoint on loopback, for benchmarks.

What a hosted model API does to a client, in one process (``python scripts/model_endpoint.py ...``
prints ``PORT <n>`` when ready; :class:`scripts.loopback_servers.ServerProcess` reads it):

- **Latency** drawn from a lognormal distribution: ``--p50-ms`` (default 700) and ``--p99-ms`` (default
  5000) fix its median and 99th percentile (sigma = ln(p99 / p50) / 2.326), capped at ``--max-ms``.
- **Rate limits per model**, as hosted APIs keep them (OpenAI and Anthropic: per model, per
  organisation): ``--rpm`` requests and ``--tpm`` tokens per minute, each a token bucket that refills
  continuously and holds ``--window-s`` seconds of budget (60: a whole minute may go at once; 1: OpenAI's
  "enforced over shorter periods"). A request is charged :func:`aml_ray.models.rate_limits.request_tokens`
  (its prompt tokens with the per-message overhead, plus ``max_tokens``) on arrival; a request that
  does not fit gets HTTP 429 with ``Retry-After`` (seconds until it would fit, as a decimal when
  ``--time-scale`` makes it short) and ``x-ratelimit-*`` headers, and is not charged. A request dearer
  than a full bucket is admitted when the bucket is full and leaves it in debt.
- **Token estimates**: ``--charge-factor F`` charges each request ``F`` times its count (rounded up), as a
  hosted API whose own estimate of a request's tokens (OpenAI: "based on the character count") runs above
  the client's count, or whose limits other users of the same key also draw on.
- **Token counts**: ``usage.prompt_tokens`` the prompt's count (charged as above), ``usage.completion_tokens`` the reply's tokens.
- **Replies**: a prompt that asks for a ``"label"`` (a judge) gets ``{"label": "CORRECT"}``, one that
  asks for a ``"score"`` (a rubric judge) ``{"score": 1.0, ...}``, any other a short answer.
- ``--time-scale S`` runs the endpoint's clock S times as fast: latencies x S, and a "minute" of the
  limits lasts 60 x S seconds. A client holds the same limits by declaring rpm / S and tpm / S, so a
  benchmark of an hour of traffic takes S hours.

``GET /stats``: per model, calls, 429s (by limit), tokens charged, prompt and completion tokens, the
most requests and tokens admitted in any one ``--window-s`` and in any one minute (both in the endpoint's
clock), the peak in flight; ``--tag-regex R`` adds ``calls``: ``[arrival, done, kind, tag, status, tokens charged]``
per call (``time.monotonic``; ``tag`` = R's first group in the prompt). ``POST /reset`` zeroes them.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import re
import socket
import sys
import time
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request  # at module level: FastAPI resolves the handlers' annotations here
from fastapi.responses import JSONResponse

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: The 99th percentile of the standard normal distribution.
Z99 = 2.3263


@dataclass(frozen=True)
class LatencyModel:
    """Lognormal service times: median ``p50_s``, 99th percentile ``p99_s``, at most ``max_s`` (seconds)."""

    p50_s: float = 0.7
    p99_s: float = 5.0
    max_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.p50_s <= self.p99_s:
            raise ValueError(f"need 0 < p50 <= p99, got p50={self.p50_s} s, p99={self.p99_s} s")

    def draw(self, rng: random.Random) -> float:
        """One service time in seconds."""
        sigma = math.log(self.p99_s / self.p50_s) / Z99
        return min(self.max_s, rng.lognormvariate(math.log(self.p50_s), sigma))


class Bucket:
    """A token bucket: ``capacity`` units, refilled at ``per_s`` units a second, starting full.

    :meth:`take` admits a cost when the bucket holds it (or, for a cost above the capacity, when it is
    full: the level then goes below zero) and returns 0.0, else returns the seconds until it would.
    """

    def __init__(self, capacity: float, per_s: float, now: float):
        self.capacity, self.per_s = capacity, per_s
        self.level, self.at = capacity, now

    def _refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.at) * self.per_s)
        self.at = now

    def wait_s(self, cost: float, now: float) -> float:
        """Seconds until ``cost`` fits (0.0: it fits now); charges nothing."""
        self._refill(now)
        need = min(cost, self.capacity)
        return 0.0 if self.level >= need else (need - self.level) / self.per_s

    def charge(self, cost: float) -> None:
        """Take ``cost`` (after :meth:`wait_s` returned 0.0 at the same ``now``)."""
        self.level -= cost


@dataclass
class ModelStats:
    """What one model's traffic did (the endpoint's ``/stats``)."""

    calls: int = 0
    ok: int = 0
    rejected: dict[str, int] = field(default_factory=lambda: {"rpm": 0, "tpm": 0})
    tokens_charged: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    admitted: list[tuple[float, int]] = field(default_factory=list)  # (arrival, tokens charged) of admitted calls

    def peak_in(self, span_s: float) -> dict[str, float]:
        """The most requests and tokens admitted in any ``span_s`` seconds (arrival times)."""
        times = [t for t, _ in self.admitted]
        cum = [0]
        for _, tok in self.admitted:
            cum.append(cum[-1] + tok)
        best_n = best_tok = 0
        for i, t in enumerate(times):  # the window that ends at arrival i
            j = bisect_left(times, t - span_s + 1e-9)
            best_n = max(best_n, i - j + 1)
            best_tok = max(best_tok, cum[i + 1] - cum[j])
        return {"requests": best_n, "tokens": best_tok}


@dataclass(frozen=True)
class Limits:
    """Per-model limits in the endpoint's clock: ``rpm``, ``tpm`` (None: none), ``window_s`` of budget held."""

    rpm: float | None = None
    tpm: float | None = None
    window_s: float = 60.0


def hosted_model_app(latency: LatencyModel, limits: Limits, *, time_scale: float = 1.0, seed: int = 0,
                     tag_regex: str | None = None, charge_factor: float = 1.0):
    """The FastAPI app of the endpoint (see the module docstring); ``app.state.stats`` holds its counters.

    Args:
        latency: service times in the endpoint's clock (multiplied by ``time_scale`` when served).
        limits: per-model rate limits in the endpoint's clock.
        time_scale: real seconds per second of the endpoint's clock (0.05: 20 times as fast).
        seed: the latency draws' random seed.
        tag_regex: log every call with this regex's first group in the prompt.
        charge_factor: each request is charged this many times its token count (>= 1), rounded up.
    """
    from aml_ray.models.rate_limits import prompt_tokens
    from aml_ray.models.tokens import count_tokens

    if not time_scale > 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
    if not charge_factor >= 1:
        raise ValueError(f"charge_factor must be >= 1, got {charge_factor}")
    prompt_tokens([{"role": "user", "content": "warm"}], "gpt-4o-mini")  # the tokenizer's tables load now, not
    # on the first request (about 0.5-1 s of a blocked event loop, in which arrivals would bunch up)
    rng = random.Random(seed)
    tag_re = re.compile(tag_regex) if tag_regex else None
    state: dict[str, Any] = {"stats": {}, "buckets": {}, "calls": []}
    real_window = limits.window_s * time_scale

    def buckets(model: str, now: float) -> dict[str, Bucket]:
        if model not in state["buckets"]:
            state["buckets"][model] = {
                name: Bucket(max(1.0, limit * limits.window_s / 60), limit / 60 / time_scale, now)
                for name, limit in (("rpm", limits.rpm), ("tpm", limits.tpm)) if limit}
        return state["buckets"][model]

    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def complete(request: Request):
        body = await request.json()
        now = time.monotonic()
        model = str(body.get("model", "loopback"))
        messages = body.get("messages") or []
        prompt_text = " ".join(str(m.get("content", "")) for m in messages)
        kind = "judge" if '"label"' in prompt_text or '"score"' in prompt_text else "answer"
        st = state["stats"].setdefault(model, ModelStats())
        st.calls += 1
        prompt = prompt_tokens(messages, model)
        cost = math.ceil((prompt + int(body.get("max_tokens") or 0)) * charge_factor)
        mine = buckets(model, now)
        costs = {"rpm": 1, "tpm": cost}
        waits = {name: b.wait_s(costs[name], now) for name, b in mine.items()}
        call = None
        if tag_re is not None:
            found = tag_re.search(prompt_text)
            call = [now, None, kind, found.group(1) if found else "", 200, cost]
            state["calls"].append(call)
        over = [name for name, w in waits.items() if w > 0]
        if over:
            worst = max(over, key=waits.get)
            st.rejected[worst] += 1
            if call is not None:
                call[1], call[4] = now, 429
            retry = waits[worst]
            header = str(math.ceil(retry)) if retry >= 10 else f"{retry:.3f}"
            return JSONResponse(status_code=429, headers={
                "retry-after": header, "retry-after-ms": str(math.ceil(retry * 1000)),
                "x-ratelimit-limit-requests": str(limits.rpm or ""), "x-ratelimit-limit-tokens": str(limits.tpm or "")},
                content={"error": {"message": f"Rate limit reached for {model} ({worst}); try again in {retry:.3f}s",
                                   "type": "requests" if worst == "rpm" else "tokens",
                                   "code": "rate_limit_exceeded"}})
        for name, b in mine.items():
            b.charge(costs[name])
        st.admitted.append((now, cost))
        st.tokens_charged += cost
        st.prompt_tokens += prompt
        st.in_flight += 1
        st.max_in_flight = max(st.max_in_flight, st.in_flight)
        try:
            await asyncio.sleep(latency.draw(rng) * time_scale)
        finally:
            st.in_flight -= 1
        text = ("loopback answer" if kind == "answer" else '{"score": 1.0, "reason": "present"}'
                if '"score"' in prompt_text else 'Same thing as the gold answer.\n{"label": "CORRECT"}')
        completion = min(count_tokens(text, model), int(body.get("max_tokens") or 1 << 30))
        st.ok += 1
        st.completion_tokens += completion
        if call is not None:
            call[1] = time.monotonic()
        return {"id": "chatcmpl-hosted", "object": "chat.completion", "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                          "total_tokens": prompt + completion}}

    def snapshot() -> dict[str, Any]:
        out: dict[str, Any] = {"time_scale": time_scale, "window_s": limits.window_s, "rpm": limits.rpm,
                               "tpm": limits.tpm, "models": {}}
        for model, st in state["stats"].items():
            rejected = sum(st.rejected.values())
            out["models"][model] = {
                "calls": st.calls, "ok": st.ok, "rejected_429": rejected, "rejected_by": dict(st.rejected),
                "share_429": rejected / st.calls if st.calls else 0.0,
                "tokens_charged": st.tokens_charged, "prompt_tokens": st.prompt_tokens,
                "completion_tokens": st.completion_tokens, "max_in_flight": st.max_in_flight,
                "peak_per_window": st.peak_in(real_window), "peak_per_minute": st.peak_in(60 * time_scale),
                "admitted": [list(a) for a in st.admitted]}  # (time.monotonic(), tokens charged) per admitted call
        if tag_re is not None:
            out["calls"] = list(state["calls"])
        return out

    @app.get("/stats")
    async def stats():
        return snapshot()

    @app.post("/reset")
    async def reset():
        state["stats"].clear()
        state["buckets"].clear()
        state["calls"].clear()
        return {"ok": True}

    app.state.snapshot = snapshot
    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--p50-ms", type=float, default=700.0, help="median latency (endpoint clock)")
    p.add_argument("--p99-ms", type=float, default=5000.0, help="99th percentile latency (endpoint clock)")
    p.add_argument("--max-ms", type=float, default=60_000.0, help="latency cap (endpoint clock)")
    p.add_argument("--rpm", type=float, default=None, help="requests per minute per model")
    p.add_argument("--tpm", type=float, default=None, help="tokens per minute per model (prompt + max_tokens)")
    p.add_argument("--window-s", type=float, default=60.0,
                   help="seconds of budget each bucket holds (60: a minute's burst; 1: enforced per second)")
    p.add_argument("--time-scale", type=float, default=1.0, help="real seconds per endpoint second")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--charge-factor", type=float, default=1.0,
                   help="charge each request this many times its token count (an API whose estimate runs higher)")
    p.add_argument("--tag-regex", default=None, help="log every call with this regex's first group (GET /stats 'calls')")
    a = p.parse_args(argv)
    import uvicorn

    app = hosted_model_app(LatencyModel(a.p50_ms / 1000, a.p99_ms / 1000, a.max_ms / 1000),
                           Limits(a.rpm, a.tpm, a.window_s), time_scale=a.time_scale, seed=a.seed,
                           tag_regex=a.tag_regex, charge_factor=a.charge_factor)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", a.port))
    sock.listen(4096)  # connections made before uvicorn serves wait in the backlog
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                           backlog=4096, loop="uvloop" if _has_uvloop() else "asyncio"))
    server.run(sockets=[sock])


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:  # pragma: no cover - uvloop is optional
        return False
    return True


if __name__ == "__main__":
    main()
