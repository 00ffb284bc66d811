"""Progress counters shared by the pipeline's stages and read by the driver's display.

Stages report with a fire-and-forget ``tracker.incr.remote(stage, n)`` once per batch (never per row).
"""

from __future__ import annotations

from collections import Counter


class ProgressTracker:
    """Counts finished units per stage (``add``, ``search``, ``answer``, ``judge``); a Ray actor at run time."""

    def __init__(self) -> None:
        self._done: Counter[str] = Counter()

    def incr(self, stage: str, n: int = 1) -> None:
        self._done[stage] += n

    def snapshot(self) -> dict[str, int]:
        return dict(self._done)
