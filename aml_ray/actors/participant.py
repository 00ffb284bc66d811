"""ParticipantClient: the one owner of HTTP traffic to a participant version's Add/Search endpoints.

:class:`ParticipantClient` is a plain class (tested directly) that runs as a Ray actor, one per
participant version (:func:`spawn_participant_client`), so the version's declared capacity (max in-flight
requests, requests/s) holds across every stage and job that calls it. Callers send work in batches
(one actor call per sample's Adds or per batch of Searches), never one call per row.

Capacity: ``max_in_flight`` sender tasks (:meth:`ParticipantClient._sender`) each send one attempt at a
time, taken from a :class:`aml_ray.actors.fair.FairQueue` where Adds go before Searches; a declared
``requests_per_s`` is held by an aiolimiter bucket in front of each send. A batch of Searches is queued
at once and its replies are checked without a task per Search (:class:`_SearchBatch`).

Transport: aiohttp's client directly: of the HTTP clients measured against a loopback participant it
had the highest rate and the least CPU per request, and on 2 cores shared with the pipeline's other
processes the CPU is what runs out (docs/benchmarks.md, "HTTP client"), so the hot path speaks aiohttp. It also builds a tenacity retry loop only when the
first attempt failed (the loop then replays that failure, so attempts, waits and Retry-After are
unchanged).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from typing import TYPE_CHECKING, Any, Literal

import aiohttp
from aiolimiter import AsyncLimiter
from yarl import URL
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from aml_ray.actors.adaptive import AdaptiveLimit
from aml_ray.actors.fair import FairQueue
from aml_ray.contract import (
    AddRequest,
    ContractError,
    SearchRequest,
    search_memories,
    validate_add_response,
)
from aml_ray.security import PinnedResolver
from aml_ray.media import MediaLimits, MediaStore, media_context, memories_to_evidence
from aml_ray.run.ray_runtime import tune_actor_process, use_arrow_ipc_serialization
from aml_ray.retry import ADD_RETRY_STATUSES, SEARCH_RETRY_STATUSES, RetryPolicy, TransientError, parse_retry_after

if TYPE_CHECKING:  # pyarrow is imported where a table is built: the pre-flight, which needs none, starts sooner
    import pyarrow as pa

AuthScheme = Literal["none", "Token", "Bearer", "X-Api-Key"]
#: Seed: "One request may run for up to 30 minutes."
DEFAULT_TIMEOUT_S = 1800.0
#: Send priorities (:class:`aml_ray.actors.fair.FairQueue`: lower is sent sooner).
_ADD_FIRST, _SEARCH_AFTER = 0, 1


class ParticipantSpec(BaseModel):
    """A participant version's endpoints, auth and declared capacity.

    Attributes:
        add_url / search_url: the Add and Search endpoints (POST).
        health_url: optional unauthenticated GET; any 2xx is healthy.
        add_status_url: optional bound Add-status URL template containing ``{task_id}`` (enables 202).
        auth: ``none`` | ``Token`` | ``Bearer`` | ``X-Api-Key`` (seed: "Authentication and Health").
        secret: the Memory System Key; never logged, never in evidence or errors.
        max_in_flight: most concurrent requests to this version (declared capacity).
        requests_per_s: request rate limit (declared capacity); None for unlimited.
        timeout_s: per-attempt timeout in seconds (default 1,800 s: the seed's 30 minutes).
        retry: the bounded backoff policy.
        media: the Multimodal suite's media limits (set by the evaluation for a multimodal dataset);
            None keeps requests and Search results strings-only (Textual, Coding).
        adaptive_concurrency: True (default): the requests in flight follow the participant's latency,
            between 1 and ``max_in_flight`` (:class:`aml_ray.actors.adaptive.AdaptiveLimit`), so a
            participant that serves one request at a time is not sent 64 to queue; False: always
            ``max_in_flight`` once there is work for them.
        pinned_addresses: ``{host name: addresses checked at validation}``
            (:func:`aml_ray.security.pin_map`): the client connects only to these, never resolving a
            name again (DNS pinning, :class:`aml_ray.security.PinnedResolver`); None (a local run of an
            operator's own URLs) resolves names with aiohttp's default resolver.
    """

    model_config = ConfigDict(frozen=True)

    add_url: str
    search_url: str
    health_url: str | None = None
    add_status_url: str | None = None
    auth: AuthScheme = "none"
    secret: SecretStr | None = None
    max_in_flight: int = Field(default=64, ge=1, le=4096)
    requests_per_s: float | None = Field(default=None, gt=0)
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    retry: RetryPolicy = RetryPolicy()
    media: MediaLimits | None = None
    adaptive_concurrency: bool = True
    pinned_addresses: dict[str, tuple[str, ...]] | None = None

    @field_validator("add_url", "search_url", "health_url", "add_status_url")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError(f"must be an http(s) URL, got {v!r}")
        return v

    def model_post_init(self, _ctx: Any) -> None:
        if self.auth != "none" and (self.secret is None or not self.secret.get_secret_value()):
            raise ValueError(f"auth={self.auth!r} needs a secret (pass --secret-env VAR naming the variable "
                             "that holds the Memory System Key)")

    def auth_headers(self) -> dict[str, str]:
        """Headers for the declared scheme (secret included: never log the result)."""
        if self.auth == "none" or self.secret is None:
            return {}
        value = self.secret.get_secret_value()
        if self.auth == "X-Api-Key":
            return {"X-Api-Key": value}
        return {"Authorization": f"{self.auth} {value}"}

    def describe(self) -> dict[str, Any]:
        """A secret-free description for run.json."""
        return {"add_url": self.add_url, "search_url": self.search_url, "health_url": self.health_url,
                "auth": self.auth, "max_in_flight": self.max_in_flight,
                "requests_per_s": self.requests_per_s, "timeout_s": self.timeout_s,
                "adaptive_concurrency": self.adaptive_concurrency}


class ParticipantError(Exception):
    """A permanent (non-retryable) HTTP failure: 400/401/403/404/422, Search 409, or another status.

    It stops the stage, like a contract error (seed error table: "Not retried").

    Args:
        stage: ``"add"`` or ``"search"``.
        status: the HTTP status.
        request_id: the platform request id (a Search's: its question ref).
        detail: the start of the participant's reply, with the secret redacted.
        outcome: the request's outcome for its evidence row, as :class:`aml_ray.contract.ContractError`'s
            (``status="error"``, ``contract`` None), set by :class:`ParticipantClient`; None otherwise.
    """

    def __init__(self, stage: str, status: int, request_id: str, detail: str = "",
                 outcome: dict[str, Any] | None = None):
        self.stage, self.status, self.request_id, self.detail = stage, status, request_id, detail
        self.outcome = outcome
        super().__init__(f"{stage} {request_id}: HTTP {status} is not retried (see the AML error table): "
                         f"{detail}")

    def __reduce__(self):  # keeps every field (outcome included) across a Ray process boundary
        return (ParticipantError, (self.stage, self.status, self.request_id, self.detail, self.outcome))


def body_bytes(payload: dict[str, Any]) -> bytes:
    """The exact JSON bytes sent (UTF-8, no ASCII escaping); a retry resends these bytes."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def _text(raw: bytes) -> str:
    """A reply body as text for error messages (UTF-8, undecodable bytes replaced)."""
    return raw.decode("utf-8", errors="replace")


def request_hash(data: bytes) -> str:
    """sha256 hex of the request body bytes (recorded in evidence)."""
    return hashlib.sha256(data).hexdigest()


class ParticipantClient:
    """Async HTTP client for one participant version; run as a Ray actor by :func:`spawn_participant_client`.

    The class itself needs no Ray, so its behaviour is tested directly.

    Args:
        spec: endpoints, auth, capacity and retry policy.
        in_actor: tune this process as a hot-path Ray actor (:func:`aml_ray.run.ray_runtime.tune_actor_process`);
            set by :func:`spawn_participant_client` for the Ray actor, never for a local client.
        lone_latencies: endpoint URL -> its latency in ms, measured with nothing else in flight before this
            client's first request (the run's pre-flight probe, :meth:`aml_ray.run.preflight.PreflightReport.lone_latencies`):
            each endpoint sends no probe of its own (:meth:`AdaptiveLimit.seed`), and the limit starts at
            2, the step slow start takes after its first window at 1 (which measures just these latencies).
            None: the limit starts at 1 and each endpoint's first request goes alone.
        held_back: in-flight slots kept from the start for another client's requests, as :meth:`hold_back`
            keeps them: the shared client of a joined cluster whose first Adds a driver's head start sends
            (:mod:`aml_ray.actors.shared`, the head-start grant) is made holding all of them, so no other
            job's request goes until that head start's handover (:meth:`hold_back`, :meth:`give_back`).

    Each method returns an outcome dict for evidence; a :class:`ContractError` or
    :class:`ParticipantError` is raised (and stops the stage), carrying the outcome of the request it
    stopped as its ``outcome`` (:meth:`_stopped`), so the stage can write that request's evidence row. A
    transient failure that exhausts its retries gives an outcome with ``status="error"``.
    """

    def __init__(self, spec: ParticipantSpec, *, in_actor: bool = False,
                 lone_latencies: dict[str, float] | None = None, held_back: int = 0):
        if in_actor:  # the Ray actor (spawn_participant_client): it times the participant's calls
            tune_actor_process()
            use_arrow_ipc_serialization()  # search_table's columns cross the object store as one IPC stream
        self.spec = spec
        self._client: aiohttp.ClientSession | None = None
        # attempts waiting to be sent: (url, body, reply, perf_counter when queued)
        self._queue: FairQueue[tuple[URL, bytes, asyncio.Future, float]] | None = None
        self._senders: list[asyncio.Task] = []  # max_in_flight tasks, each sends one attempt at a time
        # how many of the senders may send now; senders at or above it wait in _parked
        self.limit = AdaptiveLimit(spec.max_in_flight, enabled=spec.adaptive_concurrency,
                                   initial=2 if lone_latencies else 1)
        self._parked: dict[int, asyncio.Future] = {}
        self._held_back = max(0, held_back)  # slots kept for another client's requests in flight (hold_back)
        # lone replies (AdaptiveLimit.record's ``alone``): requests in flight now, requests sent so far, and
        # the probe out now (an endpoint's first request sent alone: AdaptiveLimit.wants_probe), done when
        # its reply is back; _drained is done when nothing is in flight (awaited by a probe's sender)
        self._in_flight = 0
        self._sends = 0
        self._probe: asyncio.Future | None = None
        self._drained: asyncio.Future | None = None
        self._limiter: AsyncLimiter | None = None
        # endpoint -> its parsed URL: aiohttp parses a str URL on every request (a URL object measured
        # cheaper: docs/benchmarks.md)
        self._targets: dict[str, URL] = {}
        if lone_latencies:
            self.seed(lone_latencies)
        self._stream_owner: dict[tuple, str] = {}  # (sample, user_id) -> token of the newest add_stream call
        self._acknowledged: dict[str, dict[str, Any]] = {}  # request_id -> outcome of its acknowledged Add

    def seed(self, lone_latencies: dict[str, float]) -> None:
        """Take ``lone_latencies`` (endpoint URL -> ms, measured alone: the class's ``lone_latencies``) before this
        client's first request: each endpoint sends no probe of its own and the limit starts at 2. For a
        client made before the pre-flight ended (:class:`aml_ray.run.head_start.HeadStart`); call it from
        the client's event loop, before its first request."""
        for url, latency_ms in lone_latencies.items():
            self.limit.seed(self._target(url), latency_ms)
        if lone_latencies:
            self.limit.start_at(2)
            if self._parked:  # senders already waiting at the limit of 1 (open): the second may send now
                self._unpark()

    def open(self) -> None:
        """Make the connection pool and the senders now, in the running event loop, instead of at the first
        request (which then has less to do)."""
        self._ensure()

    def _ensure(self) -> aiohttp.ClientSession:
        # Created lazily inside the running event loop (aiohttp sessions bind to their loop).
        if self._client is None:
            n = self.spec.max_in_flight
            self._client = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=n, limit_per_host=n, resolver=PinnedResolver(
                    self.spec.pinned_addresses) if self.spec.pinned_addresses is not None else None),
                timeout=aiohttp.ClientTimeout(total=self.spec.timeout_s),
                headers={"Content-Type": "application/json", **self.spec.auth_headers()},
            )
            self._queue = FairQueue()
            self._senders = [asyncio.get_running_loop().create_task(self._sender(i)) for i in range(n)]
            if self.spec.requests_per_s:
                rate = self.spec.requests_per_s
                # Burst of max(1, rate/10) tokens per 1/10 s keeps the rate smooth (aiolimiter's bucket).
                self._limiter = AsyncLimiter(max(1.0, rate / 10), 0.1 if rate >= 10 else 1.0 / rate)
        return self._client

    async def aclose(self) -> None:
        """Stop the senders and close the connection pool."""
        for task in self._senders:
            task.cancel()
        await asyncio.gather(*self._senders, return_exceptions=True)
        self._senders = []
        self._parked.clear()
        self._in_flight, self._probe, self._drained = 0, None, None
        if self._client is not None:
            await self._client.close()
            self._client = None

    def _redact(self, text: str) -> str:
        secret = self.spec.secret.get_secret_value() if self.spec.secret else ""
        return text.replace(secret, "***") if secret else text

    def concurrency(self) -> dict[str, Any]:
        """The in-flight limit's trajectory so far (:meth:`aml_ray.actors.adaptive.AdaptiveLimit.describe`), with
        ``unloaded_ms``: ``{"add": ms, "search": ms}``, each endpoint's unloaded latency as the limit reads it
        (:meth:`~aml_ray.actors.adaptive.AdaptiveLimit.unloaded_ms`, rounded to 0.1 ms; an endpoint with no
        reply yet, or a limit that is not adaptive, left out). A request's ``latency_ms`` is its time at the
        participant, queueing there behind this client's other requests included: at a participant that serves
        one request at a time, with two in flight, about twice its unloaded latency."""
        unloaded = self.limit.unloaded_ms()
        endpoints = (("add", self.spec.add_url), ("search", self.spec.search_url))
        return {**self.limit.describe(), "unloaded_ms": {
            name: round(unloaded[self._target(url)], 1) for name, url in endpoints if self._target(url) in unloaded}}

    def hold_back(self, n: int, lone_latencies: dict[str, float] | None = None, limit: int | None = None) -> None:
        """Keep ``n`` of the in-flight slots for requests another client of this participant version still has
        out: the driver's head start at its handover (:func:`aml_ray.run.pipeline.run_pipeline`), whose
        samples the Ingest stage takes over one by one as each one's last Add returns. The two clients
        together then never have more than the declared ``max_in_flight`` out. :meth:`give_back` returns the
        slots one at a time, as those requests end.

        Args:
            n: requests the other client has out, or may still send (at most one per sample it is adding to).
            lone_latencies: that client's lone latencies (the pre-flight probe's): they seed the endpoints
                with no baseline yet (:meth:`AdaptiveLimit.seed`), whose first request would otherwise go
                as a probe while the other client's requests are still queued at the participant.
            limit: that client's in-flight limit now, this one's start (:meth:`AdaptiveLimit.start_at`).
        """
        self._held_back = max(0, n)
        for url, latency_ms in (lone_latencies or {}).items():
            if self.limit.wants_probe(self._target(url)):
                self.limit.seed(self._target(url), latency_ms)
        if limit is not None:
            self.limit.start_at(limit)
        if self._parked:
            self._unpark()

    def give_back(self, n: int = 1) -> None:
        """Return ``n`` slots kept by :meth:`hold_back` (the other client's requests ended)."""
        self._held_back = max(0, self._held_back - n)
        if self._parked:
            self._unpark()

    def _slots(self) -> int:
        """Senders that may send now: the adaptive limit less the slots held back (:meth:`hold_back`)."""
        return self.limit.allowed() - self._held_back

    def _unpark(self) -> None:
        """Wake the parked senders the limit now allows (index below :meth:`_slots`)."""
        allowed = self._slots()
        for index in [i for i in self._parked if i < allowed]:
            waiter = self._parked.pop(index)
            if not waiter.done():
                waiter.set_result(None)

    async def _sender(self, index: int = 0) -> None:
        """One of ``max_in_flight`` tasks: take the next attempt from the queue, send it, hand back the reply.

        Why senders and not a semaphore around each request: a freed semaphore slot wakes a waiting task,
        which sends on a later turn of the event loop (measured: a few percent of each slot's cycle lost
        between grant and send; docs/benchmarks.md), whereas a sender whose reply has arrived sends the next
        queued attempt in the same step, as a plain client loop does. The queue gives Adds before
        Searches (:class:`aml_ray.actors.fair.FairQueue`): a sample's Adds gate all of its Searches.

        Sender ``index`` sends only while ``index`` is below the adaptive limit (:attr:`limit`); above it,
        it parks until the limit grows. The time an attempt waited for its slot (queued, parked senders,
        the rate limiter) is handed back apart from its time at the participant.
        """
        assert self._client is not None and self._queue is not None
        client, queue, limit = self._client, self._queue, self.limit
        loop = asyncio.get_running_loop()
        while True:
            if index >= self._slots():
                waiter = self._parked[index] = loop.create_future()
                await waiter
                continue
            url, data, reply, queued = await queue.get()
            # slots held back (hold_back) while this sender waited for work: the attempt waits here, so that
            # with another client's requests out the two never exceed the declared limit (a limit that fell
            # meanwhile only takes effect at the next attempt, as before: no attempt is held behind later ones)
            while self._held_back and index >= self._slots():
                waiter = self._parked[index] = loop.create_future()
                await waiter
            if reply.done():  # its caller was cancelled while it waited
                continue
            if self._limiter is not None:
                await self._limiter.acquire()
            probe = await self._await_turn(url) if self._probe is not None or limit.wants_probe(url) else None
            if reply.done():  # its caller was cancelled while a probe was out
                if probe is not None:
                    self._end_probe(probe)
                continue
            alone_at_send = self._in_flight == 0
            self._in_flight += 1
            # the limit filled (this client's slots all in use): only such replies may raise it (AdaptiveLimit)
            at_limit = self._in_flight >= self._slots()
            self._sends += 1
            send_number = self._sends
            t0 = time.perf_counter()
            try:
                async with client.post(url, data=data, allow_redirects=False) as resp:
                    status = resp.status
                    raw = await resp.read()
                    retry_after = resp.headers.get("Retry-After")
            except asyncio.CancelledError:  # aclose(): the caller's wait ends too
                reply.cancel()
                raise
            except Exception as exc:  # handed to the caller, which decides what is transient
                if not reply.done():
                    reply.set_exception(exc)
                continue
            finally:
                self._sent_back(probe)
            latency_ms = (time.perf_counter() - t0) * 1000
            limit.record(url, latency_ms, alone=alone_at_send and self._sends == send_number, at_limit=at_limit)
            if self._parked:
                self._unpark()
            if not reply.done():
                reply.set_result((status, raw, retry_after, latency_ms, (t0 - queued) * 1000))

    async def _await_turn(self, url: URL) -> asyncio.Future | None:
        """Wait while another sender's probe is out; if ``url``'s endpoint wants one, become the probe.

        A probe (:meth:`AdaptiveLimit.wants_probe`: the endpoint has no lone reply yet) is sent once
        nothing else is in flight, and no other request is sent until its reply: its latency is the
        endpoint's unloaded one. Returns the probe's future (resolved by :meth:`_sent_back`), or None.
        """
        loop = asyncio.get_running_loop()
        while self._probe is not None:
            await asyncio.shield(self._probe)
        if not self.limit.wants_probe(url):
            return None
        probe = self._probe = loop.create_future()
        try:
            while self._in_flight:
                if self._drained is None or self._drained.done():
                    self._drained = loop.create_future()
                await asyncio.shield(self._drained)
        except BaseException:  # aclose() while draining: the other senders must not wait on it
            self._end_probe(probe)
            raise
        return probe

    def _end_probe(self, probe: asyncio.Future) -> None:
        if self._probe is probe:
            self._probe = None
        if not probe.done():
            probe.set_result(None)

    def _sent_back(self, probe: asyncio.Future | None) -> None:
        """One request's reply (or failure) is back: count it out, and end the probe if it was one."""
        self._in_flight -= 1
        if not self._in_flight and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        if probe is not None:
            self._end_probe(probe)

    def _target(self, url: str) -> URL:
        return self._targets.get(url) or self._targets.setdefault(url, URL(url))

    def _check_reply(self, status: int, raw: bytes, retry_after: str | None, retry_statuses: frozenset[int],
                     stage: str, rid: str) -> None:
        """Raise for a reply that is not a success: TransientError for a retried status, else ParticipantError.

        Retry sets from the AML error table (:data:`aml_ray.retry.ADD_RETRY_STATUSES`,
        :data:`aml_ray.retry.SEARCH_RETRY_STATUSES`); the detail quoted from the body has the secret redacted.
        """
        if status in retry_statuses:
            raise TransientError(f"HTTP {status}", status, parse_retry_after(retry_after))
        if status not in (200, 202):
            raise ParticipantError(stage, status, rid, self._redact(_text(raw)[:300]))

    @staticmethod
    def _transport_error(exc: BaseException) -> BaseException:
        """A send's exception as the caller sees it: timeouts and refused/dropped connections are transient."""
        if isinstance(exc, (aiohttp.ClientError, asyncio.TimeoutError)) and not isinstance(exc, aiohttp.InvalidURL):
            return TransientError(type(exc).__name__)
        return exc

    async def _attempt(self, url: str, data: bytes, retry_statuses: frozenset[int], stage: str,
                       rid: str) -> tuple[int, bytes, float, float]:
        """One attempt: ``(status, body, latency_ms at the participant, queue_ms waiting for a slot)``."""
        self._ensure()
        assert self._queue is not None
        reply: asyncio.Future = asyncio.get_running_loop().create_future()
        item = (self._target(url), data, reply, time.perf_counter())
        priority = _ADD_FIRST if stage == "add" else _SEARCH_AFTER
        self._queue.put("", item, priority)
        try:
            status, raw, retry_after, latency_ms, queue_ms = await reply
        except asyncio.CancelledError:
            self._queue.remove("", item, priority)  # not sent yet: it never will be
            raise
        except Exception as exc:
            error = self._transport_error(exc)
            if error is exc:
                raise
            raise error from None
        try:
            self._check_reply(status, raw, retry_after, retry_statuses, stage, rid)
        except TransientError as exc:  # its wait for a slot counts in the request's queue_ms (_retry)
            exc.queue_ms = queue_ms
            raise
        except ParticipantError as exc:  # completed into the request's outcome by _stopped
            exc.outcome = {"http_status": status, "latency_ms": latency_ms, "queue_ms": queue_ms}
            raise
        return status, raw, latency_ms, queue_ms

    def _stopped(self, exc: ContractError | ParticipantError, outcome: dict[str, Any],
                 t0: float | None = None) -> ContractError | ParticipantError:
        """The error that stops the run, with the outcome of the request it stopped attached (``.outcome``).

        Args:
            exc: the error; its own ``outcome`` (the failing attempt's ``http_status`` and ``latency_ms``,
                when :meth:`_attempt` raised it) overrides ``outcome``'s.
            outcome: the request's outcome so far (:meth:`_outcome`, updated by the attempts).
            t0: ``time.perf_counter()`` when the request was first queued, to set ``elapsed_ms``; None
                keeps the outcome's.

        Returns:
            A copy of ``exc`` whose reason or detail has the secret redacted, its ``outcome`` the evidence
            row's fields: ``status`` ``contract_error`` (ContractError) or ``error`` (ParticipantError),
            ``contract`` ``"<field>: <reason>"`` or None, ``error`` the message; no reply body, no memories.
        """
        full = {**outcome, **(exc.outcome or {})}
        full.pop("raw", None)
        full.pop("memories", None)
        if t0 is not None:
            full["elapsed_ms"] = (time.perf_counter() - t0) * 1000
        stopped: ContractError | ParticipantError
        if isinstance(exc, ContractError):
            stopped = ContractError(exc.field, self._redact(exc.reason), exc.request_id)
            full.update(status="contract_error", contract=f"{stopped.field}: {stopped.reason}")
        else:
            stopped = ParticipantError(exc.stage, exc.status, exc.request_id, self._redact(exc.detail))
            full.update(status="error", contract=None)
        full["error"] = str(stopped)
        stopped.outcome = full
        return stopped

    @staticmethod
    def _outcome(rid: str, data: bytes) -> dict[str, Any]:
        return {"request_id": rid, "request_sha256": request_hash(data), "attempts": 1, "retried_statuses": [],
                "http_status": None, "latency_ms": None, "queue_ms": 0.0, "status": "error", "error": None}

    async def _call(self, url: str, payload: dict[str, Any], retry_statuses: frozenset[int], stage: str,
                    rid: str) -> dict[str, Any]:
        data = body_bytes(payload)
        outcome = self._outcome(rid, data)
        t0 = time.perf_counter()
        try:
            # Fast path: most requests succeed at once, so the retry loop is only built after a failure.
            status, raw, latency, queued = await self._attempt(url, data, retry_statuses, stage, rid)
        except TransientError as exc:
            return await self._retry(url, data, retry_statuses, stage, outcome, exc, t0)
        except ParticipantError as exc:
            raise self._stopped(exc, outcome, t0) from None
        outcome.update(http_status=status, latency_ms=latency, queue_ms=queued, status="ok", raw=raw)
        outcome["elapsed_ms"] = (time.perf_counter() - t0) * 1000
        return outcome

    async def _retry(self, url: str, data: bytes, retry_statuses: frozenset[int], stage: str,
                     outcome: dict[str, Any], first: TransientError, t0: float) -> dict[str, Any]:
        """Retry a request whose first attempt failed transiently, with the same bytes, by the spec's policy.

        Args:
            outcome: the request's outcome dict (:meth:`_outcome`), updated in place and returned.
            first: the first attempt's failure; tenacity's loop replays it, so its wait and Retry-After
                apply as for any later failure.
            t0: ``time.perf_counter()`` when the request was first queued (``elapsed_ms``).

        Returns:
            ``outcome``: ``status="ok"`` with ``raw`` (the reply body), or ``status="error"`` with ``error``
            once the policy gave up.

        Raises:
            ParticipantError: a retry got a status that is not retried (with ``outcome``: :meth:`_stopped`).
        """
        rid = outcome["request_id"]
        outcome["queue_ms"] += getattr(first, "queue_ms", 0.0)
        outcome["retried_statuses"].append(first.status or 0)
        outcome["http_status"] = first.status
        replay: TransientError | None = first
        try:
            async for attempt in self.spec.retry.retrying():
                with attempt:
                    if replay is not None:  # replay the first failure: tenacity then waits as usual
                        failed, replay = replay, None
                        raise failed
                    outcome["attempts"] += 1
                    try:
                        status, raw, latency, queued = await self._attempt(url, data, retry_statuses, stage, rid)
                    except TransientError as again:
                        outcome["queue_ms"] += getattr(again, "queue_ms", 0.0)
                        outcome["retried_statuses"].append(again.status or 0)
                        outcome["http_status"] = again.status
                        raise
        except ParticipantError as exc:
            raise self._stopped(exc, outcome, t0) from None
        except TransientError as last:
            outcome["error"] = f"gave up after {outcome['attempts']} attempts: {last.reason}"
            outcome["elapsed_ms"] = (time.perf_counter() - t0) * 1000
            return outcome
        outcome.update(http_status=status, latency_ms=latency, status="ok", raw=raw)
        outcome["queue_ms"] += queued
        outcome["elapsed_ms"] = (time.perf_counter() - t0) * 1000
        return outcome

    async def add(self, request: AddRequest, *, resend: bool = False) -> dict[str, Any]:
        """Send one Add (retrying transient failures with the same bytes) and validate the reply.

        An Add this client already had acknowledged (same request_id, same body) is not sent again: its
        outcome is returned (idempotency on the platform side; the participant de-duplicates too).
        ``resend=True`` sends it anyway (the conformance check tests the participant's own de-duplication).

        Returns:
            Outcome dict: request_id, request_sha256, status ("ok"|"error"), http_status, attempts,
            retried_statuses, latency_ms (last attempt), elapsed_ms (with backoff), error.

        Raises:
            ContractError: the 200/202 reply breaks the contract.
            ParticipantError: a non-retryable status, or a 202 whose task failed or never completed.
            Either carries the Add's outcome as ``outcome`` (``status`` ``contract_error`` or ``error``,
            ``contract``; :meth:`_stopped`), the secret redacted.
        """
        rid = request.request_id
        payload = request.model_dump(exclude_none=True)
        done = self._acknowledged.get(rid)
        if not resend and done is not None and done["request_sha256"] == request_hash(body_bytes(payload)):
            # This client already had this exact Add acknowledged (a stage re-executed after its worker
            # died asks again): return that outcome instead of sending it a second time.
            return dict(done)
        out = await self._call(self.spec.add_url, payload, ADD_RETRY_STATUSES, "add", rid)
        raw = out.pop("raw", None)
        if out["status"] == "ok":
            try:
                try:
                    body = json.loads(raw)
                except ValueError:
                    raise ContractError("body", f"HTTP {out['http_status']} body is not valid JSON: "
                                        f"{self._redact(_text(raw)[:120])!r}", rid) from None
                task_id = validate_add_response(request, out["http_status"], body,
                                                add_status_url=self.spec.add_status_url)
                if task_id is not None:
                    await self._poll_add_status(rid, task_id)
            except (ContractError, ParticipantError) as exc:
                raise self._stopped(exc, out) from None
            self._acknowledged[rid] = dict(out)
        return out

    async def _poll_add_status(self, rid: str, task_id: str, *, interval_s: float = 0.5) -> None:
        """Poll the bound Add-status URL until ``{"status": "completed"}`` (or fail on ``"failed"``).

        The status body shape is the platform's: ``{"status": "pending"|"running"|"completed"|"failed"}``.
        """
        assert self.spec.add_status_url is not None
        url = self.spec.add_status_url.replace("{task_id}", task_id)
        deadline = time.monotonic() + self.spec.timeout_s
        client = self._ensure()
        while time.monotonic() < deadline:
            async with client.get(url, allow_redirects=False) as resp:
                code = resp.status
                state = json.loads(await resp.read()).get("status") if code == 200 else None
            if state == "completed":
                return
            if state == "failed":
                raise ParticipantError("add", code, rid, f"Add task {task_id} failed")
            await asyncio.sleep(interval_s)
        raise ParticipantError("add", 408, rid, f"Add task {task_id} did not complete in {self.spec.timeout_s} s")

    async def add_in_order(self, requests: list[AddRequest]) -> list[dict[str, Any]]:
        """Send one sample's Adds strictly in order (the next starts after the previous returned)."""
        return [await self.add(r) for r in requests]

    async def search(self, request: SearchRequest, ref: str) -> dict[str, Any]:
        """Send one Search and validate the reply.

        Args:
            request: the Search body.
            ref: the platform's question reference (evidence and error messages).

        Returns:
            Outcome dict as :meth:`add`, plus ``memories``: list of ``{id, content, score, created_at}``
            in participant order (empty on error).

        Raises:
            ContractError, ParticipantError: as :meth:`add` (``outcome.request_id`` is ``ref``).
        """
        return (await self.search_many([(request, ref)]))[0]

    async def search_many(self, requests: list[tuple[SearchRequest, str]]) -> list[dict[str, Any]]:
        """Run many Searches concurrently (bounded by ``max_in_flight``); outcomes as :meth:`search`, in input order.

        The first :class:`ContractError` or :class:`ParticipantError` fails the whole call; the batch's
        Searches not yet sent are then never sent (:class:`_SearchBatch`).
        """
        if not requests:
            return []
        self._ensure()
        return await _SearchBatch(self, requests).run()

    def _memories(self, raw: bytes, status: int, request: SearchRequest, ref: str) -> list[dict[str, Any]]:
        """A successful Search reply's memories (:func:`aml_ray.contract.search_memories`), the secret redacted from errors."""
        try:
            return search_memories(raw, status, request, request_id=ref, media=self.spec.media)
        except ContractError as exc:  # the reason may quote the body: never the secret
            raise ContractError(exc.field, self._redact(exc.reason), exc.request_id) from None

    # Batch entry points for actor calls: one call per sample / per batch of questions.
    async def add_sample(self, requests: list[dict[str, Any]], sample: str | None = None,
                         token: str | None = None) -> list[dict[str, Any]]:
        """Adds of one sample, in order, in one plain actor call; their outcomes as a list, in order.

        Every request is validated before the first is sent. The pipeline's Ingest stage sends a
        segment of one Add this way (:meth:`add_stream` for more): a Ray streaming call costs the client
        actor more CPU than a plain one for a single Add (measured: docs/benchmarks.md).

        Args:
            requests: AddRequest dicts, in order.
            sample / token: as :meth:`add_stream` (this call takes the sample over from an older stream,
                and stops before its next Add if a newer call takes it over); None: no such guard.

        Returns:
            One outcome per Add sent (as :meth:`add`); fewer than ``requests`` only when taken over.
        """
        checked = [self._add_request(r) for r in requests]
        user_id = checked[0].user_id if checked else None
        return [outcome async for outcome in self._owned_adds(checked, user_id, sample, token)]

    def _add_request(self, body: dict[str, Any]) -> AddRequest:
        """An AddRequest dict validated for this run's track (content parts only with media limits)."""
        return AddRequest.model_validate(body, context=media_context(self.spec.media))

    async def add_stream(self, requests: list[dict[str, Any]], sample: str | None = None,
                         token: str | None = None):
        """Adds of one sample, in order, yielding each outcome as soon as it is known.

        Called as a Ray streaming generator (one actor call per sample segment of several Adds): the
        caller journals every finished Add, so a resumed run never sends a finished Add again. Each
        request is validated just before it is sent.

        Args:
            requests: AddRequest dicts, in order.
            sample / token: the sample and a token unique to this call. A later call for the same sample
                (the stage re-executed after its worker died) takes over: this stream stops before its
                next Add, so the sample's Adds are not sent twice by two streams. The sample is told
                apart by its user_id too (which holds the run id): jobs sharing this client (one per
                version, :mod:`aml_ray.actors.shared`) may run the same dataset's sample at once.
        """
        user_id = requests[0].get("user_id") if requests else None
        async for outcome in self._owned_adds((self._add_request(r) for r in requests), user_id, sample, token):
            yield outcome

    async def _owned_adds(self, checked, user_id: str | None, sample: str | None, token: str | None):
        """Send ``checked`` (AddRequests, in order) while this call owns the sample; yield each outcome.

        The owner key is ``(sample, user_id)`` (the first Add's user_id, :meth:`add_stream`).
        """
        owner = (sample, user_id)
        guarded = sample is not None and token is not None
        if guarded:
            self._stream_owner[owner] = token
        for request in checked:
            if guarded and self._stream_owner.get(owner) != token:
                return
            yield await self.add(request)

    async def search_batch(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A batch of Searches; each item is ``{"ref": str, "request": SearchRequest dict}``."""
        ctx = media_context(self.spec.media)
        return await self.search_many([(SearchRequest.model_validate(i["request"], context=ctx), i["ref"])
                                       for i in items])

    async def search_table(self, items: list[dict[str, Any]], media_root: str | None = None) -> pa.Table:
        """A batch of Searches as the questions' Search columns (:data:`aml_ray.run.evidence.SEARCH_SCHEMA`).

        What the pipeline's Ingest stage calls: the outcomes leave this actor as one Arrow table (one
        IPC stream through Ray's object store) instead of a pickled dict per question and memory.

        Args:
            items: as :meth:`search_batch`.
            media_root: the run's media folder (Multimodal): images in memories returned as parts are
                stored there once by hash (:func:`aml_ray.media.memories_to_evidence`).

        Returns:
            One row per item, in order.

        Raises:
            ContractError, ParticipantError: as :meth:`search`.
        """
        from aml_ray.run.evidence import search_columns

        outcomes = await self.search_batch(items)
        if media_root is not None and self.spec.media is not None:
            store = MediaStore(media_root)
            for o in outcomes:
                o["memories"] = memories_to_evidence(o["memories"], store)
        return search_columns(outcomes)


class _SearchBatch:
    """One :meth:`ParticipantClient.search_many` call: its Searches queued at once, each reply checked without a task of its own.

    Why not a task per Search awaiting its reply: each such task costs its creation, a wake-up when the
    reply arrives and the gather's bookkeeping: close to a third of the client's own CPU per Search
    (measured: docs/benchmarks.md). Here each
    queued attempt carries a :class:`_BatchReply` in place of a future; the sender hands it the reply,
    which is checked and turned into the Search's outcome on the loop's next turn. Only a failed first
    attempt starts a task, which runs :meth:`ParticipantClient._retry` (the same retry policy,
    Retry-After and evidence as a single request).

    The first error that stops the stage (ContractError, ParticipantError) fails :meth:`run`, carrying
    its Search's outcome (:meth:`ParticipantClient._stopped`); a cancelled caller or a closed client
    cancels it. Either way the batch's attempts still queued are
    skipped by the senders (their ``done()`` is true) and its retry tasks are cancelled; a sender that
    took its next attempt before the failing reply was checked has sent that one.
    """

    def __init__(self, client: ParticipantClient, requests: list[tuple[SearchRequest, str]]):
        self.client, self.requests = client, requests
        self.results: list[dict[str, Any] | None] = [None] * len(requests)
        self.remaining = len(requests)
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.retries: set[asyncio.Task] = set()
        self.url = client._target(client.spec.search_url)
        self.data = [body_bytes(request.to_body()) for request, _ in requests]
        self.t0 = time.perf_counter()

    async def run(self) -> list[dict[str, Any]]:
        queue = self.client._queue
        assert queue is not None
        now = time.perf_counter()
        for i, data in enumerate(self.data):
            queue.put("", (self.url, data, _BatchReply(self, i), now), _SEARCH_AFTER)
        try:
            await self.finished
        finally:
            for task in self.retries:
                task.cancel()
        return self.results  # type: ignore[return-value]

    def replied(self, i: int, status: int, raw: bytes, retry_after: str | None, latency_ms: float,
                queue_ms: float) -> None:
        if self.finished.done():  # failed or cancelled since the reply came
            return
        request, ref = self.requests[i]
        try:
            self.client._check_reply(status, raw, retry_after, SEARCH_RETRY_STATUSES, "search", ref)
            outcome = self.client._outcome(ref, self.data[i])
            outcome.update(http_status=status, latency_ms=latency_ms, queue_ms=queue_ms, status="ok",
                           elapsed_ms=(time.perf_counter() - self.t0) * 1000,
                           memories=self.client._memories(raw, status, request, ref))
        except TransientError as exc:
            exc.queue_ms = queue_ms
            self._retry(i, exc)
        except (ContractError, ParticipantError) as exc:  # stops the run: with the Search's outcome (evidence)
            stopped = self.client._outcome(ref, self.data[i])
            stopped.update(http_status=status, latency_ms=latency_ms, queue_ms=queue_ms, elapsed_ms=(time.perf_counter() - self.t0) * 1000)
            self.fail(self.client._stopped(exc, stopped))
        except Exception as exc:  # noqa: BLE001 - never into the sender: it fails this batch's caller
            self.fail(exc)
        else:
            self._settle(i, outcome)

    def sent_failed(self, i: int, exc: BaseException) -> None:
        error = self.client._transport_error(exc)
        if isinstance(error, TransientError):
            self._retry(i, error)
        else:
            self.fail(error)

    def fail(self, exc: BaseException) -> None:
        if not self.finished.done():
            self.finished.set_exception(exc)

    def _settle(self, i: int, outcome: dict[str, Any]) -> None:
        self.results[i] = outcome
        self.remaining -= 1
        if not self.remaining and not self.finished.done():
            self.finished.set_result(None)

    def _retry(self, i: int, first: TransientError) -> None:
        task = asyncio.get_running_loop().create_task(self._retried(i, first))
        self.retries.add(task)
        task.add_done_callback(self._retry_done)

    def _retry_done(self, task: asyncio.Task) -> None:
        self.retries.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.fail(task.exception())  # type: ignore[arg-type]

    async def _retried(self, i: int, first: TransientError) -> None:
        request, ref = self.requests[i]
        client = self.client
        outcome = await client._retry(client.spec.search_url, self.data[i], SEARCH_RETRY_STATUSES, "search",
                                      client._outcome(ref, self.data[i]), first, self.t0)
        raw = outcome.pop("raw", None)
        try:
            outcome["memories"] = [] if outcome["status"] != "ok" else client._memories(raw, outcome["http_status"],
                                                                                      request, ref)
        except ContractError as exc:
            raise client._stopped(exc, outcome) from None
        self._settle(i, outcome)


class _BatchReply:
    """Where a sender hands one queued Search's reply: the part of :class:`asyncio.Future` it uses."""

    __slots__ = ("batch", "index")

    def __init__(self, batch: _SearchBatch, index: int):
        self.batch, self.index = batch, index

    def done(self) -> bool:  # the batch failed or was cancelled: not sent, or its reply not wanted
        return self.batch.finished.done()

    def set_result(self, reply: tuple[int, bytes, str | None, float, float]) -> None:
        # checked on the loop's next turn: the sender first sends the next queued attempt (measured faster
        # than checking here: docs/benchmarks.md)
        asyncio.get_running_loop().call_soon(self.batch.replied, self.index, *reply)

    def set_exception(self, exc: BaseException) -> None:
        self.batch.sent_failed(self.index, exc)

    def cancel(self) -> None:  # the client closed (aclose) while this attempt was in flight
        self.batch.finished.cancel()


def spawn_participant_client(spec: ParticipantSpec, *, name: str | None = None, namespace: str | None = None,
                             held_back: int = 0):
    """Start the ``ParticipantClient`` Ray actor for one participant version.

    Args:
        spec: the version's spec (its secret travels to the actor only).
        name: optional actor name (the client registry names the clients it shares,
            :mod:`aml_ray.actors.shared`).
        namespace: the Ray namespace of ``name`` (default: the caller's).
        held_back: in-flight slots the client keeps from its start for another client's requests
            (:class:`ParticipantClient`'s ``held_back``); 0: none.

    Returns:
        The actor handle; call ``add_sample.remote`` / ``search_batch.remote`` / ``aclose.remote``.
    """
    import ray

    from aml_ray.run.ray_runtime import on_this_node

    # on the caller's (the driver's) node: a Search or Add call in flight when a worker node is lost
    # would otherwise fail its stage (tests/test_node_loss.py)
    options: dict[str, Any] = {"num_cpus": 0, "max_restarts": 3, "max_concurrency": 10_000,
                               "scheduling_strategy": on_this_node()}
    if name:
        options.update(name=name, namespace=namespace, get_if_exists=True)
    return ray.remote(ParticipantClient).options(**options).remote(spec, in_actor=True, held_back=held_back)
