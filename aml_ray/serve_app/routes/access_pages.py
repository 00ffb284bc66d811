"""The submitter's pages: the Evaluation Access Request form and the request's status page.

- ``GET /apply`` / ``POST /apply``: the seed's "Evaluation Access Request" (a new key, or a new version
  for the key you hold) through ``POST /api/access-requests``'s function; the answer page shows the
  one-time status token.
- ``GET /access-requests/status`` / ``POST``: type the status token (a form body, never a URL) to read the
  decision; after a ``new_key`` approval the Leaderboard API key is shown once (:mod:`aml_ray.store.delivery`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData

from aml_ray.serve_app.deps import ServiceDep, SessionDep
from aml_ray.serve_app.page_forms import REFUSALS, refusal_messages
from aml_ray.serve_app.routes.access import StatusIn, access_request_status, submit_access_request
from aml_ray.serve_app.schemas import AccessRequestIn
from aml_ray.serve_app.templating import render
from aml_ray.store.keys import find_key

router = APIRouter(tags=["pages"], include_in_schema=False)

#: Text fields of the form, as ``AccessRequestIn`` names them (blank optional ones are left out).
TEXT_FIELDS = ("kind", "contact_name", "contact_email", "organization", "system_name", "version_label", "track",
               "division", "description", "public_info", "add_url", "search_url", "health_url", "add_status_url",
               "auth_scheme", "max_in_flight", "requests_per_s", "timeout_s", "repository_url", "commit",
               "attribution", "method_changes")
#: Form fields that hold a secret: read, never rendered back.
SECRET_FIELDS = ("memory_system_key", "existing_key")
MAX_FIELD_CHARS = 10_000


def _form_values(form: FormData) -> dict[str, str]:
    return {name: str(form.get(name) or "")[:MAX_FIELD_CHARS] for name in TEXT_FIELDS}


@router.get("/apply", response_class=HTMLResponse)
def apply_page(request: Request) -> HTMLResponse:
    """The Evaluation Access Request form."""
    return render(request, "apply.html", {"form": {"kind": "new_key", "max_in_flight": "16", "timeout_s": "1800"}})


@router.post("/apply", response_class=HTMLResponse)
async def apply_submit(request: Request, session: SessionDep, service: ServiceDep) -> Response:
    """Submit the request: validated and health-checked like the API; the answer shows the status token once."""
    form = await request.form()
    values = _form_values(form)
    body: dict[str, Any] = {k: v.strip() for k, v in values.items() if v.strip()}
    secret = str(form.get("memory_system_key") or "")
    if secret:
        body["memory_system_key"] = secret
    key = None
    try:
        if body.get("kind") == "add_version":
            existing = str(form.get("existing_key") or "").strip()
            key = find_key(session, existing) if existing else None
            if key is None:
                raise ValueError("existing_key: a new version needs your valid Leaderboard API key")
        # in the thread pool: the health check blocks, and this route's event loop serves every request
        created = await run_in_threadpool(submit_access_request, AccessRequestIn.model_validate(body), session,
                                          service, request, key)
    except (*REFUSALS, ValueError) as exc:
        session.rollback()
        status_code, messages = refusal_messages(exc) if isinstance(exc, REFUSALS) else (422, [str(exc)])
        return render(request, "apply.html", {"form": values, "messages": messages}, status_code=status_code)
    session.commit()
    return render(request, "apply_done.html", {"created": created}, status_code=201)


@router.get("/access-requests/status", response_class=HTMLResponse)
def status_page(request: Request) -> HTMLResponse:
    """The status form: type the status token you received at submission."""
    return render(request, "access_status.html", {})


@router.post("/access-requests/status", response_class=HTMLResponse)
def status_submit(request: Request, session: SessionDep, service: ServiceDep,
                  status_token: Annotated[str, Form(max_length=200)] = "") -> Response:
    """The request's decision; the issued Leaderboard API key once, on the first read after approval."""
    try:
        out = access_request_status(StatusIn(status_token=status_token.strip()), session, service)
    except REFUSALS as exc:
        session.rollback()
        status_code, messages = refusal_messages(exc)
        return render(request, "access_status.html", {"messages": messages}, status_code=status_code)
    session.commit()
    return render(request, "access_status.html", {"req": out})
