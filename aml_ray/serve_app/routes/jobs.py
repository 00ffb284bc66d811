"""``POST /api/jobs`` (smoke | full, quotas, checklist) and ``GET /api/jobs[/{id}]`` (stage progress)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from fastapi.exceptions import RequestValidationError

from aml_ray.serve_app.deps import KeyDep, ServiceDep, SessionDep
from aml_ray.serve_app.schemas import BundleOut, Checklist, JobIn, JobOut, StageOut
from aml_ray.serve_app.tracks import MissingBundles, NoSuite, job_bundles
from aml_ray.store.bundles import overall_progress, running
from aml_ray.store.errors import Conflict
from aml_ray.store.jobs import create_job, get_job_for_key, jobs_for_key, stage_word
from aml_ray.store.keys import version_for_key
from aml_ray.store.models import Job

router = APIRouter(prefix="/api/jobs", tags=["jobs"])


def job_out(job: Job) -> JobOut:
    """A job with per-stage and per-bundle progress; stages also carry the seed's words
    (:data:`aml_ray.store.jobs.STAGE_WORDS`).

    ``progress`` (0..1) is the mean of the bundles' own progress (:func:`aml_ray.store.bundles.overall_progress`:
    monotone over the suite, below 1 when a bundle failed); a job without bundle entries (a Coding job, or
    one not started) counts done / total over its stages; a completed job is 1.
    """
    if job.status == "completed":
        progress = 1.0
    elif job.bundles:
        progress = overall_progress(job.bundles)
    else:
        total = sum(s.total for s in job.stages)
        progress = sum(min(s.done, s.total) for s in job.stages) / total if total else 0.0
    now = running(job.bundles) if job.status == "running" else None
    return JobOut(id=job.id, version_id=job.version_id, mode=job.mode, track=job.track, run_label=job.run_label,
                  status=job.status, stage=job.stage, stage_label=stage_word(job.stage), progress=round(progress, 4),
                  stages=[StageOut(stage=s.stage, label=stage_word(s.stage), done=s.done, failed=s.failed or 0,
                                   total=s.total) for s in job.stages],
                  bundles=[BundleOut.model_validate({k: e.get(k) for k in BundleOut.model_fields if k in e})
                           for e in job.bundles or ()],
                  current_bundle=now[1]["name"] if now else None,
                  error_summary=job.error_summary, conformance=job.conformance, created_at=job.created_at,
                  started_at=job.started_at, finished_at=job.finished_at)


def _check_checklist(body: JobIn) -> None:
    if body.mode != "full":
        return
    checklist = body.checklist or Checklist()
    missing = [name for name, value in checklist.model_dump().items() if value is not True]
    if missing:
        raise RequestValidationError([{"loc": ("body", "checklist", name), "type": "checklist",
                                       "msg": "must be confirmed (true) before a full run"} for name in missing])


@router.post("", status_code=202, response_model=JobOut)
def submit_job(body: JobIn, key: KeyDep, session: SessionDep, service: ServiceDep) -> JobOut:
    """Queue a smoke or full job for a version bound to the caller's key.

    Refusals: 422 for an unconfirmed checklist (full), 404 for a version of another key, 409 for a duplicate
    run label, an active job, full before a passed smoke, or a track without a suite; 429 for a quota;
    503 when the deployment lacks a bundle of the track's suite (an operator error, named in the detail).
    """
    _check_checklist(body)
    version = version_for_key(session, key.id, body.version_id)
    if version.track != body.track:
        raise Conflict(f"version {version.id} is registered for track {version.track}, not {body.track}")
    try:
        job_bundles(service.settings, body.track, body.mode)
    except NoSuite as exc:
        raise Conflict(str(exc)) from None
    except MissingBundles as exc:
        raise HTTPException(503, detail=str(exc)) from None
    job = create_job(session, key_id=key.id, version=version, mode=body.mode, run_label=body.run_label,
                     edition=service.settings.edition,
                     checklist=body.checklist.model_dump() if body.checklist else None)
    session.commit()
    if service.worker is not None:
        service.worker.submit(job.id)
    return job_out(job)


@router.get("", response_model=list[JobOut])
def list_jobs(key: KeyDep, session: SessionDep) -> list[JobOut]:
    """The caller's jobs, newest first."""
    return [job_out(j) for j in jobs_for_key(session, key.id)]


@router.get("/{job_id}", response_model=JobOut)
def get_job(job_id: str, key: KeyDep, session: SessionDep) -> JobOut:
    """A job's stage, progress and error summary (404 for another key's job)."""
    return job_out(get_job_for_key(session, job_id, key.id))
