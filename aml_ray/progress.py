"""Progress counters shared by the pipeline's stages and read by the driver's display.

Stages report with a fire-and-forget ``tracker.incr.remote(stage, n)`` once per batch (never per row);
the Ingest stage reports a sample's finished Adds in all with ``tracker.set_done.remote("add", sample, n)``,
so a sample that runs again (its actor restarted after a node loss, or a resumed run) is counted once.
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
        self._keyed: dict[tuple[str, str], int] = {}
        self._failure: dict | None = None

    def record_failure(self, failure: dict) -> None:
        """Keep the first failure: ``{"kind", "summary", "field"?, "status"?, "request_id"}``."""
        if self._failure is None:
            self._failure = failure

    def failure(self) -> dict | None:
        return self._failure

    def incr(self, stage: str, n: int = 1) -> None:
        self._done[stage] += n

    def set_done(self, stage: str, key: str, n: int) -> None:
        """Record that ``key`` (a sample) has ``n`` finished units of ``stage`` in all; the highest count wins.

        Idempotent: a re-executed sample reports the same key again instead of adding its units twice.
        """
        self._keyed[(stage, key)] = max(self._keyed.get((stage, key), 0), n)

    def snapshot(self) -> dict[str, int]:
        done = Counter(self._done)
        for (stage, _), n in self._keyed.items():
            done[stage] += n
        return dict(done)
