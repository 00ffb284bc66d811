"""What the checks send with: one :class:`Probe` per battery run.

The probe owns:

- a :class:`~aml_ray.actors.participant.ParticipantClient` for every Add and for the Searches whose rule
  is the response shape (the same client, validators and retry sets an evaluation uses), with a short,
  bounded retry policy and per-request timeout (:class:`CheckOptions`);
- :class:`RawHTTP`, one small helper for what that client cannot express: the unauthenticated Health
  GET, requests without or with other credentials, a burst above the declared capacity (status and
  ``Retry-After`` of each reply), and a *lenient* Search that reads ``data`` without stopping at an item
  rule another check owns (so one broken rule makes one check fail, not all of them);
- the retries: every Add and Search, raw ones included (:meth:`Probe.post`), is retried by the run's
  rule (:mod:`aml_ray.retry`: the AML error table's retry sets, Retry-After, bounded jittered backoff)
  and each retry is noted in :attr:`Probe.retries` (:mod:`aml_ray.conformance.retries`). Two kinds of
  request are sent once: the Health GET (the retry sets cover Add and Search; the service's health
  check sends one GET too) and the limits check's burst above capacity, whose 429s are what it measures;
- the check's ids: ``check:<run>:<check>:<hex>`` user ids that never collide with real data and are
  never a prefix of one another (equal-length random suffixes). Nothing is ever deleted.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

from aml_ray.actors.participant import ParticipantClient, ParticipantError, ParticipantSpec, body_bytes
from aml_ray.conformance.retries import CountingRetryPolicy, RetryLog
from aml_ray.contract import AddRequest, ContractError, Message, SearchRequest
from aml_ray.retry import SEARCH_RETRY_STATUSES, RetryPolicy, TransientError, parse_retry_after
from aml_ray.security import PinnedResolver


@dataclass(frozen=True)
class CheckOptions:
    """Bounds of one battery run (request counts and time).

    Attributes:
        timeout_s: per-request timeout in seconds (the evaluation allows 30 minutes; a pre-flight
            should not wait that long).
        retry: retry policy of every Add and Search the checks send (bounded, short backoff); what is
            retried is the run's rule (:mod:`aml_ray.retry`).
        visibility_timeout_s: how long checks other than read-your-write wait for a write to show up
            in Search before they give up (seconds).
        poll_interval_s: interval between those Searches (seconds).
        latency_requests: Adds and Searches each in the latency burst (at the declared capacity).
        overload_factor: the overload burst sends ``overload_factor x max_in_flight`` concurrent
            Searches, capped at ``overload_max``.
        overload_max: most requests of the overload burst.
        check_timeout_s: wall-time bound of one check (seconds).
    """

    timeout_s: float = 60.0
    retry: RetryPolicy = RetryPolicy(max_attempts=3, backoff_base_s=0.1, backoff_max_s=1.0,
                                     retry_after_cap_s=5.0)
    visibility_timeout_s: float = 5.0
    poll_interval_s: float = 0.25
    latency_requests: int = 8
    overload_factor: int = 2
    overload_max: int = 64
    check_timeout_s: float = 180.0


@dataclass
class AddResult:
    """What happened to one Add.

    Attributes:
        ok: the endpoint answered HTTP 200 (the write is applied as far as it says), even when the body
            broke a rule (then ``contract_error`` is set; the Add-shape check owns those rules).
        contract_error: the :class:`ContractError` of the reply, if any.
        error: why the Add did not succeed (HTTP status and detail, or retries exhausted), else None.
        status: the HTTP status when known.
        elapsed_ms: wall time of the call, retries included.
    """

    ok: bool
    contract_error: ContractError | None = None
    error: str | None = None
    status: int | None = None
    elapsed_ms: float = 0.0


@dataclass
class RawReply:
    """One raw HTTP reply (or a transport failure).

    Attributes:
        status: HTTP status, or None when the connection failed (``error`` says how).
        body: decoded JSON, or None when the body is not JSON.
        text: the first 300 characters of the body (secret redacted).
        retry_after: the ``Retry-After`` header, if any.
        error: transport failure class name (``ConnectError``, ``ReadTimeout``...), else None.
        elapsed_ms: wall time in milliseconds.
        detail: the transport failure's message (e.g. ``Cannot connect to host ...``), else "".
    """

    status: int | None
    body: Any = None
    text: str = ""
    retry_after: str | None = None
    error: str | None = None
    elapsed_ms: float = 0.0
    detail: str = ""

    def failure(self) -> str:
        """``ConnectError: Cannot connect to host ...`` for a transport failure."""
        return f"{self.error}: {self.detail}" if self.detail else str(self.error)


@dataclass
class SearchReply:
    """A lenient Search: the items that have string ``id`` and ``content``, whatever else is wrong.

    Attributes:
        status: HTTP status (None on a transport failure).
        items: item dicts of ``data`` with string ``id`` and ``content`` (raw values, participant order),
            or None when the reply had no ``data`` array.
        error: a short description when the Search did not answer 200 with a ``data`` array.
    """

    status: int | None
    items: list[dict[str, Any]] | None
    error: str | None = None


def contains(item: dict[str, Any], token: str) -> bool:
    """Whether a memory's content carries a token (case-insensitive substring)."""
    content = item.get("content")
    return isinstance(content, str) and token.lower() in content.lower()


