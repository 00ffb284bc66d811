"""``GET /jobs/{job_id}``: the participant's private job page (stage progress, error summary).

The page itself holds no job data and is the same for every caller: the participant types the
Leaderboard API key into the page, whose script calls ``GET /api/jobs/{job_id}`` with it in the
``Authorization`` header and renders the answer. So the key never goes into a URL, a server log or a
cache, and the page does not reveal whether a job id exists. The key lives only in the page's memory.
"""

from __future__ import annotations

import secrets
from pathlib import Path as FilePath
from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

router = APIRouter(tags=["pages"])
templates = Jinja2Templates(directory=str(FilePath(__file__).resolve().parents[1] / "templates"))

#: Job ids are ``job_`` + URL-safe random characters (see :func:`aml_ray.store.models.new_id`).
JOB_ID = Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: Annotated[str, JOB_ID]) -> HTMLResponse:
    """The job's page: enter your Leaderboard API key to see its stages, progress and error summary."""
    nonce = secrets.token_urlsafe(16)
    response = templates.TemplateResponse(request, "job.html", {"job_id": job_id, "nonce": nonce})
    response.headers.update({
        "Cache-Control": "no-store",
        "Referrer-Policy": "same-origin",
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; img-src data:; "
                                    "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; "
                                    "base-uri 'none'"),
    })
    return response
