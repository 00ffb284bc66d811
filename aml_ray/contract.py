"""The AML Add/Search contract: request and response models with strict validation.

Source of every rule here: the AML API guide and user documentation (`shared/seeds/`), sections
"Add / Search contract" and "Error handling". A success response that breaks a rule raises
:class:`ContractError`, which names the field; the pipeline stops the stage on it and never retries it.

Shapes (Textual track; content is a string):

- Add request: ``{request_id, messages: [{role, content, timestamp?}], user_id, session_id}``
- Add response (HTTP 200): ``{success: true, request_id, user_id, session_id}``, ids echoed byte for byte.
  HTTP 202 only when the version has a bound Add-status URL containing ``{task_id}``; then the body must
  carry a non-empty ``task_id``.
- Search request: ``{query, options?, user_id, top_k}``
- Search response (HTTP 200): ``{data: [{id, content, score?, created_at?}]}``, at most ``top_k`` items,
  each with a non-empty string ``id`` and ``content``; undeclared fields are ignored.

Multimodal track: ``content`` (Add message, returned memory) and the Search ``query`` may also be a
non-empty ordered array of ``text`` / ``image_url`` parts (:mod:`aml_ray.media` has the rules). Parts are
accepted only when the caller passes the suite's :class:`~aml_ray.media.MediaLimits`: as the validation
context of the models (``AddRequest.model_validate(d, context=media_context(limits))``) and as
``media=`` of :func:`validate_search_response`. Without it (Textual, Coding) a part array is an error
that names the field.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationInfo, field_validator,
                      model_validator)
from typing_extensions import TypedDict

from aml_ray.contract_errors import ContractError  # noqa: F401  (re-exported: the contract's error)
from aml_ray.media import MediaLimits, check_parts, check_request_total, limits_from_context

#: Formal Top K of external evaluations (seed: "Formal Top K 100").
FORMAL_TOP_K = 100


#: A content value: a non-empty string, or (Multimodal only) an ordered array of parts.
Content = Annotated[str, Field(min_length=1)] | list[dict[str, Any]]
_PARTS_REFUSED = ("content parts (an array) are accepted only in the Multimodal track; Textual and Coding "
                  "send a non-empty string")


def _check_content(value: Any, field: str, info: ValidationInfo) -> Any:
    """Shared validator of ``content`` / ``query``: strings pass, part arrays need media limits."""
    if isinstance(value, str):
        return value
    limits = limits_from_context(info.context)
    if limits is None:
        raise ValueError(f"{field}: {_PARTS_REFUSED}")
    try:
        check_parts(value, field, limits)
    except ContractError as exc:
        raise ValueError(f"{exc.field}: {exc.reason}") from None
    return value


def _image_bytes(value: Any) -> int:
    """Decoded image bytes of an already validated content value (0 for a string)."""
    if isinstance(value, str):
        return 0
    return sum(len(p["image_url"]["url"]) * 3 // 4 for p in value if p.get("type") == "image_url")


class Message(BaseModel):
    """One message of an Add request. ``timestamp`` is Unix time in milliseconds (UTC).

    ``content`` is a non-empty string; in the Multimodal track (validation context with media limits)
    also a non-empty array of parts.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["user", "assistant", "system", "tool"]
    content: Content
    timestamp: int | None = None

    @field_validator("content")
    @classmethod
    def _content(cls, v: Any, info: ValidationInfo) -> Any:
        return _check_content(v, "content", info)


class AddRequest(BaseModel):
    """Body of POST Add. ``messages`` is non-empty and ordered as in the source session.

    Multimodal: the images of all messages together stay within the media limits' ``max_request_bytes``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    user_id: str = Field(min_length=1)
    session_id: str = Field(min_length=1)

    @model_validator(mode="after")
    def _request_total(self, info: ValidationInfo) -> AddRequest:
        limits = limits_from_context(info.context)
        if limits is not None:
            total = sum(_image_bytes(m.content) for m in self.messages)
            try:
                check_request_total(total, "messages", limits)
            except ContractError as exc:
                raise ValueError(f"{exc.field}: {exc.reason}") from None
        return self


class SearchRequest(BaseModel):
    """Body of POST Search. ``options`` only for multiple-choice questions; never holds the gold.

    ``query`` is the original question: a non-empty string, or in the Multimodal track an array of parts.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    query: Content
    options: list[str] | None = None
    user_id: str = Field(min_length=1)
    top_k: int = Field(ge=1)

    @field_validator("query")
    @classmethod
    def _query(cls, v: Any, info: ValidationInfo) -> Any:
        v = _check_content(v, "query", info)
        limits = limits_from_context(info.context)
        if limits is not None:
            try:
                check_request_total(_image_bytes(v), "query", limits)
            except ContractError as exc:
                raise ValueError(f"{exc.field}: {exc.reason}") from None
        return v

    def to_body(self) -> dict[str, Any]:
        """The JSON body; ``options`` is omitted for open questions (seed: "omitted for open questions")."""
        return self.model_dump(exclude_none=True)


