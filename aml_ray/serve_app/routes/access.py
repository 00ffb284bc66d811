"""``POST /api/access-requests``: apply for a key, or add a version to the key you hold."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException
from fastapi.exceptions import RequestValidationError

from aml_ray.security import EndpointRejected, check_health, validate_endpoint_url
from aml_ray.serve_app.deps import ServiceDep, SessionDep, optional_key
from aml_ray.serve_app.schemas import AccessRequestIn, AccessRequestOut
from aml_ray.store.access import create_access_request
from aml_ray.store.keys import store_credential
from aml_ray.store.models import AccessRequest, LeaderboardKey

router = APIRouter(prefix="/api/access-requests", tags=["access"])
URL_FIELDS = ("add_url", "search_url", "health_url", "add_status_url")


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


@router.post("", status_code=201, response_model=AccessRequestOut)
def submit_access_request(body: AccessRequestIn, session: SessionDep, service: ServiceDep,
                          key: Annotated[LeaderboardKey | None, Depends(optional_key)]) -> AccessRequestOut:
    """Submit an access request; endpoints are validated and the health URL is called (GET, no redirects).

    ``kind="new_key"``: approval issues a new Leaderboard API key. ``kind="add_version"``: send your key in
    ``Authorization: Bearer``; approval binds the version to it. The Memory System Key is encrypted at rest
    and never returned.
    """
    if body.kind == "add_version" and key is None:
        raise HTTPException(401, {"reason": "add_version requests must send the existing Leaderboard API key "
                                            "(Authorization: Bearer aml_...)"})
    pinned = validate_urls(body, allow_loopback=service.settings.allow_loopback)
    health = None
    if "health_url" in pinned and service.settings.health_check:
        ok, health = check_health(pinned["health_url"])
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
    return request_out(create_access_request(session, fields))
