"""Key hashing, secret encryption and participant endpoint (SSRF) validation.

Source: DESIGN.md ("Service") and the seed's "Data, security & privacy": Leaderboard API keys are random,
shown once and stored as a hash; the Memory System Key is encrypted at rest and referenced by an opaque
id; the platform connects only to public http(s) endpoints without credentials in the URL, and to the
address it checked.

Key hashing: a key is ``aml_`` + ``secrets.token_urlsafe(32)`` (256 random bits). With that much entropy a
slow password hash buys nothing (no dictionary to try), so the store keeps ``sha256(key)`` as hex: a
lookup by hash is one indexed query, and :func:`verify_key` compares in constant time.

Secret encryption: :class:`SecretBox` is a :class:`cryptography.fernet.MultiFernet` over the master keys
(``AML_MASTER_KEYS``, comma-separated Fernet keys, the first one current). Decryption tries every key, so
an operator rotates by putting a new key first and calling :meth:`SecretBox.rotate` on each ciphertext.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import re
import secrets
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from aiohttp.abc import AbstractResolver, ResolveResult

from pydantic import SecretStr

#: Prefix of every Leaderboard API key (lets secret scanners and users recognise one).
KEY_PREFIX = "aml_"
#: Environment variable with the comma-separated Fernet master keys; the first one encrypts.
MASTER_KEYS_ENV = "AML_MASTER_KEYS"


# --------------------------------------------------------------------------------------------- keys
def new_key() -> str:
    """A fresh Leaderboard API key: ``aml_`` + 43 URL-safe characters (256 random bits).

    Returns:
        The key in clear; show it once and store only :func:`hash_key` of it.
    """
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """The stored form of a key: sha256 hex of its UTF-8 bytes (see the module docstring for why).

    Args:
        key: the key in clear.

    Returns:
        64 lowercase hex characters.
    """
    return hashlib.sha256(key.encode()).hexdigest()


def verify_key(key: str, stored_hash: str) -> bool:
    """Whether ``key`` hashes to ``stored_hash`` (constant-time comparison).

    Args:
        key: the presented key.
        stored_hash: the value :func:`hash_key` returned for the issued key.

    Returns:
        True on a match.
    """
    return hmac.compare_digest(hash_key(key), stored_hash)


def key_display_prefix(key: str) -> str:
    """The first 8 characters of a key (``aml_AbCd``), safe to show in admin lists and logs."""
    return key[:8]


def tokens_equal(presented: str, expected: str) -> bool:
    """Constant-time equality for bearer tokens such as the admin token."""
    return hmac.compare_digest(presented.encode(), expected.encode())


# ------------------------------------------------------------------------------------------ secrets
class SecretBox:
    """Encrypts secrets at rest with the platform master keys (Fernet: AES-128-CBC + HMAC-SHA256).

    Args:
        master_keys: Fernet keys (urlsafe base64 of 32 bytes), newest first; the first encrypts, all
            decrypt.

    Raises:
        ValueError: no key, or a key that is not a valid Fernet key (the message never shows the key).

    Examples:
        >>> from cryptography.fernet import Fernet
        >>> box = SecretBox([Fernet.generate_key().decode()])
        >>> box.decrypt(box.encrypt("s3cret")).get_secret_value()
        's3cret'
    """

    def __init__(self, master_keys: Sequence[str | SecretStr]):
        # imported here: the run's participant client imports this module (PinnedResolver), and cryptography
        # cost about 10 ms of every run's start before the pre-flight
        from cryptography.fernet import Fernet, MultiFernet

        values = [k.get_secret_value() if isinstance(k, SecretStr) else k for k in master_keys]
        values = [v.strip() for v in values if v and v.strip()]
        if not values:
            raise ValueError(f"no master key: set {MASTER_KEYS_ENV} to one or more comma-separated Fernet "
                             "keys (python -c 'from cryptography.fernet import Fernet; "
                             "print(Fernet.generate_key().decode())')")
        fernets = []
        for i, value in enumerate(values):
            try:
                fernets.append(Fernet(value.encode()))
            except (ValueError, TypeError):
                raise ValueError(f"master key #{i + 1} is not a valid Fernet key (32 url-safe base64 "
                                 "bytes)") from None
        self._fernet = MultiFernet(fernets)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> SecretBox:
        """The box for ``AML_MASTER_KEYS`` (comma-separated, first is current).

        Args:
            env: the environment (default ``os.environ``).

        Returns:
            A :class:`SecretBox`.

        Raises:
            ValueError: the variable is unset, empty or holds an invalid key.
        """
        env = os.environ if env is None else env
        return cls((env.get(MASTER_KEYS_ENV) or "").split(","))

    def encrypt(self, secret: str | SecretStr) -> str:
        """Encrypt with the current master key.

        Args:
            secret: the plaintext.

        Returns:
            The Fernet token (ASCII), safe to store.
        """
        value = secret.get_secret_value() if isinstance(secret, SecretStr) else secret
        return self._fernet.encrypt(value.encode()).decode()

    def decrypt(self, token: str) -> SecretStr:
        """Decrypt with whichever master key made ``token``.

        Args:
            token: a value from :meth:`encrypt` or :meth:`rotate`.

        Returns:
            The plaintext, wrapped so that it does not print.

        Raises:
            cryptography.fernet.InvalidToken: no master key decrypts it (e.g. its key was retired).
        """
        return SecretStr(self._fernet.decrypt(token.encode()).decode())

    def rotate(self, token: str) -> str:
        """Re-encrypt ``token`` under the current (first) master key.

        Args:
            token: a ciphertext made with any of the configured keys.

        Returns:
            A new token; the old key may be retired once every stored token has been rotated.

        Raises:
            cryptography.fernet.InvalidToken: no configured key decrypts it.
        """
        return self._fernet.rotate(token.encode()).decode()


# ---------------------------------------------------------------------------------------- endpoints
class EndpointRejected(ValueError):
    """A participant URL failed validation.

    Args:
        url: the URL as submitted (never holds credentials in the message: userinfo is stripped).
        reason: why, in words a participant can act on.
    """

    def __init__(self, url: str, reason: str):
        self.url = _strip_userinfo(url)
        self.reason = reason
        super().__init__(f"{self.url}: {reason}")


@dataclass(frozen=True)
class PinnedEndpoint:
    """A validated URL and the address the platform connects to.

    Attributes:
        url: the URL as submitted.
        scheme: ``http`` or ``https``.
        host: the host name (or IP literal) from the URL, used for the Host header and TLS SNI.
        port: the port (default 80/443 filled in).
        addresses: every address the host resolved to, all of them checked.
        address: the address to connect to (the first checked one).
    """

    url: str
    scheme: str
    host: str
    port: int
    addresses: tuple[str, ...]
    address: str

    def connect_url(self) -> str:
        """The URL with the host replaced by the checked address (send ``Host`` = :attr:`host`)."""
        parts = urlsplit(self.url)
        ip = f"[{self.address}]" if ":" in self.address else self.address
        return urlunsplit((parts.scheme, f"{ip}:{self.port}", parts.path or "/", parts.query, ""))

    def request_kwargs(self) -> dict:
        """httpx request arguments that reach :attr:`address` while keeping Host and TLS name.

        Returns:
            ``{"url", "headers", "extensions"}`` for ``httpx.Client.request``; ``sni_hostname`` makes
            TLS send and verify the original name although the socket goes to the IP.
        """
        host_header = self.host if self.port in (80, 443) else f"{self.host}:{self.port}"
        kwargs: dict = {"url": self.connect_url(), "headers": {"Host": host_header}, "extensions": {}}
        if self.scheme == "https":
            kwargs["extensions"]["sni_hostname"] = self.host
        return kwargs


Resolver = Callable[[str, int], Sequence[str]]
_NUMERIC_HOST = re.compile(r"^(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+))*\.?$", re.IGNORECASE)


def _strip_userinfo(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def system_resolver(host: str, port: int) -> list[str]:
    """Resolve ``host`` with the system resolver (all A and AAAA records).

    Args:
        host: a host name or IP literal.
        port: the port (passed through to getaddrinfo).

    Returns:
        The distinct addresses, in resolver order.

    Raises:
        OSError: the name does not resolve.
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: list[str] = []
    for info in infos:
        addr = str(info[4][0]).split("%", 1)[0]
        if addr not in seen:
            seen.append(addr)
    return seen


