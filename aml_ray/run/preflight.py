"""Pre-flight: one health check and one Add/Search round trip before a run sends any Add.

A dead or mis-configured endpoint must fail a run in seconds, with the URL and the cause, instead of
after every Add and Search of the dataset has exhausted its retries. :func:`preflight` runs
in the driver, before Ray starts, with the run's own :class:`~aml_ray.actors.participant.ParticipantClient`
code (same auth, same contract validation) and a short retry policy (:data:`PREFLIGHT_RETRY`).

The probe writes one memory under its own user_id, ``eval:<run_id>:<dataset>:preflight`` (the id scheme of
DESIGN.md with ``preflight`` as the sample), which no question ever searches; a resumed run sends the same
request_id and body again, which an idempotent participant acknowledges without a duplicate.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from aml_ray.actors.participant import ParticipantClient, ParticipantError, ParticipantSpec
from aml_ray.contract import AddRequest, ContractError, SearchRequest
from aml_ray.retry import RetryPolicy

#: Short policy for the probe: 3 attempts with waits of at most 1 s, Retry-After honoured up to 5 s, so a
#: participant that only answers 429/503 now and then still passes and a dead one fails in seconds.
PREFLIGHT_RETRY = RetryPolicy(max_attempts=3, backoff_base_s=0.25, backoff_max_s=1.0, retry_after_cap_s=5.0)
#: Per-attempt timeout of the probe in seconds (the run's own timeout when that is shorter).
PREFLIGHT_TIMEOUT_S = 30.0
PROBE_SAMPLE = "preflight"


class PreflightFailed(Exception):
    """The participant failed the pre-flight.

    Attributes:
        step: ``health`` | ``add`` | ``search``.
        url: the endpoint that failed.
        cause: one line naming the cause (HTTP status, transport error, or the contract field).
        report: the :class:`PreflightReport` so far (for run.json).
        field: the contract field a reply broke (a contract error), else None.
        status: the HTTP status that was not retried (a participant error), else None.
    """

    def __init__(self, step: str, url: str, cause: str, report: PreflightReport, *, field: str | None = None,
                 status: int | None = None):
        self.step, self.url, self.cause, self.report = step, url, cause, report
        self.field, self.status = field, status
        super().__init__(f"pre-flight {step} failed at {url}: {cause}")

    def failure(self) -> dict[str, Any]:
        """The structured failure for run.json and the driver: ``kind`` is ``ContractError`` or
        ``ParticipantError`` when the reply broke the contract or had a status that is not retried (as
        for a failure during the run), else ``Preflight``; ``stage`` is ``preflight``."""
        kind = "ContractError" if self.field else "ParticipantError" if self.status else "Preflight"
        return {"kind": kind, "stage": "preflight", "step": self.step, "url": self.url, "field": self.field,
                "status": self.status, "request_id": f"{self.report.user_id}:chunk-0" if self.step == "add" else None,
                "summary": str(self)}


@dataclass
class PreflightReport:
    """What the pre-flight did: per step ``{"url", "ok", "http_status", "attempts", "latency_ms", "error"}``.

    Attributes:
        user_id: the probe's user_id.
        steps: step name -> its outcome, in the order run.
        wall_s: seconds the pre-flight took.
    """

    user_id: str
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    wall_s: float = 0.0

    def describe(self) -> dict[str, Any]:
        """The report as plain data for run.json."""
        return asdict(self)

    def lone_latencies(self) -> dict[str, float]:
        """Endpoint URL -> latency in ms of each probe step that succeeded (``add``, ``search``): each was sent
        with nothing else in flight, so it is the endpoint's unloaded latency
        (:class:`~aml_ray.actors.participant.ParticipantClient`'s ``lone_latencies``)."""
        return {step["url"]: step["latency_ms"] for name, step in self.steps.items()
                if name in ("add", "search") and step.get("ok") and step.get("latency_ms") is not None}


def probe_spec(spec: ParticipantSpec) -> ParticipantSpec:
    """``spec`` with the pre-flight's retry policy and timeout (endpoints, auth and limits unchanged)."""
    return spec.model_copy(update={"retry": PREFLIGHT_RETRY, "timeout_s": min(spec.timeout_s, PREFLIGHT_TIMEOUT_S),
                                   "max_in_flight": 1, "requests_per_s": None})


def _step(outcome: dict[str, Any], url: str) -> dict[str, Any]:
    return {"url": url, "ok": outcome["status"] == "ok", "http_status": outcome.get("http_status"),
            "attempts": outcome.get("attempts"), "latency_ms": outcome.get("latency_ms"),
            "error": outcome.get("error")}


async def _health(client: aiohttp.ClientSession, url: str, timeout_s: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        async with client.get(url, allow_redirects=False, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            status = resp.status
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        return {"url": url, "ok": False, "http_status": None, "attempts": 1,
                "latency_ms": (time.perf_counter() - t0) * 1000, "error": f"{type(exc).__name__}: {exc}".rstrip(": ")}
    return {"url": url, "ok": 200 <= status < 300, "http_status": status, "attempts": 1,
            "latency_ms": (time.perf_counter() - t0) * 1000, "error": None if 200 <= status < 300 else f"HTTP {status}"}


class PassSignal:
    """Calls registered callbacks once, with the :class:`PreflightReport`, the moment the probe's last step
    succeeded (:meth:`StartedPreflight.when_passed`); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._report: PreflightReport | None = None
        self._callbacks: list[Callable[[PreflightReport], Any]] = []

    def add(self, callback: Callable[[PreflightReport], Any]) -> None:
        """Call ``callback(report)`` when the pre-flight passes; at once, in this thread, when it already has."""
        with self._lock:
            if self._report is None:
                self._callbacks.append(callback)
                return
            report = self._report
        callback(report)

    def fire(self, report: PreflightReport) -> None:
        """The pre-flight passed: call every callback in this thread, once (a second call does nothing; an error
        a callback raises is not the pre-flight's: it is dropped)."""
        with self._lock:
            if self._report is not None:  # fired already
                return
            self._report, callbacks, self._callbacks = report, self._callbacks, []
        for callback in callbacks:
            try:
                callback(report)
            except Exception:  # noqa: BLE001 - a caller's optimisation must not fail the pre-flight
                pass


async def _run(spec: ParticipantSpec, run_id: str, dataset: str, top_k: int,
               passed: PassSignal | None = None) -> PreflightReport:
    user_id = f"eval:{run_id}:{dataset}:{PROBE_SAMPLE}"
    report = PreflightReport(user_id=user_id)
    t0 = time.perf_counter()
    client = ParticipantClient(probe_spec(spec))

    def fail(step: str, url: str, cause: str, **kw: Any) -> PreflightFailed:
        report.wall_s = round(time.perf_counter() - t0, 3)
        return PreflightFailed(step, url, cause, report, **kw)

    try:
        if spec.health_url:  # unauthenticated GET, any 2xx (seed: "Authentication and Health")
            async with aiohttp.ClientSession() as plain:
                report.steps["health"] = step = await _health(plain, spec.health_url, probe_spec(spec).timeout_s)
            if not step["ok"]:
                raise fail("health", spec.health_url, step["error"])
        add = AddRequest(request_id=f"{user_id}:chunk-0", user_id=user_id, session_id=f"{user_id}:session-1",
                         messages=[{"role": "user", "timestamp": 1_700_000_000_000,
                                    "content": "aml-ray pre-flight probe: the probe's colour is teal."}])
        for step_name, url, call in (
                ("add", spec.add_url, lambda: client.add(add)),
                ("search", spec.search_url, lambda: client.search(
                    SearchRequest(query="What colour is the probe?", user_id=user_id, top_k=min(top_k, 10)),
                    ref=f"{user_id}:probe"))):
            try:
                outcome = await call()
            except ContractError as exc:
                report.steps[step_name] = {"url": url, "ok": False, "error": f"contract: field '{exc.field}': {exc.reason}"}
                raise fail(step_name, url, f"the reply breaks the AML contract: ContractError: field '{exc.field}': "
                           f"{exc.reason}", field=exc.field) from None
            except ParticipantError as exc:
                report.steps[step_name] = {"url": url, "ok": False, "http_status": exc.status, "error": str(exc)}
                raise fail(step_name, url, f"HTTP {exc.status} (not retried){': ' + exc.detail if exc.detail else ''}",
                           status=exc.status) from None
            report.steps[step_name] = _step(outcome, url)
            if outcome["status"] != "ok":
                hint = "" if outcome.get("http_status") else " (no HTTP reply: is the participant running and reachable there?)"
                raise fail(step_name, url, (outcome["error"] or "failed") + hint)
        if passed is not None:  # before this client closes: the run's head start sends at once
            report.wall_s = round(time.perf_counter() - t0, 3)
            passed.fire(report)
    finally:
        await client.aclose()
    report.wall_s = round(time.perf_counter() - t0, 3)
    return report


def preflight(spec: ParticipantSpec, *, run_id: str, dataset: str, top_k: int = 100,
              passed: PassSignal | None = None) -> PreflightReport:
    """Check the participant before any Add of the run: health (when ``spec.health_url``), one Add, one Search.

    The Search must be a valid reply (any number of items up to Top K); whether it finds the probe is
    not required here (read-your-write is a conformance check: ``aml-ray check``).

    Args:
        spec: the participant version (its secret stays in the client's headers, never in the report).
        run_id / dataset: name the probe's user_id.
        top_k: the run's Top K (the probe asks for at most 10).
        passed: fired with the report the moment the last step succeeded, before the probe's client is
            closed (:meth:`StartedPreflight.when_passed`).

    Returns:
        The :class:`PreflightReport` (for run.json).

    Raises:
        PreflightFailed: naming the step, the URL and the cause, after at most
            :data:`PREFLIGHT_RETRY` ``.max_attempts`` attempts per request.
    """
    return asyncio.run(_run(spec, run_id, dataset, top_k, passed))


@dataclass(frozen=True)
class StartedPreflight:
    """A pre-flight under way in a thread of its own (:func:`start_preflight`).

    Attributes:
        run_id / dataset: the run it probes for (they name its user_id): :func:`aml_ray.run.evaluation.evaluate`
            refuses one started for another run.
        future: resolves to the :class:`PreflightReport`, or raises :class:`PreflightFailed`.
        passed: the :class:`PassSignal` its thread fires when it passed (:meth:`when_passed`).
    """

    run_id: str
    dataset: str
    future: Future
    passed: PassSignal = field(default_factory=PassSignal)

    def result(self) -> PreflightReport:
        """Wait for the pre-flight; raises :class:`PreflightFailed` as :func:`preflight` does."""
        return self.future.result()

    def when_passed(self, callback: Callable[[PreflightReport], Any]) -> None:
        """Call ``callback(report)`` once the pre-flight passed, never when it fails.

        It runs in the pre-flight's thread, inside its event loop, the moment the probe's Search returned
        and was checked, before the probe's client is closed and its thread ends (the future's own
        callbacks come after both), or at once in the calling thread when it already passed. It must
        return quickly (hand work to another thread); an error it raises is dropped.
        """
        self.passed.add(callback)


def start_preflight(spec: ParticipantSpec, *, run_id: str, dataset: str, top_k: int = 100) -> StartedPreflight:
    """Start :func:`preflight` in a thread of its own and return at once.

    Its round trips (a few hundred milliseconds against a participant that serves one request at a time)
    go beside whatever the caller does next: ``aml-ray run`` starts it once its options and dataset are
    checked, before it imports the evaluation's modules (about 0.4 s of CPU), and
    :func:`aml_ray.run.evaluation.evaluate` waits for it before the run's first Add.

    Args and errors: as :func:`preflight` (raised by :meth:`StartedPreflight.result`).
    """
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aml-ray-preflight")
    passed = PassSignal()
    try:
        future = pool.submit(preflight, spec, run_id=run_id, dataset=dataset, top_k=top_k, passed=passed)
        # fired already by the probe's coroutine; this covers a pre-flight function that does not fire it
        future.add_done_callback(lambda f: None if f.cancelled() or f.exception() else passed.fire(f.result()))
        return StartedPreflight(run_id, dataset, future, passed)
    finally:
        pool.shutdown(wait=False)
