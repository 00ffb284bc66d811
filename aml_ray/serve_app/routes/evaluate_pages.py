"""The Evaluation page (seed: "Verify key, start eval jobs, inspect private results"), server-rendered.

- ``GET /evaluate``: verify a Leaderboard API key; once verified, the key's bound versions, the form that
  starts a job (version, run label, mode, the full-run checklist) and the key's jobs.
- ``POST /evaluate/key`` / ``POST /evaluate/forget``: start or end the page session
  (:mod:`aml_ray.serve_app.page_session`: a signed cookie with the key id, never the key). A job page
  opened without a session sends the browser to ``/evaluate?job=<id>``, whose form carries the id so
  that the verified key lands on that job's page (only a job id, never a URL: no open redirect).
- ``POST /evaluate/jobs``: the same rules as ``POST /api/jobs`` (it calls that route's function).
- ``GET /evaluate/jobs/{job_id}``: live status (stage, progress with done and failed counts, error
  summary) and, once scored, the private per-category table; ``/live`` is the fragment the page's
  script (``/static/evaluate.js``) fetches every 1.5 s while the job is queued or running.

Every job view answers 404 for another key's job, exactly like the API.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sqlalchemy import select

from aml_ray.serve_app.deps import ServiceDep, SessionDep
from aml_ray.serve_app.page_forms import REFUSALS, refusal_messages
from aml_ray.serve_app.panel_spread import job_panel
from aml_ray.serve_app.page_session import (KEY_COOKIE, KEY_PATH, end_session, session_key_id,
                                            start_key_session)
from aml_ray.serve_app.routes.jobs import job_out, submit_job
from aml_ray.serve_app.routes.keys import version_out
from aml_ray.serve_app.routes.pages import JOB_ID, JOB_ID_PATTERN
from aml_ray.serve_app.schemas import JobIn
from aml_ray.serve_app.templating import render
from aml_ray.store.errors import NotFound
from aml_ray.store.jobs import ACTIVE, get_job_for_key, jobs_for_key
from aml_ray.store.keys import find_key, version_for_key, versions_for_key
from aml_ray.store.models import LeaderboardKey, Result, Review

router = APIRouter(tags=["pages"], include_in_schema=False)

#: The full-run checklist as the page shows it (seed: "smoke passed, API contract followed, run
#: instructions complete, original work disclosed, and no integrity violations"); keys of ``Checklist``.
CHECKLIST_ITEMS = (
    ("smoke_passed", "A smoke run of this version passed."),
    ("contract_followed", "The Add / Search API follows the current contract."),
    ("run_instructions_complete", "The run instructions (endpoints, auth, capacity, limits) are complete."),
    ("original_work_disclosed", "Original work, authors, technical report and method changes are disclosed."),
    ("no_integrity_violation", "No integrity violation: no gold data, prompt injection or result manipulation."),
)
#: Seconds between two polls of a running job (the script reads it from the page).
POLL_INTERVAL_S = 1.5
#: The job whose page the key verification leads to (``?job=`` of ``/evaluate``, ``job`` of its form).
ReturnJob = Annotated[str | None, Query(max_length=64, pattern=JOB_ID_PATTERN)]


def _session_key(request: Request, service, session) -> LeaderboardKey | None:
    key_id = session_key_id(request, service)
    key = session.get(LeaderboardKey, key_id) if key_id else None
    return key if key is not None and key.revoked_at is None else None


def _evaluate_page(request, session, key, *, form: dict[str, Any] | None = None, messages=(), status_code=200,
                   verify_error: str | None = None, return_job: str | None = None) -> HTMLResponse:
    context: dict[str, Any] = {"key": key, "verify_error": verify_error, "messages": list(messages),
                               "checklist_items": CHECKLIST_ITEMS, "form": form or {}, "return_job": return_job}
    if key is not None:
        context["versions"] = [version_out(v) for v in versions_for_key(session, key.id)]
        context["jobs"] = [job_out(j) for j in jobs_for_key(session, key.id)]
    return render(request, "evaluate.html", context, status_code=status_code)


@router.get("/evaluate", response_class=HTMLResponse)
def evaluate_page(request: Request, session: SessionDep, service: ServiceDep, job: ReturnJob = None) -> Response:
    """The Evaluation page: verify a key, or (verified) start a job and list the key's jobs; a verified
    session with ``job`` goes on to that job's page."""
    key = _session_key(request, service, session)
    if key is not None and job:
        return RedirectResponse(f"/evaluate/jobs/{job}", status_code=303)
    return _evaluate_page(request, session, key, return_job=job)


