"""Error bodies: every error is ``{"detail": {"reason": ...}}``; 422 adds ``errors`` with field details.

Validation errors drop pydantic's ``input`` and ``ctx`` so a rejected body (which may carry a Memory
System Key) is never echoed back. :class:`ErrorOut` is that shape for the OpenAPI description, and
:func:`error_responses` documents the refusals a group of routes gives. A 405 names every method the path
has in ``Allow`` (RFC 9110 15.5.6), not only those of the first route that matched the path.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.routing import Match
from sqlalchemy.exc import DataError, IntegrityError
from starlette.exceptions import HTTPException as StarletteHTTPException

from aml_ray.security import EndpointRejected
from aml_ray.store.errors import QuotaExceeded, StoreError


class FieldError(BaseModel):
    """One rejected field: where (``["body", "requests_per_s"]``), why, and pydantic's error type."""

    loc: list[str | int]
    msg: str
    type: str


class ErrorDetail(BaseModel):
    """Why a request was refused; ``errors`` on 422, ``available_at`` (ISO 8601) on a quota's 429."""

    reason: str
    errors: list[FieldError] | None = None
    available_at: str | None = None


class ErrorOut(BaseModel):
    """Every error response: ``{"detail": {"reason": ...}}``."""

    detail: ErrorDetail


#: What each refusal means, for the OpenAPI description.
ERROR_MEANINGS = {
    400: "the body is not parseable (malformed JSON or form data)",
    401: "a missing or invalid Leaderboard API key or admin token",
    403: "a state-changing request from another origin",
    404: "unknown, or bound to another key",
    409: "conflicts with the stored state (duplicate, already decided, active job, gate failed)",
    413: "the body is larger than the service's limit",
    422: "request validation failed: ``errors`` names each field",
    429: "a quota or rate limit; ``Retry-After`` or ``available_at`` says when",
    503: "the service cannot do this now (admin routes disabled, bundles missing, health checks busy)",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a router: each of ``codes`` with :class:`ErrorOut` as JSON (also on HTML pages,
    whose refusals of a malformed path are JSON) and its meaning."""
    return {code: {"model": ErrorOut, "description": ERROR_MEANINGS[code], "content": {"application/json": {}}}
            for code in codes}


#: The methods a 405's ``Allow`` is probed for.
PROBED_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app fully matches on the request's path, sorted.

    Probed per method with ``Route.matches`` (included routers nest their routes, so the routes' own
    ``methods`` are not all visible at the top).
    """
    return [method for method in PROBED_METHODS
            if any(route.matches({**request.scope, "method": method})[0] == Match.FULL
                   for route in request.app.router.routes)]


def error(status: int, reason: str, **extra) -> JSONResponse:
    """A JSON error response ``{"detail": {"reason": reason, **extra}}``."""
    return JSONResponse(status_code=status, content={"detail": {"reason": reason, **extra}})


def field_errors(errors) -> list[dict]:
    """Pydantic errors reduced to ``loc``, ``msg``, ``type`` (no input values)."""
    return [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
            for e in errors]


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that give every error the ``{"detail": {"reason": ...}}`` shape."""

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        return error(422, "request validation failed", errors=field_errors(exc.errors()))

    @app.exception_handler(EndpointRejected)
    async def _endpoint(_req: Request, exc: EndpointRejected) -> JSONResponse:
        return error(422, f"endpoint rejected: {exc}")

    @app.exception_handler(StoreError)
    async def _store(_req: Request, exc: StoreError) -> JSONResponse:
        if isinstance(exc, QuotaExceeded) and exc.available_at is not None:
            return error(exc.status_code, exc.reason, available_at=exc.available_at.isoformat())
        return error(exc.status_code, exc.reason)

    @app.exception_handler(IntegrityError)
    async def _integrity(_req: Request, exc: IntegrityError) -> JSONResponse:
        # a uniqueness race the queries' own checks did not see (e.g. two identical requests at once)
        return error(409, "conflicting concurrent request: it duplicates an existing record; retry")

    @app.exception_handler(DataError)
    async def _data(_req: Request, exc: DataError) -> JSONResponse:
        # a value the database refuses that validation let through; the statement and values stay out
        return error(422, "a submitted value cannot be stored (the database refused it); remove control "
                          "characters and out-of-range numbers")

    @app.exception_handler(StarletteHTTPException)
    async def _http(req: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 405:
            allowed = allowed_methods(req)
            return JSONResponse(status_code=405, headers={"Allow": ", ".join(allowed)}, content={"detail": {
                "reason": f"method {req.method} not allowed; allowed: {', '.join(allowed)}"}})
        detail = exc.detail
        body = detail if isinstance(detail, dict) and "reason" in detail else {"reason": str(detail)}
        return JSONResponse(status_code=exc.status_code, content={"detail": body},
                            headers=getattr(exc, "headers", None))
