"""Retry sets and the bounded, jittered backoff policy (tenacity).

Retry sets from the AML error table (seed "Error handling"):

- Add retries 408, 409, 425, 429, 500, 502, 503, 504, 524 and transport errors.
- Search retries 408, 425, 429, 500, 502, 503, 504 and transport errors.
- 400/401/403/404/422 (and Search 409) stop at once: they are not transient.

A retry resends the same request_id and the same body; the callers guarantee that by building the body
once, before the first attempt.
"""

from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

ADD_RETRY_STATUSES: frozenset[int] = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 524})
SEARCH_RETRY_STATUSES: frozenset[int] = frozenset({408, 425, 429, 500, 502, 503, 504})
#: Model endpoints: 408/409/429/5xx and transport errors.
MODEL_RETRY_STATUSES: frozenset[int] = frozenset({408, 409, 429, 500, 502, 503, 504})


class TransientError(Exception):
    """A failed attempt that may be retried.

    Args:
        reason: short description (``"HTTP 503"``, ``"ConnectError"``); never holds a secret.
        status: the HTTP status, or None for a transport error.
        retry_after_s: seconds the server asked us to wait (Retry-After), if any.

    Attributes:
        queue_ms: how long the failed attempt waited for an in-flight slot before it was sent (set by
            :class:`aml_ray.actors.participant.ParticipantClient`; 0 when unknown), summed into the
            request's ``queue_ms``.
    """

    def __init__(self, reason: str, status: int | None = None, retry_after_s: float | None = None):
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.retry_after_s = retry_after_s
        self.queue_ms = 0.0

    def __reduce__(self):
        return (TransientError, (self.reason, self.status, self.retry_after_s))


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date), or None.

    Negative or unparsable values give None (then the normal backoff applies).
    """
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value).timestamp()
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when - (time.time() if now is None else now)
    return seconds if seconds >= 0 else None


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retry policy.

    Attributes:
        max_attempts: total attempts including the first (default 6).
        backoff_base_s: scale of the exponential backoff in seconds.
        backoff_max_s: cap of one backoff wait in seconds.
        retry_after_cap_s: longest Retry-After we honour for one wait, in seconds.
    """

    max_attempts: int = 6
    backoff_base_s: float = 0.25
    backoff_max_s: float = 20.0
    retry_after_cap_s: float = 120.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")

    def retrying(self) -> AsyncRetrying:
        """A tenacity ``AsyncRetrying`` that retries :class:`TransientError` only and re-raises the last."""
        jitter = wait_random_exponential(multiplier=self.backoff_base_s, max=self.backoff_max_s)

        def wait(retry_state) -> float:
            exc = retry_state.outcome.exception() if retry_state.outcome else None
            if isinstance(exc, TransientError) and exc.retry_after_s is not None:
                return min(exc.retry_after_s, self.retry_after_cap_s)
            return jitter(retry_state)

        return AsyncRetrying(
            stop=stop_after_attempt(self.max_attempts),
            wait=wait,
            retry=retry_if_exception_type(TransientError),
            reraise=True,
        )
