"""Error bodies: every error is ``{"detail": {"reason": ...}}``; 422 adds ``errors`` with field details.

Validation errors drop pydantic's ``input`` and ``ctx`` so a rejected body (which may carry a Memory
System Key) is never echoed back.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, IntegrityError
from starlette.exceptions import HTTPException as StarletteHTTPException

from aml_ray.security import EndpointRejected
from aml_ray.store.errors import QuotaExceeded, StoreError


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
    async def _http(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail
        body = detail if isinstance(detail, dict) and "reason" in detail else {"reason": str(detail)}
        return JSONResponse(status_code=exc.status_code, content={"detail": body},
                            headers=getattr(exc, "headers", None))