def address_problem(addr: ipaddress.IPv4Address | ipaddress.IPv6Address, *,
                    allow_loopback: bool = False) -> str | None:
    """Why an address is not a public destination, or None when it is.

    Args:
        addr: the address.
        allow_loopback: accept loopback (127/8, ::1): operators and tests only.

    Returns:
        A short reason naming the class (``"loopback"``, ``"private"``, ...) or None.
    """
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return "IPv4-mapped IPv6 address"
    if addr.is_loopback:
        return None if allow_loopback else "loopback address"
    checks = (("is_unspecified", "unspecified address"), ("is_link_local", "link-local address"),
              ("is_multicast", "multicast address"), ("is_reserved", "reserved address"),
              ("is_private", "private address"))
    for attr, why in checks:
        if getattr(addr, attr):
            return why
    if isinstance(addr, ipaddress.IPv6Address) and (addr.sixtofour or addr.teredo):
        return "IPv6 transition address (6to4/Teredo)"
    if not addr.is_global:
        return "non-global address"
    return None


def validate_endpoint_url(url: str, *, allow_loopback: bool = False,
                          resolver: Resolver | None = None) -> PinnedEndpoint:
    """Check a participant URL and pin the address to connect to.

    Rules: scheme http or https; no ``user:password@``; a host; a canonical IP literal or a name
    (numeric forms such as ``2130706433`` or ``0177.0.0.1`` are refused, since resolvers read them
    differently); every resolved address public (not private, loopback, link-local, reserved,
    multicast, unspecified, IPv4-mapped IPv6 or otherwise non-global). Redirects are never followed by
    callers, so the pinned address is the only one contacted.

    Args:
        url: the submitted URL.
        allow_loopback: accept loopback addresses (``localhost``, 127/8, ::1). For operators running
            their own systems and for tests; never for participant submissions in production.
        resolver: ``(host, port) -> addresses`` (default :func:`system_resolver`).

    Returns:
        The :class:`PinnedEndpoint`.

    Raises:
        EndpointRejected: with the reason.

    Examples:
        >>> validate_endpoint_url("http://93.184.215.14/add").address
        '93.184.215.14'
        >>> validate_endpoint_url("ftp://example.org/")
        Traceback (most recent call last):
        ...
        aml_ray.security.EndpointRejected: ftp://example.org/: scheme must be http or https, got 'ftp'
    """
    resolver = resolver or system_resolver
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise EndpointRejected(url, f"not a valid URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise EndpointRejected(url, f"scheme must be http or https, got {scheme!r}")
    if "@" in parts.netloc or parts.username is not None or parts.password is not None:
        raise EndpointRejected(url, "credentials in the URL are not allowed; declare an auth scheme")
    host = parts.hostname
    if not host:
        raise EndpointRejected(url, "the URL has no host")
    port = port or (443 if scheme == "https" else 80)
    try:
        literal: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is None and _NUMERIC_HOST.match(host):
        raise EndpointRejected(url, f"host {host!r} is a non-canonical numeric address (decimal, octal, "
                                    "hex or shortened IPv4); use a name or a dotted-quad address")
    if literal is not None:
        addresses = [str(literal)]
    else:
        try:
            addresses = list(resolver(host, port))
        except OSError as exc:
            raise EndpointRejected(url, f"host {host!r} does not resolve ({exc.__class__.__name__})") from None
        if not addresses:
            raise EndpointRejected(url, f"host {host!r} resolved to no address")
    for raw in addresses:
        try:
            addr = ipaddress.ip_address(raw)
        except ValueError:
            raise EndpointRejected(url, f"host {host!r} resolved to an unparseable address") from None
        why = address_problem(addr, allow_loopback=allow_loopback)
        if why:
            raise EndpointRejected(url, f"host {host!r} resolves to {addr} ({why}); endpoints must be "
                                        "publicly reachable")
    return PinnedEndpoint(url=url.strip(), scheme=scheme, host=host, port=port,
                          addresses=tuple(addresses), address=addresses[0])


def pin_map(endpoints: Sequence[PinnedEndpoint]) -> dict[str, tuple[str, ...]]:
    """``{host name: its checked addresses}`` of validated endpoints, for :class:`PinnedResolver`.

    IP-literal hosts are left out (nothing to resolve). Two endpoints on one host name must have been
    checked to the same addresses; the first endpoint's are kept (they were all checked).
    """
    pins: dict[str, tuple[str, ...]] = {}
    for endpoint in endpoints:
        try:
            ipaddress.ip_address(endpoint.host)
        except ValueError:
            pins.setdefault(endpoint.host.lower().rstrip("."), endpoint.addresses)
    return pins


class PinnedResolver(AbstractResolver):
    """An aiohttp resolver that answers only from the addresses checked at validation (DNS pinning).

    :func:`validate_endpoint_url` resolves a participant's host once and checks every address; a client
    that resolved the name again at connect time could be sent elsewhere (DNS rebinding: a short TTL
    and a second answer pointing at 127.0.0.1 or a private address). Given to ``aiohttp.TCPConnector``
    (``resolver=``), this resolver returns the pinned addresses, so the socket goes to a checked
    address while the URL, the ``Host`` header, TLS SNI and certificate checks keep the original name.
    No lookup is ever made: a host that was not validated is refused. Source: the seed's "Data, security
    & privacy" (the platform connects to the address it checked).

    Args:
        pins: ``{host name: checked addresses}`` (:func:`pin_map`); names compare case-insensitively.

    Raises:
        OSError: from :meth:`resolve`, for a host that has no pin or no pinned address of the asked
            family (aiohttp reports it as a connection error naming the host).
    """

    def __init__(self, pins: Mapping[str, Sequence[str]]):
        self._pins = {host.lower().rstrip("."): tuple(addrs) for host, addrs in pins.items()}

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        """The pinned addresses of ``host`` (of ``family``; ``AF_UNSPEC`` takes both), in checked order."""
        addresses = self._pins.get(host.lower().rstrip("."))
        if addresses is None:
            raise OSError(f"host {host!r} was not validated: no pinned address (the platform connects only "
                          "to addresses it checked)")
        out: list[ResolveResult] = []
        for raw in addresses:
            fam = socket.AF_INET6 if ipaddress.ip_address(raw).version == 6 else socket.AF_INET
            if family in (socket.AF_UNSPEC, fam):
                out.append(ResolveResult(hostname=host, host=raw, port=port, family=fam, proto=0,
                                         flags=socket.AI_NUMERICHOST))
        if not out:
            raise OSError(f"host {host!r} has no pinned address of family {family!r}")
        return out

    async def close(self) -> None:
        """Nothing to release (no lookups are made)."""


def check_health(endpoint: PinnedEndpoint, *, timeout_s: float = 10.0) -> tuple[bool, str]:
    """Unauthenticated GET of a health URL, sent to the pinned address, no redirects.

    ``timeout_s`` is a deadline for the whole check (connect, headers, body), not a per-read timeout: a
    server that sends one byte at a time ends the check at the deadline like one that sends nothing. The
    check runs on an event loop of its own: call it from a thread that runs none (a sync route's thread).

    Args:
        endpoint: the validated health URL.
        timeout_s: total timeout in seconds.

    Returns:
        ``(healthy, summary)``: healthy on any 2xx; the summary is ``"HTTP <status>"``, the transport
        error's class name, or ``"TimeoutError"`` past the deadline (never a response body).
    """
    import asyncio

    import httpx

    kwargs = endpoint.request_kwargs()

    async def get() -> httpx.Response:
        async with httpx.AsyncClient(timeout=timeout_s, follow_redirects=False, trust_env=False) as client:
            return await asyncio.wait_for(client.request("GET", **kwargs), timeout_s)

    try:
        response = asyncio.run(get())
    except (httpx.HTTPError, TimeoutError) as exc:
        return False, type(exc).__name__
    return 200 <= response.status_code < 300, f"HTTP {response.status_code}"
