"""The same-origin rule for state-changing requests: a POST (PUT, PATCH, DELETE) whose ``Origin`` is another
origin gets 403 before any route runs.

Why not the cookie alone: the page sessions' cookies are ``SameSite=Strict``, but "site" is the registrable
domain, so a page on another port of the same host (or on a sibling subdomain) is same-site, and its
auto-submitted form carries the participant's or the admin's cookie. Browsers send ``Origin`` on every
non-GET request (Fetch standard, "append a request Origin header"), so comparing it with the request's own
``Host`` stops such a form, and a login form posted from elsewhere (login CSRF) as well. OWASP CSRF
Prevention Cheat Sheet, "Verifying Origin With Standard Headers": ``Origin`` first, ``Referer`` when
``Origin`` is absent; ``Origin: null`` (sandboxed frames, opaque redirects) is refused.

A request that carries neither header is not a browser's cross-origin form (a browser always sends
``Origin`` on POST), so API clients such as ``curl`` and SDKs need no change. Behind a proxy that rewrites
``Host``, list the public origin in ``ServiceSettings.trusted_origins`` (``AML_TRUSTED_ORIGINS``).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from fastapi import FastAPI
from starlette.responses import JSONResponse

#: Methods that never change state (RFC 9110 safe methods): not checked.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
REASON = ("cross-origin request refused: a state-changing request must come from this site's own pages "
          "(its Origin header names another origin)")


def _origin_of(url: str) -> str | None:
    parts = urlsplit(url)
    if not parts.scheme or not parts.netloc:
        return None
    return f"{parts.scheme}://{parts.netloc}".lower()


class SameOriginWrites:
    """ASGI middleware refusing cross-origin state-changing requests with 403.

    Args:
        app: the wrapped ASGI app.
        trusted_origins: further origins (``scheme://host[:port]``) whose pages may post here.
    """

    def __init__(self, app, trusted_origins: tuple[str, ...] = ()):
        self.app = app
        self.trusted = frozenset(o.rstrip("/").lower() for o in trusted_origins)

    def allowed(self, scope) -> bool:
        """Whether the request's ``Origin`` (else ``Referer``) is its own origin or a trusted one."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        claimed = headers.get("origin")
        if claimed is None:
            referer = headers.get("referer")
            if referer is None:
                return True  # no browser form: browsers send Origin on every non-GET request
            claimed = _origin_of(referer)
        if claimed is None or claimed.strip().lower() == "null":
            return False
        claimed = claimed.strip().rstrip("/").lower()
        host = headers.get("host", "").lower()
        scheme = scope.get("scheme", "http")
        own = {f"{scheme}://{host}", f"https://{host}"}  # https: a TLS proxy in front reaches us over http
        return claimed in own or claimed in self.trusted

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS and not self.allowed(scope):
            response = JSONResponse({"detail": {"reason": REASON}}, status_code=403)
            return await response(scope, receive, send)
        return await self.app(scope, receive, send)


def install_same_origin_writes(app: FastAPI, trusted_origins: tuple[str, ...] = ()) -> None:
    """Add :class:`SameOriginWrites` to ``app``."""
    app.add_middleware(SameOriginWrites, trusted_origins=tuple(trusted_origins))
