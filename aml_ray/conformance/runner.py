"""Run the conformance battery against one participant version and collect :class:`CheckResult` s.

Entry points:

- :func:`run_checks` (async) -- what ``aml-ray check`` runs and what a smoke job of the service runs
  first (it stores the results with the job and stops when :func:`exit_code` is not 0);
- :func:`run_checks_sync` -- the same from synchronous code.

Each check runs once, in battery order, with a wall-time bound; a check that crashes or times out is
recorded as a failure of that check and the battery goes on. Transient statuses are retried as the run
retries them (:mod:`aml_ray.conformance.retries`); each result says how many retries its check needed,
and :func:`summary` gives the total. The participant's secret is redacted from every message before the
results are returned.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from collections.abc import Iterable

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.conformance.checks import CHECKS, Check
from aml_ray.conformance.probe import CheckOptions, Probe
from aml_ray.conformance.result import CheckResult, failed

#: Exit codes of ``aml-ray check``.
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _redact(result: CheckResult, secret: str | None) -> CheckResult:
    if not secret:
        return result
    return dataclasses.replace(result, message=result.message.replace(secret, "***"),
                               fix=result.fix.replace(secret, "***"))


async def _run_one(check: Check, probe: Probe) -> CheckResult:
    probe.retries.take()  # retries of this check only
    t0 = time.perf_counter()
    limit = probe.options.check_timeout_s
    try:
        result = await asyncio.wait_for(check.fn(probe), timeout=limit)
    except TimeoutError:
        result = failed(check.name, "", f"the check did not finish within {limit:.0f} s",
                        "answer each request well within the timeout")
    except Exception as exc:  # noqa: BLE001 - a crashed check is that check's failure, not the battery's
        result = failed(check.name, "", f"the check could not run: {type(exc).__name__}: {str(exc)[:200]}",
                        "make sure the Add and Search URLs are reachable and answer HTTP")
    retried = probe.retries.take()
    return dataclasses.replace(result, required=check.required, elapsed_ms=(time.perf_counter() - t0) * 1000,
                               retries=sum(retried.values()), retries_by_status=retried)


async def run_checks(spec: ParticipantSpec, *, options: CheckOptions | None = None,
                     only: Iterable[str] | None = None) -> list[CheckResult]:
    """Run the battery against one participant version.

    Args:
        spec: the version's endpoints, auth (with its secret) and declared capacity (``max_in_flight``
            is the declared max in-flight requests the limits check bursts above). Its retry policy and
            timeout are replaced by the bounded ones of ``options``.
        options: request and time bounds (default :class:`CheckOptions`).
        only: names of the checks to run (default all, in battery order).

    Returns:
        One result per check run, in battery order, secrets redacted.

    Raises:
        ValueError: ``only`` names an unknown check.
    """
    names = [c.name for c in CHECKS]
    wanted = set(only) if only is not None else set(names)
    unknown = wanted - set(names)
    if unknown:
        raise ValueError(f"unknown check(s) {sorted(unknown)}; the battery is {names}")
    probe = Probe(spec, options or CheckOptions())
    try:
        results = [await _run_one(c, probe) for c in CHECKS if c.name in wanted]
    finally:
        await probe.aclose()
    return [_redact(r, probe.secret) for r in results]


def run_checks_sync(spec: ParticipantSpec, **kwargs) -> list[CheckResult]:
    """:func:`run_checks` from synchronous code (runs its own event loop)."""
    return asyncio.run(run_checks(spec, **kwargs))


def exit_code(results: list[CheckResult]) -> int:
    """0 when no required check failed, else 1 (warnings never change it)."""
    return EXIT_FAILED if any(r.blocking for r in results) else EXIT_OK


def retries_by_status(results: list[CheckResult]) -> dict[str, int]:
    """The retries of all checks by cause (``{"429": 3, "503": 1}``), causes sorted."""
    total: Counter[str] = Counter()
    for r in results:
        total.update(r.retries_by_status)
    return dict(sorted(total.items()))


def summary(results: list[CheckResult]) -> dict[str, object]:
    """Counts by outcome, the blocking checks, the exit code and the retries, as a JSON-ready dict.

    Returns:
        ``{"pass", "fail", "warn", "total", "blocking": [names], "exit_code", "retries": total,
        "retries_by_status": {cause: count}}``.
    """
    counts = {o: sum(r.outcome == o for r in results) for o in ("pass", "fail", "warn")}
    return {**counts, "total": len(results), "blocking": [r.name for r in results if r.blocking],
            "exit_code": exit_code(results), "retries": sum(r.retries for r in results),
            "retries_by_status": retries_by_status(results)}
