"""The request body limit: a body over ``max_bytes`` gets 413 before any route reads it.

A declared ``Content-Length`` over the limit is refused at once; a body sent without one (chunked) is
counted as it arrives and refused when the count passes the limit. The limit is
``ServiceSettings.max_body_bytes`` (``AML_MAX_BODY_BYTES``, default 1 MiB; docs/operations.md).
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse


def _reason(max_bytes: int) -> str:
    return f"request body larger than {max_bytes} bytes (the service's limit, AML_MAX_BODY_BYTES)"


class BodyLimit:
    """ASGI middleware enforcing the limit.

    Args:
        app: the wrapped ASGI app.
        max_bytes: the largest body accepted, in bytes (> 0).
    """

    def __init__(self, app, max_bytes: int):
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > self.max_bytes:
            response = JSONResponse({"detail": {"reason": _reason(self.max_bytes)}}, status_code=413)
            return await response(scope, receive, send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:  # FastAPI re-raises an HTTPException met while reading the body
                    raise HTTPException(413, detail=_reason(self.max_bytes))
            return message

        return await self.app(scope, counted, send)


def install_body_limit(app: FastAPI, max_bytes: int) -> None:
    """Add :class:`BodyLimit` to ``app``."""
    app.add_middleware(BodyLimit, max_bytes=max_bytes)
