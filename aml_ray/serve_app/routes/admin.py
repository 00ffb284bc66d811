"""Admin routes (``Authorization: Bearer $AML_ADMIN_TOKEN``): approvals, reviews, key rotation, audit log.

Every action writes an ``admin_actions`` row in the same transaction as the action.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter

from aml_ray.serve_app.deps import AdminDep, ServiceDep, SessionDep
from aml_ray.serve_app.routes.access import request_out
from aml_ray.serve_app.schemas import AccessRequestOut, Decision
from aml_ray.store.access import approve_access_request, list_access_requests, reject_access_request
from aml_ray.store.audit import admin_actions, log_admin_action
from aml_ray.store.delivery import hold_issued_key
from aml_ray.store.keys import rotate_credentials
from aml_ray.store.results import approve_review, list_reviews, reject_review

router = APIRouter(prefix="/api/admin", tags=["admin"])
#: The ``status`` filter of the admin lists: one decision state, or ``all`` rows.
StatusFilter = Literal["pending", "approved", "rejected", "all"]


def _status(value: StatusFilter) -> str | None:
    return None if value == "all" else value


@router.get("/access-requests", response_model=list[AccessRequestOut])
def access_requests(admin: AdminDep, session: SessionDep, status: StatusFilter = "pending") -> list[AccessRequestOut]:
    """Access requests, oldest first: ``pending`` (default), ``approved``, ``rejected`` or ``all``."""
    return [request_out(r) for r in list_access_requests(session, _status(status))]


@router.post("/access-requests/{request_id}/approve")
def approve_request(request_id: str, admin: AdminDep, session: SessionDep, service: ServiceDep) -> dict[str, Any]:
    """Approve: a ``new_key`` request returns the new Leaderboard API key, once; it is stored only as a hash.

    The key is also held, encrypted, for the submitter's status read (``delivered_to_submitter``), so the
    admin need not pass it on.
    """
    approval = approve_access_request(session, request_id, actor=admin)
    log_admin_action(session, actor=admin, action="access_request.approve", target=request_id,
                     detail={"version_id": approval.version.id, "kind": approval.request.kind})
    body: dict[str, Any] = {"request_id": request_id, "status": "approved", "version_id": approval.version.id,
                            "system_id": approval.version.system_id}
    if approval.key is not None:
        body["leaderboard_key"] = approval.key
        body["delivered_to_submitter"] = hold_issued_key(session, service.box, request_id, approval.key)
        body["note"] = "shown once: the platform keeps only a hash of this key"
    return body


@router.post("/access-requests/{request_id}/reject", response_model=AccessRequestOut)
def reject_request(request_id: str, decision: Decision, admin: AdminDep, session: SessionDep) -> AccessRequestOut:
    """Reject an access request with a reason."""
    row = reject_access_request(session, request_id, actor=admin, reason=decision.reason)
    log_admin_action(session, actor=admin, action="access_request.reject", target=request_id)
    return request_out(row)


def _review_out(review) -> dict[str, Any]:
    return {"id": review.id, "job_id": review.job_id, "status": review.status, "gate": review.gate,
            "reason": review.reason, "created_at": review.created_at.isoformat()}


@router.get("/reviews")
def reviews(admin: AdminDep, session: SessionDep, status: StatusFilter = "pending") -> list[dict[str, Any]]:
    """The review queue with each publication-gate check: ``pending`` (default), ``approved``, ``rejected``
    or ``all``."""
    return [_review_out(r) for r in list_reviews(session, _status(status))]


@router.post("/reviews/{review_id}/approve")
def approve(review_id: str, admin: AdminDep, session: SessionDep) -> dict[str, Any]:
    """Publish: 409 when the gate failed or the version is already on the board."""
    sub = approve_review(session, review_id, actor=admin)
    log_admin_action(session, actor=admin, action="review.approve", target=review_id,
                     detail={"public_submission_id": sub.id})
    return {"review_id": review_id, "status": "approved", "public_submission_id": sub.id, "track": sub.track}


@router.post("/reviews/{review_id}/reject")
def reject(review_id: str, decision: Decision, admin: AdminDep, session: SessionDep) -> dict[str, Any]:
    """Reject: the result stays private."""
    review = reject_review(session, review_id, actor=admin, reason=decision.reason)
    log_admin_action(session, actor=admin, action="review.reject", target=review_id)
    return _review_out(review)


@router.post("/credentials/rotate")
def rotate(admin: AdminDep, session: SessionDep, service: ServiceDep) -> dict[str, int]:
    """Re-encrypt every Memory System Key under the current (first) master key."""
    n = rotate_credentials(session, service.box)
    log_admin_action(session, actor=admin, action="credentials.rotate", target="*", detail={"rotated": n})
    return {"rotated": n}


@router.get("/actions")
def actions(admin: AdminDep, session: SessionDep, limit: int = 100) -> list[dict[str, Any]]:
    """The admin audit log, newest first."""
    return [{"id": a.id, "at": a.at.isoformat(), "actor": a.actor, "action": a.action, "target": a.target,
             "detail": a.detail} for a in admin_actions(session, min(max(limit, 1), 1000))]
