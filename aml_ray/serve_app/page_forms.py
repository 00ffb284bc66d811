"""What the HTML pages share about forms: a refusal turned into the messages shown above the form.

A page route calls the same functions as the JSON API; what the API answers as 4xx the page shows as
messages, each naming the field and the fix, never the submitted value (which may hold a secret).
"""

from __future__ import annotations

from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from aml_ray.security import EndpointRejected
from aml_ray.store.errors import QuotaExceeded, StoreError

#: What a page route catches and shows instead of answering with JSON.
REFUSALS = (RequestValidationError, ValidationError, StoreError, HTTPException, EndpointRejected)


def _field(loc) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts)


def refusal_messages(exc: Exception) -> tuple[int, list[str]]:
    """``(HTTP status, messages)`` for a refused form.

    Args:
        exc: one of :data:`REFUSALS`.

    Returns:
        The status the API would have answered and one message per problem (``field: why``).
    """
    if isinstance(exc, (RequestValidationError, ValidationError)):
        msgs = []
        for e in exc.errors():
            field = _field(e.get("loc", ()))
            msgs.append(f"{field}: {e.get('msg', '')}" if field else e.get("msg", ""))
        return 422, msgs
    if isinstance(exc, QuotaExceeded) and exc.available_at is not None:
        return exc.status_code, [f"{exc.reason} (next run allowed at {exc.available_at:%Y-%m-%d %H:%M} UTC)"]
    if isinstance(exc, StoreError):
        return exc.status_code, [exc.reason]
    if isinstance(exc, EndpointRejected):
        return 422, [f"endpoint rejected: {exc}"]
    detail = exc.detail
    return exc.status_code, [detail["reason"] if isinstance(detail, dict) and "reason" in detail else str(detail)]
