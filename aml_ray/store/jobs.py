"""Jobs, their stage progress, and the rules for accepting one (quotas, run labels, checklist)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session, object_session

from aml_ray.store.errors import Conflict, NotFound
from aml_ray.store.models import Job, JobStage, LeaderboardKey, QuotaUsage, Version, utcnow
from aml_ray.store.quotas import check_quota

#: Pipeline stages reported on a job, in order.
STAGES = ("add", "search", "answer", "judge")
#: The stages of a Coding job: its attempts (task x condition: Add, Search, agent, tests), counted as
#: :func:`aml_ray.coding.runner.run_coding` reports them.
CODING_STAGES = ("attempts",)
ACTIVE = ("queued", "running")
#: The seed's words for the pipeline's stages ("ingestion, retrieval, answering, scoring, aggregation"), by
#: the stage names the store keeps; a job's ``stage`` is ``aggregate`` once every stage is done.
STAGE_WORDS = {"add": "ingestion", "search": "retrieval", "answer": "answering", "judge": "scoring",
               "aggregate": "aggregation", "attempts": "attempts (Add, Search, agent, tests)"}


def stage_word(stage: str) -> str:
    """The word a person reads for ``stage`` (:data:`STAGE_WORDS`); other states (``queued``,
    ``starting``, ``completed``) read as they are."""
    return STAGE_WORDS.get(stage, stage)


def lock_key(session: Session, key_id: str) -> None:
    """Hold ``key_id``'s row for the rest of the transaction: a second transaction that locks it waits.

    An ``UPDATE`` of the row (to the same value) is the lock both databases give: PostgreSQL takes the
    row lock until commit (and in READ COMMITTED the waiter's later reads see the first one's rows); SQLite
    takes the database's write lock (``BEGIN`` is emitted before the first write), held until commit,
    waited for up to the engine's busy timeout.
    """
    session.execute(update(LeaderboardKey).where(LeaderboardKey.id == key_id)
                    .values(display_prefix=LeaderboardKey.display_prefix))


def create_job(session: Session, *, key_id: str, version: Version, mode: str, run_label: str,
               edition: str, checklist: dict[str, bool] | None = None, now: datetime | None = None) -> Job:
    """Accept a job: check the run label, active jobs, smoke-before-full and the quota, then charge it.

    The checks and the insert are one transaction under :func:`lock_key`: of concurrent submissions for one
    key, each sees the jobs the earlier ones committed (one smoke per hour holds under a burst).

    Args:
        session: an open session.
        key_id: the caller's key id (``version`` must be bound to it).
        version: the version to evaluate.
        mode: ``smoke`` | ``full``.
        run_label: unique per key.
        edition: the quota edition.
        checklist: the full-mode checklist (already validated all true by the API).
        now: the current time (default now, UTC).

    Returns:
        The queued job.

    Raises:
        Conflict: duplicate run label, an active job for this version, or full before a passed smoke.
        QuotaExceeded: the quota for ``mode`` has not reset.
    """
    lock_key(session, key_id)
    now = now or utcnow()
    if session.scalar(select(Job.id).where(Job.key_id == key_id, Job.run_label == run_label)):
        raise Conflict(f"run label {run_label!r} is already used by this key; choose a new one")
    active = session.scalar(select(Job.id).where(Job.version_id == version.id, Job.status.in_(ACTIVE)))
    if active:
        raise Conflict(f"version {version.id} already has an active job ({active}); wait for it to finish")
    if mode == "full":
        passed = session.scalar(select(Job.id).where(Job.version_id == version.id, Job.mode == "smoke",
                                                     Job.status == "completed"))
        if not passed:
            raise Conflict("full needs a passed smoke: run a smoke job for this version first")
    check_quota(session, key_id=key_id, track=version.track, mode=mode, edition=edition, now=now)
    job = Job(key_id=key_id, version_id=version.id, mode=mode, track=version.track, run_label=run_label,
              checklist=checklist, created_at=now)
    stages = CODING_STAGES if version.track == "coding" else STAGES
    job.stages = [JobStage(stage=s, position=i, updated_at=now) for i, s in enumerate(stages)]
    session.add(job)
    session.flush()
    session.add(QuotaUsage(key_id=key_id, track=version.track, mode=mode, edition=edition, job_id=job.id,
                           charged_at=now))
    session.flush()
    return job


def get_job(session: Session, job_id: str) -> Job:
    """A job by id (worker and admin use).

    Raises:
        NotFound: no such job.
    """
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job


def get_job_for_key(session: Session, job_id: str, key_id: str) -> Job:
    """A job visible to ``key_id``.

    Raises:
        NotFound: unknown, or bound to another key (indistinguishable on purpose).
    """
    job = session.get(Job, job_id)
    if job is None or job.key_id != key_id:
        raise NotFound(f"job {job_id} not found for this key")
    return job


def jobs_for_key(session: Session, key_id: str) -> list[Job]:
    """A key's jobs, newest first."""
    return list(session.scalars(select(Job).where(Job.key_id == key_id).order_by(Job.created_at.desc())))


def mark_running(job: Job, run_dir: str) -> None:
    """Record that the worker started ``job`` in ``run_dir``."""
    job.status, job.stage, job.started_at, job.run_dir = "running", "starting", utcnow(), run_dir


def record_progress(job: Job, kind: str, values: dict[str, int]) -> None:
    """Apply a progress callback of :func:`aml_ray.run.evaluation.evaluate` to the job's stages.

    Args:
        job: the job (with its stages loaded).
        kind: ``"totals"`` or ``"done"``.
        values: counts per stage; with ``"done"``, ``<stage>_failed`` keys give the failed units among them.
    """
    now = utcnow()
    for row in job.stages:
        if row.stage in values:
            if kind == "totals":
                row.total = int(values[row.stage])
            else:
                row.done = int(values[row.stage])
            row.updated_at = now
        if kind != "totals" and f"{row.stage}_failed" in values:
            row.failed = int(values[f"{row.stage}_failed"])
    unfinished = [r.stage for r in job.stages if r.total == 0 or r.done < r.total]
    job.stage = unfinished[0] if unfinished else "aggregate"


def mark_completed(session: Session, job: Job) -> None:
    """Finish ``job`` and stamp its quota row's completion time (the full-run unlock clock)."""
    now = utcnow()
    job.status, job.stage, job.finished_at = "completed", "completed", now
    job.lease_owner, job.lease_expires_at = None, None
    usage = session.scalar(select(QuotaUsage).where(QuotaUsage.job_id == job.id))
    if usage is not None:
        usage.completed_at = now


def mark_failed(job: Job, summary: str, *, status: str = "failed") -> None:
    """End ``job`` as ``failed`` (or ``partial``: it ran, but its evidence misses Adds or questions) with a
    secret-free error summary.

    A full job that did not complete gives its quota slot back: the seed's "at most 2 full
    runs" counts runs that measured the system, and it opens no review. A smoke stays charged (it used
    the platform's capacity; the hourly limit is what it protects).
    """
    job.status, job.finished_at, job.error_summary = status, utcnow(), summary[:2000]
    job.lease_owner, job.lease_expires_at = None, None
    session = object_session(job)
    if job.mode == "full" and session is not None:
        usage = session.scalar(select(QuotaUsage).where(QuotaUsage.job_id == job.id))
        if usage is not None:
            session.delete(usage)