class RawHTTP:
    """Raw requests over the same transport as ParticipantClient (httpx API, aiohttp transport).

    Args:
        timeout_s: per-request timeout in seconds.
        max_connections: connection pool size (at least the largest burst).
        redact: a secret to replace by ``***`` in any body text kept.
        pins: ``{host: checked addresses}`` (``ParticipantSpec.pinned_addresses``): connect only to these,
            never resolving a name again (:class:`aml_ray.security.PinnedResolver`); None resolves names.
    """

    def __init__(self, timeout_s: float, max_connections: int, redact: str | None = None,
                 pins: dict[str, tuple[str, ...]] | None = None):
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        session = None if pins is None else (lambda: aiohttp.ClientSession(connector=aiohttp.TCPConnector(
            limit=max_connections, keepalive_timeout=limits.keepalive_expiry, resolver=PinnedResolver(pins))))
        self._client = httpx.AsyncClient(transport=AiohttpTransport(limits=limits, client=session),
                                         timeout=httpx.Timeout(timeout_s), follow_redirects=False)
        self._redact = redact

    async def aclose(self) -> None:
        """Close the pool."""
        await self._client.aclose()

    async def request(self, method: str, url: str, payload: dict[str, Any] | None = None,
                      headers: dict[str, str] | None = None) -> RawReply:
        """Send one request; never raises for HTTP or transport failures.

        Args:
            method: ``GET`` or ``POST``.
            url: the endpoint.
            payload: JSON body (sent as the same UTF-8 bytes ParticipantClient sends), or None.
            headers: extra headers (credentials only when the check means to send them).

        Returns:
            The reply.
        """
        hdrs = {"Content-Type": "application/json", **(headers or {})} if payload is not None else headers
        t0 = time.perf_counter()
        try:
            resp = await self._client.request(method, url, headers=hdrs,
                                              content=body_bytes(payload) if payload is not None else None)
        except httpx.TransportError as exc:
            # httpx-aiohttp reports a refused connection as ConnectTimeout; the message tells the truth.
            return RawReply(None, error=type(exc).__name__, elapsed_ms=(time.perf_counter() - t0) * 1000,
                            detail=str(exc)[:160])
        elapsed = (time.perf_counter() - t0) * 1000
        text = resp.text[:300]
        if self._redact:
            text = text.replace(self._redact, "***")
        try:
            body = resp.json()
        except ValueError:
            body = None
        return RawReply(resp.status_code, body, text, resp.headers.get("retry-after"), None, elapsed)


def checked_spec(spec: ParticipantSpec, options: CheckOptions) -> ParticipantSpec:
    """The participant version as the battery addresses it: ``spec`` with the checks' bounded retry policy
    (``options.retry``) and per-request timeout (the smaller of ``spec.timeout_s`` and ``options.timeout_s``).

    Its ``describe()`` is what a report names as the participant (``aml-ray check --json``), so the report
    gives the timeout the checks used, not the evaluation's default of 1,800 s.

    Examples:
        >>> spec = ParticipantSpec(add_url="http://127.0.0.1:9/add", search_url="http://127.0.0.1:9/search")
        >>> spec.timeout_s, checked_spec(spec, CheckOptions(timeout_s=5.0)).timeout_s
        (1800.0, 5.0)
    """
    return spec.model_copy(update={"retry": options.retry, "timeout_s": min(spec.timeout_s, options.timeout_s)})


