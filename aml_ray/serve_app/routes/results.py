"""``GET /api/results/{job_id}``: a job's private scores, visible only to its key."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from sqlalchemy import select

from aml_ray.serve_app.deps import KeyDep, SessionDep
from aml_ray.serve_app.panel_spread import job_panel
from aml_ray.store.models import Review
from aml_ray.store.results import result_for_key

router = APIRouter(prefix="/api/results", tags=["results"])


@router.get("/{job_id}")
def get_result(job_id: str, key: KeyDep, session: SessionDep) -> dict[str, Any]:
    """Overall, per-dataset and per-category scores, run facts, the judge panel's spread when ``aml-ray rejudge
    --panel`` was run on the job (:func:`~aml_ray.serve_app.panel_spread.job_panel`, else None) and review status
    (404 for other keys)."""
    job, result = result_for_key(session, job_id, key.id)
    review = session.scalar(select(Review).where(Review.job_id == job.id))
    return {"job_id": job.id, "run_label": job.run_label, "mode": job.mode, "track": job.track,
            "status": job.status, "overall": result.overall, "coverage": result.coverage,
            "per_dataset": result.per_dataset, "table": result.table, "facts": result.facts,
            "panel": job_panel(job.run_dir, sorted(result.per_dataset)),
            "review": None if review is None else {"id": review.id, "status": review.status,
                                                   "gate": review.gate, "reason": review.reason}}
