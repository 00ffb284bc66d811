"""The outcome of one conformance check (:class:`CheckResult`) and the outcome words.

A check passes, fails or warns:

- ``pass``: the rule holds.
- ``fail``: a rule of the AML contract is broken; when the check is *required* the battery's exit code
  is 1 and a smoke job stops.
- ``warn``: advisory (a "should" of the seed, an optional field, or behaviour under overload); never
  changes the exit code.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Outcome = Literal["pass", "fail", "warn"]
OUTCOMES: tuple[Outcome, ...] = ("pass", "fail", "warn")


@dataclass(frozen=True)
class CheckResult:
    """One line of the conformance report.

    Attributes:
        name: the check's name (``health``, ``auth``, ``add_shape``, ...).
        outcome: ``pass`` | ``fail`` | ``warn``.
        field: the contract field or header the outcome is about (``request_id``, ``data[0].score``,
            ``Authorization``...), or ``""`` when none applies.
        message: what was sent and what came back, in one sentence; never holds a secret.
        fix: what the participant should change (empty for a pass).
        required: whether a ``fail`` of this check blocks (exit code 1, smoke stops).
        elapsed_ms: wall time of the check in milliseconds.
        data: machine-readable numbers for the report (latency percentiles, status counts).
        retries: how many requests of the check were sent again by the run's retry rule (a transient
            status or transport failure, :mod:`aml_ray.conformance.retries`); never changes the outcome.
        retries_by_status: ``retries`` by cause: the HTTP status as a string (``"429"``) or the
            transport failure's class name (``"ReadTimeout"``).
    """

    name: str
    outcome: Outcome
    field: str
    message: str
    fix: str = ""
    required: bool = True
    elapsed_ms: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)
    retries: int = 0
    retries_by_status: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {self.outcome!r}")

    @property
    def blocking(self) -> bool:
        """True when this result fails a required check."""
        return self.required and self.outcome == "fail"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every attribute."""
        return asdict(self)


def passed(name: str, field: str, message: str, **kw: Any) -> CheckResult:
    """A ``pass`` result (keyword arguments as :class:`CheckResult`)."""
    return CheckResult(name, "pass", field, message, **kw)


def failed(name: str, field: str, message: str, fix: str, **kw: Any) -> CheckResult:
    """A ``fail`` result (keyword arguments as :class:`CheckResult`)."""
    return CheckResult(name, "fail", field, message, fix, **kw)


def warned(name: str, field: str, message: str, fix: str, **kw: Any) -> CheckResult:
    """A ``warn`` result (keyword arguments as :class:`CheckResult`)."""
    return CheckResult(name, "warn", field, message, fix, **kw)