class MemoryItem(BaseModel):
    """One retrieved memory, as accepted from a Search response (declared fields only)."""

    model_config = ConfigDict(frozen=True)

    id: str
    content: str | list[dict[str, Any]]
    score: float | None = None
    created_at: str | None = None


def _fail(field: str, reason: str, request_id: str | None = None) -> None:
    raise ContractError(field, reason, request_id)


def validate_add_response(
    request: AddRequest, status: int, body: Any, *, add_status_url: str | None = None
) -> str | None:
    """Check a successful Add response against the contract.

    Args:
        request: the request that was sent.
        status: HTTP status, 200 or 202 (other statuses are handled by the retry policy, not here).
        body: the decoded JSON body (any JSON value).
        add_status_url: the version's bound Add-status URL template (must contain ``{task_id}``), or None.

    Returns:
        None for a synchronous 200; the ``task_id`` for an accepted 202 that must be polled.

    Raises:
        ContractError: naming the field (``success``, ``request_id``, ``user_id``, ``session_id``,
            ``task_id`` or ``status``).
    """
    rid = request.request_id
    if not isinstance(body, dict):
        _fail("body", f"must be a JSON object, got {type(body).__name__}", rid)
    if status == 202:
        if not add_status_url or "{task_id}" not in add_status_url:
            _fail("status", "HTTP 202 without a bound Add-status URL is a contract error; return 200 "
                  "after the write is persisted", rid)
        task_id = body.get("task_id")
        if not isinstance(task_id, str) or not task_id:
            _fail("task_id", "HTTP 202 must return a non-empty string task_id", rid)
        return task_id
    if status != 200:
        _fail("status", f"expected HTTP 200, got {status}", rid)
    if body.get("success") is not True:
        _fail("success", f"must be the boolean true, got {body.get('success')!r}", rid)
    for name in ("request_id", "user_id", "session_id"):
        sent = getattr(request, name)
        got = body.get(name)
        if not isinstance(got, str) or got != sent:
            _fail(name, f"must echo the request byte for byte: sent {sent!r}, got {got!r}", rid)
    return None


def validate_search_response(
    request: SearchRequest, status: int, body: Any, *, request_id: str | None = None,
    media: MediaLimits | None = None,
) -> list[MemoryItem]:
    """Check a Search response and return its items in participant order.

    Args:
        request: the request that was sent (its ``top_k`` bounds the item count).
        status: HTTP status; only 200 is a success.
        body: the decoded JSON body.
        request_id: the platform's id for this question, used in error messages.
        media: the Multimodal suite's media limits; when given, an item's ``content`` may be an array
            of parts (checked by :func:`aml_ray.media.check_parts`, undeclared part keys dropped, images
            of the whole response within ``max_request_bytes``). None: strings only.

    Returns:
        The items, in the participant's order, with only the declared fields.

    Raises:
        ContractError: ``data`` missing or not an array, more than ``top_k`` items (never truncated; the
            message names the question, its user_id and both counts),
            an item that is not an object, or an item whose ``id``/``content`` is not a non-empty
            string, a non-numeric ``score``, a non-string ``created_at``.
    """
    if status != 200:
        _fail("status", f"expected HTTP 200, got {status}", request_id)
    if not isinstance(body, dict):
        _fail("data", "the response must be a JSON object with a 'data' array, not a "
              f"top-level {type(body).__name__}", request_id)
    data = body.get("data")
    if not isinstance(data, list):
        _fail("data", f"must be an array (no 'items' wrapper), got {type(data).__name__}", request_id)
    if len(data) > request.top_k:
        n, k = len(data), request.top_k
        question = f"question {request_id}" if request_id else "a question"
        _fail("data", f"{question} of user_id {request.user_id!r} returned {n} items for top_k={k} ({n} > {k}); "
              "excess items are a contract error and are not truncated", request_id)
    items: list[MemoryItem] = []
    image_total = 0
    for i, raw in enumerate(data):
        where = f"data[{i}]"
        if not isinstance(raw, dict):
            _fail(where, "each item must be an object", request_id)
        content = raw.get("content")
        if isinstance(content, list):
            if media is None:
                _fail(f"{where}.content", _PARTS_REFUSED, request_id)
            image_total += check_parts(content, f"{where}.content", media, request_id=request_id,
                                       strict_keys=False)
            check_request_total(image_total, f"{where}.content", media, request_id)
        for name in ("id", "content") if not isinstance(content, list) else ("id",):
            value = raw.get(name)
            if not isinstance(value, str) or not value.strip():
                _fail(f"{where}.{name}", f"must be a non-empty string, got {value!r}"[:200], request_id)
        score = raw.get("score")
        if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))
                                  or not math.isfinite(score)):
            _fail(f"{where}.score", f"must be a finite number when present, got {score!r}", request_id)
        created_at = raw.get("created_at")
        if created_at is not None and not isinstance(created_at, (str, int, float)):
            _fail(f"{where}.created_at", "must be a timestamp string or number when present", request_id)
        if isinstance(content, list):
            from aml_ray.media import declared_parts

            content = declared_parts(content)
        items.append(MemoryItem(
            id=raw["id"], content=content,
            score=float(score) if score is not None else None,
            created_at=str(created_at) if created_at is not None else None,
        ))
    return items


