"""Admin pages: sign-in with ``AML_ADMIN_TOKEN``, access requests, the review queue, benchmark proposals.

- ``/admin`` (sign-in form) -> ``POST /admin/login`` -> a signed, ``HttpOnly`` cookie scoped to ``/admin``
  (:mod:`aml_ray.serve_app.page_session`); ``POST /admin/logout`` ends it.
- ``/admin/access-requests``: every field a request submitted (contact, system, endpoints, auth scheme and
  capacity, repository, commit, attribution, method changes, health check), approve / reject.
- ``/admin/reviews``: completed full jobs with system, version, scores and each publication-gate check,
  approve / reject.
- ``/admin/proposals``: benchmark proposals.

The actions call the same functions as the JSON admin routes (so each one writes its ``admin_actions``
row). Approving a ``new_key`` request does not show the key here: it waits, encrypted, for the
submitter's status page (:mod:`aml_ray.store.delivery`); only a request without a status token (made
before tokens existed) shows its key to the admin, once.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sqlalchemy import select

from aml_ray.security import tokens_equal
from aml_ray.serve_app.deps import ADMIN_ACTOR, ServiceDep, SessionDep
from aml_ray.serve_app.page_forms import REFUSALS, refusal_messages
from aml_ray.serve_app.page_session import (ADMIN_COOKIE, ADMIN_PATH, end_session, is_admin_session,
                                            start_admin_session)
from aml_ray.serve_app.routes.admin import approve, approve_request, reject, reject_request
from aml_ray.serve_app.schemas import Decision
from aml_ray.serve_app.templating import render
from aml_ray.store.access import list_access_requests
from aml_ray.store.models import Job, Result, Version
from aml_ray.store.proposals import list_proposals
from aml_ray.store.results import list_reviews

router = APIRouter(prefix="/admin", tags=["pages"], include_in_schema=False)
STATUSES = ("pending", "approved", "rejected", "all")


def _signed_in(request: Request, service) -> bool:
    return is_admin_session(request, service)


def _to_login() -> Response:
    return RedirectResponse("/admin", status_code=303)


@router.get("", response_class=HTMLResponse)
def admin_home(request: Request, service: ServiceDep) -> Response:
    """The sign-in form, or (signed in) the admin's pages."""
    if _signed_in(request, service):
        return RedirectResponse("/admin/access-requests", status_code=303)
    enabled = bool(service.settings.admin_token and service.settings.admin_token.get_secret_value())
    return render(request, "admin_login.html", {"enabled": enabled}, status_code=200 if enabled else 503)


@router.post("/login", response_class=HTMLResponse)
def admin_login(request: Request, service: ServiceDep, token: Annotated[str, Form(max_length=500)] = "") -> Response:
    """Check the admin token (constant time); start the admin page session."""
    expected = service.settings.admin_token
    if expected is None or not expected.get_secret_value():
        return render(request, "admin_login.html", {"enabled": False}, status_code=503)
    if not token or not tokens_equal(token, expected.get_secret_value()):
        return render(request, "admin_login.html", {"enabled": True, "error": "Wrong admin token."}, status_code=401)
    response = RedirectResponse("/admin/access-requests", status_code=303)
    start_admin_session(response, request, service)
    return response


@router.post("/logout")
def admin_logout() -> Response:
    """End the admin page session."""
    response = RedirectResponse("/admin", status_code=303)
    end_session(response, ADMIN_COOKIE, ADMIN_PATH)
    return response


def _requests_page(request, session, status: str, *, notice: str | None = None, messages=(), new_key: str | None = None,
                   status_code: int = 200) -> HTMLResponse:
    rows = list_access_requests(session, None if status == "all" else status)
    return render(request, "admin_requests.html", {
        "rows": rows, "status": status, "statuses": STATUSES, "notice": notice, "messages": list(messages),
        "new_key": new_key}, status_code=status_code)


def _decide(session, action: Callable[[], Any], refused_page: Callable[..., Response]) -> Any:
    """Run an admin decision in ``session``: its result after a commit, or, when the API refuses it
    (:data:`REFUSALS`), ``refused_page`` with the refusal's messages after a rollback (nothing is kept)."""
    try:
        result = action()
    except REFUSALS as exc:
        session.rollback()
        status_code, messages = refusal_messages(exc)
        return refused_page(messages=messages, status_code=status_code)
    session.commit()
    return result