class Probe:
    """The participant as the checks see it.

    Args:
        spec: the participant version (endpoints, auth, declared capacity ``max_in_flight``).
        options: request and time bounds.

    Attributes:
        run: random tag of this battery run (in every id it sends).
        retries: the retries made so far, by cause; the runner takes them after each check.
    """

    def __init__(self, spec: ParticipantSpec, options: CheckOptions):
        self.options = options
        self.retries = RetryLog()
        # every client made from self.spec (a wrong-key copy too) notes its retries in self.retries
        policy = CountingRetryPolicy.wrapping(options.retry, self.retries)
        self.spec = checked_spec(spec, options).model_copy(update={"retry": policy})
        self.secret = spec.secret.get_secret_value() if spec.secret else None
        self.run = secrets.token_hex(4)
        self.client = ParticipantClient(self.spec)
        burst = max(options.overload_max, self.spec.max_in_flight)
        self.raw = RawHTTP(self.spec.timeout_s, burst, redact=self.secret, pins=self.spec.pinned_addresses)

    async def aclose(self) -> None:
        """Close both connection pools."""
        await self.client.aclose()
        await self.raw.aclose()

    # ids and texts ------------------------------------------------------------------------------------
    def user(self, check: str, label: str = "") -> str:
        """A fresh user id ``check:<run>:<check>:<label><hex8>`` used by no other request."""
        return f"check:{self.run}:{check}:{label}{secrets.token_hex(4)}"

    @staticmethod
    def token() -> str:
        """A fresh code word (letters and digits only, so every tokenizer keeps it whole)."""
        return "zq" + secrets.token_hex(5)

    def add_request(self, user_id: str, *contents: str, timestamps: list[int] | None = None,
                    request_id: str | None = None, session_id: str | None = None) -> AddRequest:
        """An Add of ``contents`` as user messages under ``user_id`` (fresh request/session ids)."""
        msgs = [Message(role="user", content=c, timestamp=timestamps[i] if timestamps else None)
                for i, c in enumerate(contents)]
        return AddRequest(request_id=request_id or f"{user_id}:chunk-{secrets.token_hex(3)}",
                          messages=msgs, user_id=user_id, session_id=session_id or f"{user_id}:session-0")

    # sending ------------------------------------------------------------------------------------------
    async def add(self, request: AddRequest, client: ParticipantClient | None = None) -> AddResult:
        """Send an Add through ParticipantClient; a contract error of the 200 reply is recorded, not raised.

        Args:
            request: the Add.
            client: another client (e.g. one holding a wrong secret); default the probe's.

        Returns:
            The outcome.
        """
        t0 = time.perf_counter()

        def ms() -> float:
            return (time.perf_counter() - t0) * 1000

        try:
            # resend: the checks send repeated Adds on purpose (idempotency); never answer them from the
            # client's own record of acknowledged Adds
            out = await (client or self.client).add(request, resend=True)
        except ContractError as exc:
            # A "status" contract error is a 202 without binding: the write is not known to be done.
            return AddResult(ok=exc.field != "status", contract_error=exc, status=None, elapsed_ms=ms())
        except ParticipantError as exc:
            return AddResult(ok=False, error=f"HTTP {exc.status}: {exc.detail[:200]}", status=exc.status,
                             elapsed_ms=ms())
        if out["status"] != "ok":
            return AddResult(ok=False, error=out["error"], status=out["http_status"], elapsed_ms=ms())
        return AddResult(ok=True, status=out["http_status"], elapsed_ms=ms())

    async def search_checked(self, query: str, user_id: str, top_k: int,
                             client: ParticipantClient | None = None) -> dict[str, Any]:
        """A Search through ParticipantClient with the full contract validation.

        Returns:
            The client's outcome dict (``status``, ``memories``, ``http_status``, ``error``...).

        Raises:
            ContractError, ParticipantError: as :meth:`ParticipantClient.search`.
        """
        req = SearchRequest(query=query, user_id=user_id, top_k=top_k)
        return await (client or self.client).search(req, f"check:{self.run}:search")

    async def post(self, url: str, payload: dict[str, Any], headers: dict[str, str] | None = None, *,
                   retry_statuses: frozenset[int] = SEARCH_RETRY_STATUSES) -> RawReply:
        """POST through :class:`RawHTTP`, retrying as the run does (same bytes each time); never raises.

        A reply whose status is in ``retry_statuses``, or a transport failure, is retried by the probe's
        policy (Retry-After honoured, bounded jittered backoff); each retry is noted in :attr:`retries`.

        Args:
            url: the endpoint.
            payload: the JSON body.
            headers: extra headers (credentials only when the check means to send them).
            retry_statuses: the AML error table's retry set of the endpoint (default Search's).

        Returns:
            The last reply: the first that is not transient, or the last transient one when the policy
            gave up.
        """
        reply: RawReply | None = None
        try:
            async for attempt in self.spec.retry.retrying():
                with attempt:
                    reply = await self.raw.request("POST", url, payload, headers)
                    if reply.status is None:
                        raise TransientError(reply.error or "transport failure")
                    if reply.status in retry_statuses:
                        raise TransientError(f"HTTP {reply.status}", reply.status,
                                             parse_retry_after(reply.retry_after))
        except TransientError:
            pass  # the policy gave up: the last reply says why
        assert reply is not None
        return reply

    async def search(self, query: str, user_id: str, top_k: int = 10) -> SearchReply:
        """A lenient Search (raw, retried as the run does): items with string id/content, ignoring rules
        other checks own."""
        body = SearchRequest(query=query, user_id=user_id, top_k=top_k).to_body()
        r = await self.post(self.spec.search_url, body, self.spec.auth_headers())
        if r.status is None:
            return SearchReply(None, None, f"no reply ({r.failure()})")
        data = r.body.get("data") if isinstance(r.body, dict) else None
        if r.status != 200 or not isinstance(data, list):
            return SearchReply(r.status, None, f"HTTP {r.status}: {r.text[:160]!r}")
        items = [i for i in data if isinstance(i, dict) and isinstance(i.get("id"), str)
                 and isinstance(i.get("content"), str)]
        return SearchReply(r.status, items)

    async def wait_visible(self, query: str, user_id: str, token: str,
                           top_k: int = 10) -> tuple[list[dict[str, Any]], float, SearchReply]:
        """Search until an item carrying ``token`` shows up, at most ``visibility_timeout_s``.

        Returns:
            (matching items, seconds waited, last reply); the item list is empty when it never showed.
        """
        t0 = time.monotonic()
        while True:
            reply = await self.search(query, user_id, top_k)
            hits = [i for i in reply.items or [] if contains(i, token)]
            waited = time.monotonic() - t0
            if hits or waited >= self.options.visibility_timeout_s:
                return hits, waited, reply
            await asyncio.sleep(self.options.poll_interval_s)


