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
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiolimiter import AsyncLimiter

from aml_ray.media import text_of

#: Tokens each chat message adds to its content's tokens (role and separators; OpenAI's cookbook,
#: "How to count tokens with tiktoken", for the gpt-4o and gpt-3.5/4 families).
MESSAGE_OVERHEAD_TOKENS = 3
#: Tokens every request adds for the reply's priming (``<|start|>assistant<|message|>``), same source.
REPLY_PRIMING_TOKENS = 3
#: Tokens of one image part: a 2048 x 768 image at high detail (:mod:`aml_ray.media` caps images there).
IMAGE_TOKENS = 1105


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
        headroom: the share of each limit left unused (0.05: the buckets drain at 95 % of the limit), so
            that the endpoint's own budget refills a little faster than the client spends it and absorbs
            requests that arrive closer together than they were sent, and token counts a little above
            the client's.

    A request dearer than the token bucket's capacity pays in bucket-sized parts before it is sent, so
    the tokens/minute rate holds for requests of any size.

    Requests are admitted in the order they ask (one waits on the buckets at a time, behind an
    ``asyncio.Lock``, which wakes its waiters first come, first served). Left to the buckets, freed
    tokens go to the smallest waiting request (aiolimiter's order), so while shorter prompts keep
    arriving a longer one waits without end (in a suite, the bundle whose prompts are longer waits out the
    middle of the run: docs/benchmarks.md). The model client asks in the order its fair slots grant
    (:mod:`aml_ray.actors.fair`), so that order holds for the tokens too.

    Raises:
        ValueError: a limit that is not positive, ``window_s`` outside (0, 60], ``headroom`` outside [0, 0.5).
    """

    def __init__(self, rpm: float | None, tpm: float | None, window_s: float = 0.5, headroom: float = 0.05):
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

    @staticmethod
    def _bucket(limit: float, window_s: float, headroom: float, least: float) -> AsyncLimiter:
        per_s = limit * (1 - headroom) / 60
        capacity = max(least, per_s * window_s)
        return AsyncLimiter(capacity, capacity / per_s)

    @property
    def counts_tokens(self) -> bool:
        """Whether a request's tokens must be counted (a tokens/minute limit is set)."""
        return self._tpm is not None

    async def acquire(self, tokens: int = 0) -> None:
        """Wait for this request's turn (first come, first served), then until one more request and
        ``tokens`` more tokens fit, and take them (tokens in bucket-sized parts when they exceed the bucket)."""
        if self._rpm is None and self._tpm is None:
            return
        loop = asyncio.get_running_loop()
        if self._turn is None or self._turn[0] is not loop:  # a lock waits in one loop (a client reused by
            self._turn = (loop, asyncio.Lock())  # asyncio.run after asyncio.run gets one per loop)
        async with self._turn[1]:
            if self._rpm is not None:
                await self._rpm.acquire()
            if self._tpm is not None:
                left = float(tokens)
                while left > 0:
                    part = min(left, self._tpm.max_rate)
                    await self._tpm.acquire(part)
                    left -= part
