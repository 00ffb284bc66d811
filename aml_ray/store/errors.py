"""Domain errors raised by the store's queries; the service maps each to one HTTP status.

Every error carries a ``reason`` a participant can act on (never a secret), which the API returns as
``{"detail": {"reason": ...}}``.
"""

from __future__ import annotations

from datetime import datetime


class StoreError(Exception):
    """Base class.

    Args:
        reason: the message for the caller.
    """

    status_code = 400

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


class NotFound(StoreError):
    """The object does not exist, or is not visible to this key (both look the same: 404)."""

    status_code = 404


class Conflict(StoreError):
    """A uniqueness or state rule: duplicate run label, active job, already decided (409)."""

    status_code = 409


class QuotaExceeded(StoreError):
    """A platform quota has not reset (429).

    Args:
        reason: which quota.
        available_at: when the next run is allowed, or None when the quota is spent for the edition.
    """

    status_code = 429

    def __init__(self, reason: str, available_at: datetime | None = None):
        super().__init__(reason)
        self.available_at = available_at
