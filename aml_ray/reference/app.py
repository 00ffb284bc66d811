"""FastAPI app of the reference BM25 memory system (speaks the AML Add/Search contract).

Routes: ``POST /add``, ``POST /search``, ``GET /health`` (unauthenticated). Endpoints are plain ``def``
so FastAPI runs them in its threadpool; the store serialises SQLite access with a lock.

Multimodal (``create_app(..., media=MediaLimits())``, ``--multimodal``): Add contents and Search queries
may be arrays of parts, validated against the limits (a bad part is a 422 whose ``loc``/``msg`` name
the part index); text parts are indexed by BM25, images are kept by hash and returned in order.
"""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Any

from fastapi import Body, Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from aml_ray.contract import AddRequest, AddResponseModel, SearchRequest, SearchResponseModel
from aml_ray.media import MediaLimits, media_context, text_of
from aml_ray.reference.baselines import Searcher, iso_utc as _iso_utc
from aml_ray.reference.bm25_index import BM25Index
from aml_ray.reference.store import Memory, MemoryStore, RequestConflict

#: Accepted values of ``auth`` (``None`` or ``"none"`` disables authentication).
AUTH_SCHEMES = ("Token", "Bearer", "X-Api-Key")


def _created_at(m: Memory) -> str | None:
    """Source timestamp when the message had one, else the persistence time."""
    if m.timestamp_ms is not None:
        iso = _iso_utc(m.timestamp_ms)
        if iso is not None:
            return iso
    return _iso_utc(m.created_at)


def _unauthorized(reason: str) -> HTTPException:
    return HTTPException(status_code=401, detail={"reason": reason})


def _auth_dependency(auth: str | None, secret: str | None):
    """Build the dependency that checks credentials; never logs or echoes the secret."""
    if auth is None or auth.lower() == "none":
        return lambda: None
    if auth not in AUTH_SCHEMES:
        raise ValueError(f"auth must be one of {AUTH_SCHEMES} or None, got {auth!r}")
    if not secret:
        raise ValueError(f"auth={auth!r} needs a non-empty secret")
    expected = secret.encode("utf-8")

    def check(request: Request) -> None:
        if auth == "X-Api-Key":
            given = request.headers.get("x-api-key")
            if given is None:
                raise _unauthorized("missing X-Api-Key header")
        else:
            header = request.headers.get("authorization")
            if header is None:
                raise _unauthorized(f"missing Authorization header (expected scheme {auth})")
            scheme, _, given = header.partition(" ")
            if scheme.lower() != auth.lower():
                raise _unauthorized(f"wrong Authorization scheme (expected {auth})")
            given = given.strip()
        if not hmac.compare_digest(given.encode("utf-8"), expected):
            raise _unauthorized("invalid credentials")

    return check


def create_app(db_path: Path, *, auth: str | None = None, secret: str | None = None,
               media: MediaLimits | None = None, search: Searcher | None = None) -> FastAPI:
    """Create the reference memory system app.

    Args:
        db_path: SQLite file holding the memories (created if missing; reused across restarts).
        auth: ``"Token"``, ``"Bearer"``, ``"X-Api-Key"``, or None / ``"none"`` for no authentication.
        secret: the expected secret; required when ``auth`` is set.
        media: accept content parts under these limits (Multimodal); None accepts strings only.
        search: a baseline's Search (:func:`aml_ray.reference.baselines.searcher`) instead of BM25; Adds are
            stored the same way.

    Returns:
        The FastAPI application. Its store and index are on ``app.state.store`` / ``app.state.index``.

    Raises:
        ValueError: unknown ``auth`` scheme, or a scheme without a secret.
    """
    check_auth = _auth_dependency(auth, secret)
    baseline_search = search  # the route functions below are named search
    store = MemoryStore(db_path)
    index = BM25Index(store.memories)
    app = FastAPI(title="aml-ray reference memory (BM25)", version="1")
    app.state.store = store
    app.state.index = index
    app.state.duplicate_adds = 0

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/stats")
    def stats() -> dict[str, Any]:
        """Counters for drills: stored memories, applied Add requests, re-sent Adds acknowledged
        without storing (idempotency), and the faults injected when run as the chaos participant."""
        chaos = getattr(app.state, "chaos", None)
        return {**store.totals(), "duplicate_adds_acknowledged": app.state.duplicate_adds,
                "faults_injected": dict(chaos.injected) if chaos else {}}

    def validated(model, raw: Any):
        """Multimodal bodies: validated with the media limits as context; errors are FastAPI's 422."""
        try:
            return model.model_validate(raw, context=media_context(media))
        except ValidationError as exc:
            raise RequestValidationError(exc.errors(include_url=False, include_context=False),
                                         body=None) from None

    def do_add(body: AddRequest) -> dict[str, Any]:
        try:
            stored = store.add(body)
        except RequestConflict:
            raise HTTPException(status_code=409, detail={
                "reason": "request_id was already applied with a different body; a retry must resend "
                          "the same body, a new chunk needs a new request_id"}) from None
        if stored:
            index.mark_dirty(body.user_id)
        else:
            app.state.duplicate_adds += 1
        return {"success": True, "request_id": body.request_id, "user_id": body.user_id,
                "session_id": body.session_id}

    def do_search(body: SearchRequest) -> dict[str, Any]:
        if baseline_search is not None:
            return {"data": baseline_search(store, body)}
        hits = index.search(body.user_id, text_of(body.query), body.top_k)
        return {"data": [{"id": h.memory.id, "content": store.content_parts(h.memory), "score": h.score,
                          "created_at": _created_at(h.memory)} for h in hits]}

    if media is None:
        @app.post("/add", dependencies=[Depends(check_auth)], response_model=AddResponseModel)
        def add(body: AddRequest) -> dict[str, Any]:
            return do_add(body)

        @app.post("/search", dependencies=[Depends(check_auth)], response_model=SearchResponseModel)
        def search(body: SearchRequest) -> dict[str, Any]:
            return do_search(body)
    else:
        @app.post("/add", dependencies=[Depends(check_auth)], response_model=AddResponseModel)
        def add_multimodal(body: dict[str, Any] = Body(...)) -> dict[str, Any]:
            return do_add(validated(AddRequest, body))

        @app.post("/search", dependencies=[Depends(check_auth)])
        def search_multimodal(body: dict[str, Any] = Body(...)) -> dict[str, Any]:
            return do_search(validated(SearchRequest, body))

    return app
