"""Retries of the conformance battery: the run's retry rule, counted per check.

The rule is the run's and lives in :mod:`aml_ray.retry`: the retry sets of the AML error table
(:data:`~aml_ray.retry.ADD_RETRY_STATUSES`, :data:`~aml_ray.retry.SEARCH_RETRY_STATUSES`, transport
failures), ``Retry-After`` honoured, bounded jittered backoff (:class:`~aml_ray.retry.RetryPolicy`).
Nothing here decides whether or how long to retry: :class:`CountingRetryPolicy` is the battery's
policy with a note taken before each wait, so the report can say how many retries each check needed.

A retry is counted by the cause of the attempt it repeats: the HTTP status as a string (``"429"``) or,
for a transport failure, its class name (``"ReadTimeout"``). The last failure of a request the policy
gave up on is not a retry and is not counted.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields

from tenacity import AsyncRetrying, RetryCallState

from aml_ray.retry import RetryPolicy, TransientError


class RetryLog:
    """Retries noted since the last :meth:`take`, by cause (``"429"``, ``"503"``, ``"ReadTimeout"``)."""

    def __init__(self) -> None:
        self._by_cause: Counter[str] = Counter()

    def note(self, error: BaseException | None) -> None:
        """Count one retry of an attempt that failed with ``error`` (a :class:`TransientError`)."""
        if isinstance(error, TransientError) and error.status is not None:
            cause = str(error.status)
        else:
            cause = getattr(error, "reason", None) or type(error).__name__
        self._by_cause[cause] += 1

    def take(self) -> dict[str, int]:
        """The retries noted so far, by cause (sorted), and start counting afresh."""
        taken, self._by_cause = dict(sorted(self._by_cause.items())), Counter()
        return taken


@dataclass(frozen=True)
class CountingRetryPolicy(RetryPolicy):
    """A :class:`RetryPolicy` that notes each retry it makes in a :class:`RetryLog`.

    Attempts, waits (Retry-After included) and what is retried are the wrapped policy's, unchanged.

    Attributes:
        log: where each retry is noted (shared by every client of one battery run).
    """

    log: RetryLog = field(default_factory=RetryLog, compare=False, repr=False)

    @classmethod
    def wrapping(cls, policy: RetryPolicy, log: RetryLog) -> CountingRetryPolicy:
        """The same bounds as ``policy``, noting retries in ``log``."""
        return cls(**{f.name: getattr(policy, f.name) for f in fields(RetryPolicy)}, log=log)

    def retrying(self) -> AsyncRetrying:
        """The wrapped policy's ``AsyncRetrying``, with a note in :attr:`log` before each wait."""
        return super().retrying().copy(before_sleep=self._noted)

    def _noted(self, state: RetryCallState) -> None:
        # tenacity calls before_sleep only when it is about to retry (never after the last attempt)
        self.log.note(state.outcome.exception() if state.outcome else None)


def describe_retries(by_cause: dict[str, int]) -> str:
    """``3 retries (2x429, 1x503)``, ``1 retry (1x429)`` or ``no retries``."""
    total = sum(by_cause.values())
    if not total:
        return "no retries"
    causes = ", ".join(f"{n}x{cause}" for cause, n in by_cause.items())
    return f"{total} {'retry' if total == 1 else 'retries'} ({causes})"