@router.get("/access-requests", response_class=HTMLResponse)
def access_requests_page(request: Request, session: SessionDep, service: ServiceDep, status: str = "pending") -> Response:
    """Access requests with everything submitted (default: pending)."""
    if not _signed_in(request, service):
        return _to_login()
    return _requests_page(request, session, status if status in STATUSES else "pending")


@router.post("/access-requests/{request_id}/approve", response_class=HTMLResponse)
def approve_request_page(request: Request, request_id: str, session: SessionDep, service: ServiceDep) -> Response:
    """Approve a request (a new key goes to the submitter's status page, not to this page)."""
    if not _signed_in(request, service):
        return _to_login()
    body = _decide(session, lambda: approve_request(request_id, ADMIN_ACTOR, session, service),
                   partial(_requests_page, request, session, "pending"))
    if isinstance(body, Response):
        return body
    notice = f"Approved {request_id}: version {body['version_id']} bound."
    new_key = None
    if "leaderboard_key" in body:
        if body.get("delivered_to_submitter"):
            notice += " The new Leaderboard API key waits, encrypted, on the submitter's status page."
        else:
            new_key = body["leaderboard_key"]
    return _requests_page(request, session, "pending", notice=notice, new_key=new_key)


@router.post("/access-requests/{request_id}/reject", response_class=HTMLResponse)
def reject_request_page(request: Request, request_id: str, session: SessionDep, service: ServiceDep,
                        reason: Annotated[str, Form(max_length=2000)] = "") -> Response:
    """Reject a request with a reason (shown to the submitter on the status page)."""
    if not _signed_in(request, service):
        return _to_login()
    done = _decide(session, lambda: reject_request(request_id, Decision(reason=reason.strip()), ADMIN_ACTOR, session),
                   partial(_requests_page, request, session, "pending"))
    if isinstance(done, Response):
        return done
    return _requests_page(request, session, "pending", notice=f"Rejected {request_id}.")


def _review_rows(session, status: str) -> list[dict[str, Any]]:
    out = []
    for review in list_reviews(session, None if status == "all" else status):
        job = session.get(Job, review.job_id)
        version = session.get(Version, job.version_id)
        result = session.scalar(select(Result).where(Result.job_id == job.id))
        out.append({"review": review, "job": job, "version": version, "system": version.system, "result": result})
    return out


def _reviews_page(request, session, status: str, *, notice=None, messages=(), status_code=200) -> HTMLResponse:
    return render(request, "admin_reviews.html", {
        "rows": _review_rows(session, status), "status": status, "statuses": STATUSES, "notice": notice,
        "messages": list(messages)}, status_code=status_code)


@router.get("/reviews", response_class=HTMLResponse)
def reviews_page(request: Request, session: SessionDep, service: ServiceDep, status: str = "pending") -> Response:
    """The review queue: system, version, scores and gate checks of each completed full job."""
    if not _signed_in(request, service):
        return _to_login()
    return _reviews_page(request, session, status if status in STATUSES else "pending")


@router.post("/reviews/{review_id}/approve", response_class=HTMLResponse)
def approve_review_page(request: Request, review_id: str, session: SessionDep, service: ServiceDep) -> Response:
    """Publish a reviewed result (refused while a gate check failed)."""
    if not _signed_in(request, service):
        return _to_login()
    body = _decide(session, lambda: approve(review_id, ADMIN_ACTOR, session),
                   partial(_reviews_page, request, session, "pending"))
    if isinstance(body, Response):
        return body
    return _reviews_page(request, session, "pending", notice=(
        f"Approved {review_id}: published on the {body['track']} board as {body['public_submission_id']}."))


@router.post("/reviews/{review_id}/reject", response_class=HTMLResponse)
def reject_review_page(request: Request, review_id: str, session: SessionDep, service: ServiceDep,
                       reason: Annotated[str, Form(max_length=2000)] = "") -> Response:
    """Reject a reviewed result: it stays private."""
    if not _signed_in(request, service):
        return _to_login()
    done = _decide(session, lambda: reject(review_id, Decision(reason=reason.strip()), ADMIN_ACTOR, session),
                   partial(_reviews_page, request, session, "pending"))
    if isinstance(done, Response):
        return done
    return _reviews_page(request, session, "pending", notice=f"Rejected {review_id}: the result stays private.")


@router.get("/proposals", response_class=HTMLResponse)
def proposals_page(request: Request, session: SessionDep, service: ServiceDep) -> Response:
    """Benchmark proposals, newest first."""
    if not _signed_in(request, service):
        return _to_login()
    return render(request, "admin_proposals.html", {"rows": list_proposals(session)})
