"""Requests/minute and tokens/minute budgets of one model endpoint, and a request's token count.

Hosted chat-completions APIs count a request against the tokens/minute limit when it arrives, as its
prompt tokens plus its ``max_tokens`` (OpenAI, "Rate limits": "your rate limit is calculated as the
maximum of max_tokens and the estimated number of tokens based on the character count of your request"),
and answer a request over either limit with HTTP 429 and ``Retry-After``. They replenish the budget
continuously rather than once a minute, and enforce it over periods shorter than a minute (OpenAI:
"60,000 requests/minute may be enforced as 1,000 requests/second"; Anthropic: a token bucket "continuously
replenished up to your maximum limit"). A client that sends a whole minute's budget at once is refused
for most of it by an endpoint that enforces per second.

:class:`RequestBudget` holds both limits as aiolimiter buckets (leaky buckets: a bucket of capacity
``limit x window_s / 60`` that drains at ``limit / 60`` per second),
so the client never sends more than
``window_s`` seconds' worth of budget at once, less ``headroom``. :func:`request_tokens` counts a request the way the
client estimates it and the benchmark endpoint (``scripts/model_endpoint.py``) charges it.

An endpoint may still count more than the client does: a hosted API estimates a request's tokens its own way
(OpenAI: "based on the character count"), and other users of the same key draw on the same limits. A fixed
margin wide enough for every such endpoint would leave its share of every rate-limited run unused, so the
margin adapts: each refusal (HTTP 429, :meth:`RequestBudget.refused`) makes every later request count
:data:`REFUSAL_STEP` more of its cost against both buckets, at most once a :data:`WIDEN_EVERY_S` (a burst of
refusals is one step) and up to :data:`MOST_FACTOR`; after :data:`NARROW_AFTER_S` without one it narrows
by a step again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from aiolimiter import AsyncLimiter

from aml_ray.config import DEFAULT_RATE_HEADROOM
from aml_ray.media import text_of

#: Tokens each chat message adds to its content's tokens (role and separators; OpenAI's cookbook,
#: "How to count tokens with tiktoken", for the gpt-4o and gpt-3.5/4 families).
MESSAGE_OVERHEAD_TOKENS = 3
#: Tokens every request adds for the reply's priming (``<|start|>assistant<|message|>``), same source.
REPLY_PRIMING_TOKENS = 3
#: Tokens of one image part: a 2048 x 768 image at high detail (:mod:`aml_ray.media` caps images there).
IMAGE_TOKENS = 1105
#: How much each widening of the margin adds to what a request counts against both limits (a share of its cost).
REFUSAL_STEP = 0.02
#: The most a request counts against the limits after refusals, as a multiple of its cost.
MOST_FACTOR = 1.25
#: Seconds after a widening in which further refusals widen nothing (the requests already on their way when
#: the first came back were admitted at the old margin).
WIDEN_EVERY_S = 1.0
#: Seconds without a refusal after which the margin narrows by one step again (down to the declared headroom).
NARROW_AFTER_S = 60.0

log = logging.getLogger("aml_ray.models.rate_limits")


def _images(content: Any) -> int:
    if not isinstance(content, list):
        return 0
    return sum(isinstance(p, dict) and p.get("type") == "image_url" for p in content)


def prompt_tokens(messages: list[dict[str, Any]], model: str) -> int:
    """Prompt tokens of a chat request: each message's text in ``model``'s encoding, its overhead, its images.

    ``messages`` are OpenAI chat messages (content a string or a list of text/image parts); the count is
    ``sum(text tokens + MESSAGE_OVERHEAD_TOKENS + IMAGE_TOKENS x images) + REPLY_PRIMING_TOKENS``.
    """
    from aml_ray.models.tokens import count_tokens  # the tokenizer loads its tables on first use

    return REPLY_PRIMING_TOKENS + sum(
        count_tokens(text_of(m.get("content") or ""), model) + MESSAGE_OVERHEAD_TOKENS
        + IMAGE_TOKENS * _images(m.get("content"))
        for m in messages)


def request_tokens(messages: list[dict[str, Any]], max_tokens: int, model: str) -> int:
    """What a request costs against a tokens/minute limit: :func:`prompt_tokens` + ``max_tokens``."""
    return prompt_tokens(messages, model) + max_tokens


class RequestBudget:
    """The requests/minute and tokens/minute buckets of one endpoint (either may be absent).

    Args:
        rpm: requests per minute, or None for no limit.
        tpm: tokens per minute (:func:`request_tokens` of each request), or None.
        window_s: seconds of budget the client may send at once: each bucket holds ``limit x window_s /
            60`` (at least one request). 60 lets a whole minute's budget go at once; 0.5 (the default) suits
            an endpoint that enforces per second (or over any longer period): its bucket holds twice the
            client's, so requests that bunch up on the way are still admitted (with 1, a loopback endpoint
            refused 1-6 % of 80 requests; with 0.5, none: docs/benchmarks.md).
        headroom: the share of each limit left unused from the start
            (:data:`aml_ray.config.DEFAULT_RATE_HEADROOM`, 0.02: the buckets drain at 98 % of the limit), so
            that the endpoint's own budget refills a little faster than the client spends it and absorbs
            requests that arrive closer together than they were sent; refusals widen the margin
            (:meth:`refused`).
        clock: seconds, monotonic (``time.monotonic``; a test's own clock).

    A request dearer than a bucket's capacity pays in bucket-sized parts before it is sent, so the rate
    holds for requests of any size. Each request counts :attr:`factor` times its cost (one request, its
    tokens) against the buckets: 1.0 until the endpoint refuses one (:meth:`refused`).

    Requests are admitted in the order they ask (one waits on the buckets at a time, behind an
    ``asyncio.Lock``, which wakes its waiters first come, first served). Left to the buckets, freed
    tokens go to the smallest waiting request (aiolimiter's order), so while shorter prompts keep
    arriving a longer one waits without end (in a suite, the bundle whose prompts are longer waits out the
    middle of the run: docs/benchmarks.md). The model client asks in the order its fair slots grant
    (:mod:`aml_ray.actors.fair`), so that order holds for the tokens too.

    Raises:
        ValueError: a limit that is not positive, ``window_s`` outside (0, 60], ``headroom`` outside [0, 0.5).
    """

    def __init__(self, rpm: float | None, tpm: float | None, window_s: float = 0.5,
                 headroom: float = DEFAULT_RATE_HEADROOM,
                 clock: Callable[[], float] = time.monotonic):
        for name, value in (("rpm", rpm), ("tpm", tpm)):
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 or unset, got {value!r}")
        if not 0 < window_s <= 60:
            raise ValueError(f"window_s must be in (0, 60] seconds, got {window_s!r}")
        if not 0 <= headroom < 0.5:
            raise ValueError(f"headroom must be in [0, 0.5), got {headroom!r}")
        self.window_s, self.headroom = window_s, headroom
        self._rpm = self._bucket(rpm, window_s, headroom, least=1.0) if rpm else None
        self._tpm = self._bucket(tpm, window_s, headroom, least=1.0) if tpm else None
        self._turn: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self._clock = clock
        self.factor = 1.0  # what a request counts against the buckets, as a multiple of its cost
        self._changed_at = self._refused_at = float("-inf")

    @staticmethod
    def _bucket(limit: float, window_s: float, headroom: float, least: float) -> AsyncLimiter:
        per_s = limit * (1 - headroom) / 60
        capacity = max(least, per_s * window_s)
        return AsyncLimiter(capacity, capacity / per_s)

    @property
    def counts_tokens(self) -> bool:
        """Whether a request's tokens must be counted (a tokens/minute limit is set)."""
        return self._tpm is not None

    def refused(self) -> None:
        """The endpoint refused a request over its limits (HTTP 429): later requests count :data:`REFUSAL_STEP`
        more of their cost, unless the margin widened less than :data:`WIDEN_EVERY_S` ago or is at
        :data:`MOST_FACTOR`."""
        now = self._clock()
        self._refused_at = now
        if now - self._changed_at >= WIDEN_EVERY_S and self.factor < MOST_FACTOR:
            self.factor = min(MOST_FACTOR, round(self.factor + REFUSAL_STEP, 6))
            self._changed_at = now
            log.info("the model endpoint refused a request over its limits: each request now counts %.2f x its "
                     "cost against the requests/minute and tokens/minute budgets", self.factor)

    def _narrow(self) -> None:
        """One step back towards 1.0 once :data:`NARROW_AFTER_S` passed without a refusal or a change."""
        now = self._clock()
        if self.factor > 1.0 and now - max(self._refused_at, self._changed_at) >= NARROW_AFTER_S:
            self.factor = max(1.0, round(self.factor - REFUSAL_STEP, 6))
            self._changed_at = now

    async def acquire(self, tokens: int = 0) -> None:
        """Wait for this request's turn (first come, first served), then until one more request and
        ``tokens`` more tokens fit (each times :attr:`factor`), and take them (in bucket-sized parts when they
        exceed a bucket)."""
        if self._rpm is None and self._tpm is None:
            return
        loop = asyncio.get_running_loop()
        if self._turn is None or self._turn[0] is not loop:  # a lock waits in one loop (a client reused by
            self._turn = (loop, asyncio.Lock())  # asyncio.run after asyncio.run gets one per loop)
        async with self._turn[1]:
            self._narrow()
            if self._rpm is not None:
                await _take(self._rpm, self.factor)
            if self._tpm is not None:
                await _take(self._tpm, tokens * self.factor)


async def _take(bucket: AsyncLimiter, amount: float) -> None:
    """Take ``amount`` from ``bucket``, in parts of at most its capacity (aiolimiter refuses more at once)."""
    left = float(amount)
    while left > 0:
        part = min(left, bucket.max_rate)
        await bucket.acquire(part)
        left -= part
