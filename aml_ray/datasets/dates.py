"""Calendar dates in benchmark files -> explicit UTC milliseconds (one place for the month table)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

#: English month names -> month numbers (lower case keys).
MONTHS = {name: i for i, name in enumerate(
    ["january", "february", "march", "april", "may", "june", "july", "august", "september",
     "october", "november", "december"], start=1)}


def utc_midnight_ms(year: str | int, month_name: str, day: str | int, bad: Callable[[str], ValueError]) -> int:
    """Milliseconds since the epoch of ``day month_name year`` at 00:00 UTC.

    Args:
        year / month_name / day: the parts as read from the file (month by English name, any case).
        bad: builds the adapter's error (naming the file's field and value) from a reason.

    Raises:
        ValueError: from ``bad``: an unknown month or an impossible day.
    """
    month = MONTHS.get(month_name.lower())
    if month is None:
        raise bad(f"unknown month {month_name!r}")
    try:
        dt = datetime(int(year), month, int(day), tzinfo=timezone.utc)
    except ValueError as exc:
        raise bad(str(exc)) from None
    return int(dt.timestamp()) * 1000