@router.post("/evaluate/key", response_class=HTMLResponse)
def verify_key(request: Request, session: SessionDep, service: ServiceDep,
               key: Annotated[str, Form(max_length=200)] = "",
               job: Annotated[str | None, Form(max_length=64, pattern=JOB_ID_PATTERN)] = None) -> Response:
    """Verify a Leaderboard API key; on success the page session starts (303 to ``/evaluate``, or to the
    page of ``job`` when the form came from one)."""
    row = find_key(session, key.strip()) if key.strip() else None
    if row is None:  # the typed value is never echoed back
        return _evaluate_page(request, session, None, status_code=401, return_job=job,
                              verify_error="That Leaderboard API key is not valid (unknown or revoked).")
    response = RedirectResponse(f"/evaluate/jobs/{job}" if job else "/evaluate", status_code=303)
    start_key_session(response, request, service, row)
    return response


@router.post("/evaluate/forget")
def forget_key() -> Response:
    """End the page session (the key is forgotten by this browser)."""
    response = RedirectResponse("/evaluate", status_code=303)
    end_session(response, KEY_COOKIE, KEY_PATH)
    return response


@router.post("/evaluate/jobs", response_class=HTMLResponse)
def start_job(request: Request, session: SessionDep, service: ServiceDep,
              version_id: Annotated[str, Form(max_length=64)] = "",
              run_label: Annotated[str, Form(max_length=200)] = "",
              mode: Annotated[str, Form(max_length=16)] = "smoke",
              checklist: Annotated[list[str] | None, Form()] = None) -> Response:
    """Start a smoke or full job for a bound version: the rules of ``POST /api/jobs``, shown as messages."""
    key = _session_key(request, service, session)
    if key is None:
        return RedirectResponse("/evaluate", status_code=303)
    checked = set(checklist or ())
    form = {"version_id": version_id, "run_label": run_label, "mode": mode, "checklist": checked}
    try:
        version = version_for_key(session, key.id, version_id)
        body = JobIn.model_validate({
            "version_id": version_id, "run_label": run_label, "mode": mode, "track": version.track,
            "checklist": ({name: name in checked for name, _ in CHECKLIST_ITEMS} if mode == "full" else None)})
        job = submit_job(body, key, session, service)
    except REFUSALS as exc:
        session.rollback()
        status, messages = refusal_messages(exc)
        return _evaluate_page(request, session, key, form=form, messages=messages, status_code=status)
    return RedirectResponse(f"/evaluate/jobs/{job.id}", status_code=303)


def category_label(dataset: str, category: Any) -> str:
    """A result row's category as a person reads it: LoCoMo's numbered categories by name, the number kept
    (``"1"`` -> ``"multi-hop (1)"``, :data:`aml_ray.datasets.locomo.CATEGORY_NAMES`); others as stored.

    Examples:
        >>> category_label("locomo", "4"), category_label("beam", "abstention"), category_label("locomo", "overall")
        ('single-hop (4)', 'abstention', 'overall')
    """
    from aml_ray.datasets.locomo import CATEGORY_NAMES

    name = CATEGORY_NAMES.get(str(category)) if dataset.startswith("locomo") else None
    return f"{name} ({category})" if name else str(category)


def _job_context(session, key: LeaderboardKey, job_id: str) -> dict[str, Any]:
    job = get_job_for_key(session, job_id, key.id)
    result = session.scalar(select(Result).where(Result.job_id == job.id))
    review = session.scalar(select(Review).where(Review.job_id == job.id))
    rows = sorted(({**r, "category_label": category_label(r["dataset"], r["category"])} for r in result.table),
                  key=lambda r: (r["dataset"], r["category"] != "overall", str(r["category"]))) \
        if result is not None else []
    panel = job_panel(job.run_dir, sorted(result.per_dataset)) if result is not None else None
    return {"job": job_out(job), "active": job.status in ACTIVE, "result": result, "rows": rows, "review": review,
            "panel": panel, "poll_ms": int(POLL_INTERVAL_S * 1000)}


@router.get("/evaluate/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: Annotated[str, JOB_ID], session: SessionDep, service: ServiceDep) -> Response:
    """A job of the page session's key: live status, then the private result table (without a page session:
    303 to the key verification, which comes back here)."""
    key = _session_key(request, service, session)
    if key is None:
        return RedirectResponse(f"/evaluate?job={job_id}", status_code=303)
    try:
        context = _job_context(session, key, job_id)
    except NotFound as exc:
        return render(request, "evaluate_job.html", {"missing": exc.reason}, status_code=404)
    return render(request, "evaluate_job.html", context)


@router.get("/evaluate/jobs/{job_id}/live", response_class=HTMLResponse)
def job_live(request: Request, job_id: Annotated[str, JOB_ID], session: SessionDep, service: ServiceDep) -> Response:
    """The live part of the job page alone (what the page's script swaps in while the job runs)."""
    key = _session_key(request, service, session)
    if key is None:
        return render(request, "job_live.html", {"signed_out": True}, status_code=401)
    try:
        context = _job_context(session, key, job_id)
    except NotFound as exc:
        return render(request, "job_live.html", {"missing": exc.reason}, status_code=404)
    return render(request, "job_live.html", context)
