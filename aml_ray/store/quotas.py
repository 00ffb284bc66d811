"""Evaluation quotas, from the seed's "Evaluation modes and standard quotas" table.

- smoke: 1 per hour; at most 30 per track this edition.
- full: at most 2 per AML key and track; the second unlocks 30 days after the first full run completed.

Counted per key and track from ``quota_usage`` (one row per accepted job). A smoke that failed still
counts (it used the platform's capacity); a full job that ended ``failed`` or ``partial`` gives its row
back (:func:`aml_ray.store.jobs.mark_failed`): it did not measure the system.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from aml_ray.store.errors import QuotaExceeded
from aml_ray.store.models import QuotaUsage

SMOKE_PER_HOUR = 1
SMOKE_WINDOW = timedelta(hours=1)
SMOKE_PER_TRACK_PER_EDITION = 30
FULL_PER_KEY_AND_TRACK = 2
FULL_SECOND_UNLOCK = timedelta(days=30)


def check_quota(session: Session, *, key_id: str, track: str, mode: str, edition: str,
                now: datetime) -> None:
    """Raise when ``key_id`` may not start another ``mode`` job on ``track`` now.

    Args:
        session: an open session.
        key_id: the Leaderboard key's id.
        track: ``textual`` | ``multimodal`` | ``coding``.
        mode: ``smoke`` | ``full``.
        edition: the edition the counts are scoped to.
        now: the current time (UTC).

    Raises:
        QuotaExceeded: with the rule and, where known, when the next run becomes available.
    """
    base = select(QuotaUsage).where(QuotaUsage.key_id == key_id, QuotaUsage.track == track,
                                    QuotaUsage.mode == mode, QuotaUsage.edition == edition)
    rows = list(session.scalars(base.order_by(QuotaUsage.charged_at)))
    if mode == "smoke":
        recent = [r for r in rows if r.charged_at > now - SMOKE_WINDOW]
        if len(recent) >= SMOKE_PER_HOUR:
            available = recent[0].charged_at + SMOKE_WINDOW
            raise QuotaExceeded(f"smoke quota: {SMOKE_PER_HOUR} per hour; next smoke available at "
                                f"{available.isoformat(timespec='seconds')}", available)
        if len(rows) >= SMOKE_PER_TRACK_PER_EDITION:
            raise QuotaExceeded(f"smoke quota: at most {SMOKE_PER_TRACK_PER_EDITION} per track in edition "
                                f"{edition}")
        return
    if len(rows) >= FULL_PER_KEY_AND_TRACK:
        raise QuotaExceeded(f"full quota: at most {FULL_PER_KEY_AND_TRACK} full runs per key and track")
    if rows:
        first = rows[0]
        if first.completed_at is None:
            raise QuotaExceeded("full quota: the second full run unlocks 30 days after the first one "
                                "completed, and the first has not completed")
        available = first.completed_at + FULL_SECOND_UNLOCK
        if now < available:
            raise QuotaExceeded(f"full quota: the second full run unlocks at "
                                f"{available.isoformat(timespec='seconds')}", available)


def count_usage(session: Session, *, key_id: str, track: str, mode: str, edition: str) -> int:
    """How many ``mode`` jobs ``key_id`` was charged for on ``track`` in ``edition``."""
    return session.scalar(select(func.count()).select_from(QuotaUsage).where(
        QuotaUsage.key_id == key_id, QuotaUsage.track == track, QuotaUsage.mode == mode,
        QuotaUsage.edition == edition)) or 0
