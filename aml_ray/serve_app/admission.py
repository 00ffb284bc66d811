"""Admission of unauthenticated access requests: a rate limit per client address and a bound on the health
checks running at once.

Each access request may call the submitter's ``health_url``; a URL that never answers would hold one of
the replica's request threads for the whole check, and a burst of such requests would hold all of them, so
that every page waits. Here each client address may submit ``per_minute`` requests per moving minute
(``limits``' moving window, in memory, per replica) and at most ``max_checks`` health checks run at once;
the next one is answered 503 with ``Retry-After`` at once instead of waiting for a slot.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import HTTPException
from limits import RateLimitItemPerMinute
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

#: Seconds a refused client is told to wait for a health-check slot.
HEALTH_RETRY_AFTER_S = 5


class Admission:
    """The rate limit and the health-check slots of one replica.

    Args:
        per_minute: access requests one client address may submit per moving minute (>= 1).
        max_checks: health checks running at once (>= 1).

    Raises:
        ValueError: a bound below 1.
    """

    def __init__(self, per_minute: int, max_checks: int):
        if per_minute < 1 or max_checks < 1:
            raise ValueError(f"access_requests_per_minute and max_health_checks must be >= 1, got {per_minute}, "
                             f"{max_checks}")
        self.item = RateLimitItemPerMinute(per_minute)
        self.limiter = MovingWindowRateLimiter(MemoryStorage())
        self.slots = threading.BoundedSemaphore(max_checks)

    def admit(self, client: str) -> None:
        """Count one access request of ``client`` (its address).

        Raises:
            HTTPException: 429 with ``Retry-After`` (seconds until the window frees a request) over the limit.
        """
        if not self.limiter.hit(self.item, "access-request", client):
            reset = self.limiter.get_window_stats(self.item, "access-request", client).reset_time
            wait = max(1, int(reset - time.time()) + 1)
            raise HTTPException(429, {"reason": f"too many access requests from this address: at most "
                                                f"{self.item.amount} per minute; retry in {wait} s"},
                                headers={"Retry-After": str(wait)})

    @contextmanager
    def health_slot(self) -> Iterator[None]:
        """Hold one health-check slot for the ``with`` block.

        Raises:
            HTTPException: 503 with ``Retry-After`` when every slot is taken (nothing waits).
        """
        if not self.slots.acquire(blocking=False):
            raise HTTPException(503, {"reason": "the service is checking many health URLs right now; retry "
                                                f"in {HEALTH_RETRY_AFTER_S} s"},
                                headers={"Retry-After": str(HEALTH_RETRY_AFTER_S)})
        try:
            yield
        finally:
            self.slots.release()