@dataclass
class Tally:
    """Counts of replies in a burst, by kind."""

    ok: int = 0
    throttled_with_retry_after: int = 0
    throttled_without_retry_after: int = 0
    server_errors: dict[int, int] = field(default_factory=dict)
    other: dict[int, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)

    def count(self, r: RawReply) -> None:
        """Add one reply."""
        if r.status is None:
            self.dropped[r.error or "?"] = self.dropped.get(r.error or "?", 0) + 1
        elif 200 <= r.status < 300:
            self.ok += 1
        elif r.status == 429:
            if r.retry_after:
                self.throttled_with_retry_after += 1
            else:
                self.throttled_without_retry_after += 1
        elif r.status >= 500:
            self.server_errors[r.status] = self.server_errors.get(r.status, 0) + 1
        else:
            self.other[r.status] = self.other.get(r.status, 0) + 1

    def describe(self) -> str:
        """E.g. ``12x200, 4x429 with Retry-After, 2x503, 1 dropped (ReadTimeout)``."""
        parts = [f"{self.ok}x2xx"] if self.ok else []
        if self.throttled_with_retry_after:
            parts.append(f"{self.throttled_with_retry_after}x429 with Retry-After")
        if self.throttled_without_retry_after:
            parts.append(f"{self.throttled_without_retry_after}x429 without Retry-After")
        parts += [f"{n}x{s}" for s, n in sorted({**self.server_errors, **self.other}.items())]
        parts += [f"{n} dropped ({e})" for e, n in sorted(self.dropped.items())]
        return ", ".join(parts) or "no replies"
