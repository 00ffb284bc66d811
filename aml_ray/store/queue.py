"""The job queue in the database: claim a job with a lease, renew it, give it up.

A job is *claimable* when it is ``queued``, or ``running`` with a lease that has expired (its runner died:
node lost, process killed) or that it never had (a row written before leases existed). Claiming sets
``status = 'running'``, the owner, the expiry ``now + lease_s`` and adds one to ``attempts``; a claim with
``attempts > 1`` is a resumption, and the runner continues the run from its evidence
(:func:`aml_ray.run.evaluation.evaluate` with ``resume``).

Exclusivity (the seed's "several replicas"): on PostgreSQL the candidate row is selected with
``SELECT ... FOR UPDATE SKIP LOCKED``, so concurrent claimers each lock a different row and never wait on
one another; on SQLite (one writer at a time) the claim is one conditional ``UPDATE ... WHERE id = :id AND
<claimable>`` whose row count says whether this caller won. Either way one job has one owner at a time.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from aml_ray.store.models import Job, utcnow

#: Seconds a claim lasts unless renewed; the runner renews it every third of that.
DEFAULT_LEASE_S = 60.0


def _claimable(now: datetime):
    return or_(Job.status == "queued",
               and_(Job.status == "running", or_(Job.lease_expires_at.is_(None), Job.lease_expires_at < now)))


def claim_job(session: Session, *, owner: str, lease_s: float = DEFAULT_LEASE_S, job_id: str | None = None,
              now: datetime | None = None) -> Job | None:
    """Claim the oldest claimable job (or ``job_id`` only) for ``owner``; the caller commits.

    Args:
        session: an open session (its transaction holds the row lock on PostgreSQL until commit).
        owner: the claimer's id (at most 64 characters), written to ``lease_owner``.
        lease_s: seconds until the lease expires unless renewed (> 0).
        job_id: claim only this job (a runner started for it); None takes the oldest claimable job.
        now: the current time (default now, UTC).

    Returns:
        The claimed job (status ``running``, ``attempts`` counted), or None when nothing is claimable.

    Raises:
        ValueError: ``lease_s`` not positive or ``owner`` longer than 64 characters.
    """
    if lease_s <= 0:
        raise ValueError(f"lease_s must be > 0 seconds, got {lease_s}")
    if len(owner) > 64:
        raise ValueError(f"owner must be at most 64 characters, got {len(owner)}")
    now = now or utcnow()
    values = {"status": "running", "lease_owner": owner, "lease_expires_at": now + timedelta(seconds=lease_s),
              "attempts": Job.attempts + 1}
    stmt = select(Job.id).where(_claimable(now))
    if job_id is not None:
        stmt = stmt.where(Job.id == job_id)
    stmt = stmt.order_by(Job.created_at, Job.id)
    if session.get_bind().dialect.name == "postgresql":
        chosen = session.scalar(stmt.limit(1).with_for_update(skip_locked=True))
        if chosen is None:
            return None
        session.execute(update(Job).where(Job.id == chosen).values(**values))
    else:
        chosen = None
        for candidate in session.scalars(stmt.limit(8)).all():  # another claimer may win one: try the next
            won = session.execute(update(Job).where(Job.id == candidate, _claimable(now)).values(**values))
            if won.rowcount == 1:
                chosen = candidate
                break
        if chosen is None:
            return None
    job = session.get(Job, chosen, populate_existing=True)
    if job.started_at is None:
        job.started_at = now
    return job


def renew_lease(session: Session, job_id: str, *, owner: str, lease_s: float = DEFAULT_LEASE_S,
                now: datetime | None = None) -> bool:
    """Extend ``owner``'s lease on a running job; the caller commits.

    Returns:
        False when the job is no longer ``owner``'s running job (finished, or claimed by another runner
        after the lease expired): the runner must stop writing to it.
    """
    now = now or utcnow()
    res = session.execute(update(Job).where(Job.id == job_id, Job.lease_owner == owner, Job.status == "running")
                          .values(lease_expires_at=now + timedelta(seconds=lease_s)))
    return res.rowcount == 1


def owns(session: Session, job_id: str, owner: str) -> bool:
    """Whether ``owner`` still holds ``job_id``'s lease (read before writing a result)."""
    return session.scalar(select(Job.lease_owner).where(Job.id == job_id)) == owner
