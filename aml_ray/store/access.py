"""Access requests and their approval: a new key (shown once) or a new version bound to an existing key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from aml_ray.store.errors import Conflict, NotFound
from aml_ray.store.keys import issue_key
from aml_ray.store.models import AccessRequest, System, Version, utcnow

#: Fields of ``AccessRequest.endpoints`` (declared endpoints, auth scheme and capacity).
ENDPOINT_FIELDS = ("add_url", "search_url", "health_url", "add_status_url", "auth_scheme",
                   "max_in_flight", "requests_per_s", "timeout_s")


@dataclass
class Approval:
    """What approving a request produced.

    Attributes:
        request: the decided request.
        version: the new version.
        key: the new Leaderboard API key in clear (new_key requests only; show it once), else None.
    """

    request: AccessRequest
    version: Version
    key: str | None


def create_access_request(session: Session, fields: dict[str, Any]) -> AccessRequest:
    """Store a pending request.

    Args:
        session: an open session.
        fields: column values (``endpoints`` a dict with :data:`ENDPOINT_FIELDS`; ``credential_id`` the
            opaque id of the already encrypted Memory System Key, or None for auth ``none``).

    Returns:
        The row.
    """
    row = AccessRequest(**fields)
    session.add(row)
    session.flush()
    return row


def get_access_request(session: Session, request_id: str) -> AccessRequest:
    """A request by id.

    Raises:
        NotFound: no such request.
    """
    row = session.get(AccessRequest, request_id)
    if row is None:
        raise NotFound(f"access request {request_id} not found")
    return row


def list_access_requests(session: Session, status: str | None = None) -> list[AccessRequest]:
    """Requests, oldest first, optionally only those with ``status``."""
    stmt = select(AccessRequest).order_by(AccessRequest.created_at)
    if status:
        stmt = stmt.where(AccessRequest.status == status)
    return list(session.scalars(stmt))


def _pending(session: Session, request_id: str) -> AccessRequest:
    row = get_access_request(session, request_id)
    if row.status != "pending":
        raise Conflict(f"access request {request_id} is already {row.status}")
    return row


def approve_access_request(session: Session, request_id: str, *, actor: str) -> Approval:
    """Approve: issue a key (``new_key``) or bind to the request's verified key (``add_version``).

    Args:
        session: an open session.
        request_id: the pending request.
        actor: the admin, recorded on the request.

    Returns:
        The :class:`Approval`.

    Raises:
        NotFound: unknown request.
        Conflict: already decided, or the system already has this version label on the track.
    """
    req = _pending(session, request_id)
    clear_key = None
    if req.kind == "add_version":
        key_id = req.existing_key_id
        if key_id is None:
            raise Conflict("add_version request has no verified key")
    else:
        key_row, clear_key = issue_key(session)
        key_id = key_row.id
    system = session.scalar(select(System).where(System.key_id == key_id, System.name == req.system_name))
    if system is None:
        system = System(key_id=key_id, name=req.system_name, organization=req.organization,
                        division=req.division)
        session.add(system)
        session.flush()
    exists = session.scalar(select(Version).where(Version.system_id == system.id,
                                                  Version.label == req.version_label,
                                                  Version.track == req.track))
    if exists is not None:
        raise Conflict(f"system {req.system_name!r} already has version {req.version_label!r} on "
                       f"track {req.track}")
    ep = req.endpoints
    version = Version(system_id=system.id, label=req.version_label, track=req.track,
                      add_url=ep["add_url"], search_url=ep["search_url"], health_url=ep.get("health_url"),
                      add_status_url=ep.get("add_status_url"), auth_scheme=ep["auth_scheme"],
                      credential_id=req.credential_id, max_in_flight=ep["max_in_flight"],
                      requests_per_s=ep.get("requests_per_s"), timeout_s=ep["timeout_s"],
                      repository_url=req.repository_url, commit=req.commit, attribution=req.attribution,
                      method_changes=req.method_changes)
    session.add(version)
    session.flush()
    req.status, req.decided_at, req.decided_by, req.version_id = "approved", utcnow(), actor, version.id
    return Approval(request=req, version=version, key=clear_key)


def reject_access_request(session: Session, request_id: str, *, actor: str, reason: str) -> AccessRequest:
    """Reject a pending request.

    Raises:
        NotFound: unknown request.
        Conflict: already decided.
    """
    req = _pending(session, request_id)
    req.status, req.decided_at, req.decided_by, req.decision_reason = "rejected", utcnow(), actor, reason
    return req
