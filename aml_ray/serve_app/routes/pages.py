"""``GET /jobs/{job_id}``: the short link of a participant's job page; it redirects (307) to the one job page,
``/evaluate/jobs/{job_id}`` (:mod:`aml_ray.serve_app.routes.evaluate_pages`: live progress, bundles, errors
and private results for the page session's key; without one it sends the browser to verify the key first).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import RedirectResponse

router = APIRouter(tags=["pages"], include_in_schema=False)

#: Job ids are ``job_`` + URL-safe random characters (see :func:`aml_ray.store.models.new_id`).
JOB_ID_PATTERN = r"^[A-Za-z0-9_-]+$"
JOB_ID = Path(min_length=1, max_length=64, pattern=JOB_ID_PATTERN)


@router.get("/jobs/{job_id}")
def job_link(job_id: Annotated[str, JOB_ID]) -> RedirectResponse:
    """307 to the job's page on the Evaluation flow (the id is checked against :data:`JOB_ID` first: a
    malformed one is 422, so no other path can be reached through the redirect)."""
    return RedirectResponse(f"/evaluate/jobs/{job_id}", status_code=307)