_StrictNumber = Annotated[float, Field(strict=True, allow_inf_nan=False)]


#: Matches a string that is not blank: one character that ``str.isspace()`` is false for (the full checks'
#: rule is ``s.strip() != ""``). The class lists every code point that Python 3.11's ``str.isspace()`` is
#: true for (the Unicode White_Space set and U+001C..U+001F); ``tests/test_search_memories.py`` checks it
#: against ``str.isspace()`` over every code point. Rust regex syntax (pydantic-core's engine).
NOT_BLANK = (r"[^\t\n\x0B\x0C\r\x1C-\x1F \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}"
             r"\x{205F}\x{3000}]")
_FastText = Annotated[str, Field(strict=True, pattern=NOT_BLANK)]


class _FastItem(TypedDict):
    """One memory as :func:`search_memories` returns it, built by pydantic-core with no Python loop.

    ``score`` and ``created_at`` default to None; a numeric ``created_at`` becomes its ``str()``, as the
    full checks make it.
    """

    __pydantic_config__ = ConfigDict(extra="ignore")  # type: ignore[misc]
    id: _FastText
    content: _FastText
    score: Annotated[_StrictNumber | None, Field(default=None)]
    created_at: Annotated[Annotated[str, Field(strict=True)] | Annotated[int, Field(strict=True), AfterValidator(str)]
                          | Annotated[_StrictNumber, AfterValidator(str)] | None, Field(default=None)]


class _FastBody(TypedDict):
    data: list[_FastItem]


#: Parses and type-checks a text Search body in one pass over the bytes (pydantic-core's JSON parser).
_FAST_SEARCH = TypeAdapter(_FastBody)


def search_memories(raw: bytes, status: int, request: SearchRequest, *, request_id: str | None = None,
                    media: MediaLimits | None = None) -> list[dict[str, Any]]:
    """Decode and check a Search response body; return its memories in participant order.

    The rules are :func:`validate_search_response`'s (it stays the one statement of them). This is its
    hot path: a body of string memories is parsed and type-checked by one pydantic-core pass over the
    bytes (measured about ten times faster than ``json.loads`` plus the item checks: docs/benchmarks.md);
    anything that pass does not accept (a part array, a bad field, invalid JSON, more than
    ``top_k`` items) goes through ``json.loads`` and :func:`validate_search_response`, so a broken body
    gets the same :class:`ContractError`, naming the same field, either way.

    Args:
        raw: the response body bytes.
        status: the HTTP status (only 200 is a success).
        request: the request that was sent (``top_k``).
        request_id: the platform's id for the question (error messages).
        media: the Multimodal suite's media limits, or None (strings only).

    Returns:
        ``[{"id", "content", "score", "created_at"}]``: score a float or None, created_at a string or None;
        ``content`` is a list of declared parts for a Multimodal memory returned as parts.

    Raises:
        ContractError: field ``body`` when the body is not JSON; otherwise as
            :func:`validate_search_response`.
    """
    if status == 200:
        try:
            data = _FAST_SEARCH.validate_json(raw)["data"]
        except ValueError:  # ValidationError is a ValueError: not a plain text body, take the full checks
            data = None
        if data is not None and len(data) <= request.top_k:
            return data
    try:
        body = json.loads(raw)
    except ValueError:
        _fail("body", f"HTTP {status} body is not valid JSON: {raw[:120].decode('utf-8', 'replace')!r}", request_id)
    items = validate_search_response(request, status, body, request_id=request_id, media=media)
    return [{"id": i.id, "content": i.content, "score": i.score, "created_at": i.created_at} for i in items]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore")


class AddResponseModel(_Strict):
    """Response model used by the reference server's OpenAPI (platform validation is in the functions)."""

    success: bool
    request_id: str
    user_id: str
    session_id: str


class SearchResponseModel(_Strict):
    """Response model used by the reference server's OpenAPI."""

    data: list[MemoryItem]

    @field_validator("data")
    @classmethod
    def _non_empty_fields(cls, v: list[MemoryItem]) -> list[MemoryItem]:
        for item in v:
            if not item.id or not item.content:
                raise ValueError("id and content must be non-empty")
        return v
