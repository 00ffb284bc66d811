"""``POST /api/access-requests``: apply for a key, or add a version to the key you hold;
``POST /api/access-requests/status``: the submitter's view of the request, with the issued key once.

The 201 answer of a submission carries a one-time ``status_token`` (only its hash is stored,
:mod:`aml_ray.store.delivery`); the submitter sends it in the body of the status call (never in a URL)
to read the decision and, after a ``new_key`` approval, the Leaderboard API key, shown once.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from aml_ray.security import EndpointRejected, check_health, validate_endpoint_url
from aml_ray.serve_app.deps import ServiceDep, SessionDep, optional_key
from aml_ray.serve_app.schemas import AccessRequestIn, AccessRequestOut
from aml_ray.store.access import create_access_request
from aml_ray.store.delivery import issue_status_token, request_for_token, take_issued_key
from aml_ray.store.keys import store_credential
from aml_ray.store.models import AccessRequest, LeaderboardKey

router = APIRouter(prefix="/api/access-requests", tags=["access"])
URL_FIELDS = ("add_url", "search_url", "health_url", "add_status_url")


class AccessRequestCreated(AccessRequestOut):
    """The 201 answer: the stored request and its status token (shown once; only its hash is kept)."""

    status_token: str
    note: str = ("keep status_token private: POST it to /api/access-requests/status (or the page "
                 "/access-requests/status) to read the decision and, once approved, your Leaderboard API key")


class StatusIn(BaseModel):
    """``POST /api/access-requests/status``."""

    model_config = ConfigDict(extra="forbid")
    status_token: SecretStr = Field(max_length=200)


class StatusOut(AccessRequestOut):
    """The submitter's view: the decision, its reason, the bound version, and the new key once."""

    decision_reason: str | None
    version_id: str | None
    leaderboard_key: str | None = None
    key_note: str | None = None


def request_out(row: AccessRequest) -> AccessRequestOut:
    """The submitter's view of a request."""
    return AccessRequestOut(id=row.id, status=row.status, kind=row.kind, system_name=row.system_name,
                            version_label=row.version_label, track=row.track, division=row.division,
                            health=row.health_summary, has_memory_system_key=row.credential_id is not None)


def validate_urls(body: AccessRequestIn, *, allow_loopback: bool) -> dict:
    """Validate every submitted URL; 422 names each rejected field.

    Returns:
        ``{field: PinnedEndpoint}`` for the URLs given.

    Raises:
        RequestValidationError: one entry per rejected URL.
    """
    pinned, problems = {}, []
    for name in URL_FIELDS:
        url = getattr(body, name)
        if url is None:
            continue
        # {task_id} is filled in per task; validate the template with a placeholder value.
        try:
            pinned[name] = validate_endpoint_url(url.replace("{task_id}", "task"), allow_loopback=allow_loopback)
        except EndpointRejected as exc:
            problems.append({"loc": ("body", name), "msg": exc.reason, "type": "endpoint_rejected"})
    if problems:
        raise RequestValidationError(problems)
    return pinned


@router.post("", status_code=201, response_model=AccessRequestCreated)
def submit_access_request(body: AccessRequestIn, session: SessionDep, service: ServiceDep, request: Request,
                          key: Annotated[LeaderboardKey | None, Depends(optional_key)]) -> AccessRequestCreated:
    """Submit an access request; endpoints are validated and the health URL is called (GET, no redirects).

    ``kind="new_key"``: approval issues a new Leaderboard API key. ``kind="add_version"``: send your key in
    ``Authorization: Bearer``; approval binds the version to it. The Memory System Key is encrypted at rest
    and never returned. The answer's ``status_token`` is shown once.

    Refusals: 429 over the per-address rate limit, 503 while every health-check slot is taken
    (:mod:`aml_ray.serve_app.admission`); both with ``Retry-After``.
    """
    service.admission.admit(request.client.host if request.client else "unknown")
    if body.kind == "add_version" and key is None:
        raise HTTPException(401, {"reason": "add_version requests must send the existing Leaderboard API key "
                                            "(Authorization: Bearer aml_...)"})
    pinned = validate_urls(body, allow_loopback=service.settings.allow_loopback)
    health = None
    if "health_url" in pinned and service.settings.health_check:
        with service.admission.health_slot():
            ok, health = check_health(pinned["health_url"], timeout_s=service.settings.health_timeout_s)
        if not ok:
            raise HTTPException(422, {"reason": f"health check failed: GET health_url gave {health}; any 2xx "
                                                "is healthy"})
    credential_id = None
    if body.memory_system_key is not None and body.memory_system_key.get_secret_value():
        credential_id = store_credential(session, service.box, body.memory_system_key.get_secret_value()).id
    fields = body.model_dump(exclude={"memory_system_key", *URL_FIELDS, "auth_scheme", "max_in_flight",
                                      "requests_per_s", "timeout_s"})
    fields.update(endpoints={name: getattr(body, name) for name in (*URL_FIELDS, "auth_scheme", "max_in_flight",
                                                                   "requests_per_s", "timeout_s")},
                  credential_id=credential_id, health_summary=health,
                  existing_key_id=key.id if body.kind == "add_version" else None)
    row = create_access_request(session, fields)
    token = issue_status_token(session, row)
    return AccessRequestCreated(**request_out(row).model_dump(), status_token=token)


@router.post("/status", response_model=StatusOut)
def access_request_status(body: StatusIn, session: SessionDep, service: ServiceDep) -> StatusOut:
    """The request's status for its submitter; after a ``new_key`` approval the key is returned once.

    Refusals: 404 for an unknown token (the same answer whatever the reason).
    """
    found = request_for_token(session, body.status_token.get_secret_value())
    if found is None:
        raise HTTPException(404, {"reason": "no access request for this status token"})
    row, delivery = found
    key = take_issued_key(session, service.box, delivery) if row.status == "approved" else None
    return StatusOut(**request_out(row).model_dump(), decision_reason=row.decision_reason, version_id=row.version_id,
                     leaderboard_key=key.get_secret_value() if key else None,
                     key_note="shown once: the platform keeps only a hash of this key" if key else None)
