"""Progress counters shared by the pipeline's stages and read by the driver's display.

Stages report with a fire-and-forget ``tracker.incr.remote(stage, n)`` once per batch (never per row).
"""

from __future__ import annotations

from collections import Counter


class ProgressTracker:
    """Counts finished units per stage (``add``, ``search``, ``answer``, ``judge``); a Ray actor at run time.

    It also keeps the first stage failure (a contract error or a non-retryable participant status) as
    plain data, because Ray Data re-wraps UDF exceptions as text and the driver must still name the field.
    """

    def __init__(self) -> None:
        self._done: Counter[str] = Counter()
        self._failure: dict | None = None

    def record_failure(self, failure: dict) -> None:
        """Keep the first failure: ``{"kind", "summary", "field"?, "status"?, "request_id"}``."""
        if self._failure is None:
            self._failure = failure

    def failure(self) -> dict | None:
        return self._failure

    def incr(self, stage: str, n: int = 1) -> None:
        self._done[stage] += n

    def snapshot(self) -> dict[str, int]:
        return dict(self._done)
