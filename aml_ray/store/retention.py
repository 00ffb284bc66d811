"""Evidence retention: delete the run directories of jobs that finished long ago (DESIGN.md "Data handling").

Evidence (Add rows, returned memories, answers, judge text) is kept for audit for the retention period
(default 30 days) after a job finished, then purged. A purge removes the job's run directory and clears
the job's reference to it (``jobs.run_dir``), and writes one audit row per job. The job, its stage
progress, its score table, its review and any public row stay: the leaderboard and the quota history
do not depend on evidence.

Safety rules:

- only jobs whose status is final (``completed`` or ``failed``) and whose ``finished_at`` is older than
  the cut-off; a queued or running job is never touched, whatever its dates;
- only directories inside the runs root the operator names; a reference outside it is reported and left
  alone, and so is a directory that holds, or lies inside, an active job's run directory;
- the directory is deleted before the reference is cleared and each job commits on its own, so an
  interrupted purge leaves references to what is still on disk and the next purge finishes the work.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from aml_ray.config import DEFAULT_RETENTION_DAYS  # noqa: F401 (re-exported)
from aml_ray.store.audit import log_admin_action
from aml_ray.store.models import Job, utcnow

log = logging.getLogger("aml_ray.retention")

#: Job statuses after which evidence may be purged.
FINAL_STATUSES = ("completed", "partial", "failed")
#: The audit log's actor and action for a purge.
PURGE_ACTOR = "retention"
PURGE_ACTION = "job.evidence_purged"


@dataclass(frozen=True)
class PurgeItem:
    """One job whose evidence a purge removed (or would remove, or had to skip).

    Attributes:
        job_id: the job.
        status: its final status.
        finished_at: when it finished (UTC).
        run_dir: the run directory the job referenced.
        files: regular files under the directory (0 when it was already gone).
        bytes: their total size in bytes.
        action: ``"removed"``, ``"would remove"`` (dry run), or ``"skipped: <why>"``.
    """

    job_id: str
    status: str
    finished_at: datetime
    run_dir: str
    files: int
    bytes: int
    action: str

    @property
    def skipped(self) -> bool:
        """True when the purge left this job's directory and reference alone."""
        return self.action.startswith("skipped")


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _size(path: Path) -> tuple[int, int]:
    files = size = 0
    if not path.is_dir():
        return 0, 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            p = Path(dirpath) / name
            if p.is_file() and not p.is_symlink():
                files += 1
                size += p.stat().st_size
    return files, size


def _why_not(path: Path, root: Path, active: list[Path]) -> str | None:
    if path == root:
        return "skipped: it is the runs root itself"
    if not _inside(path, root):
        return f"skipped: outside the runs root {root}"
    for other in active:
        if _inside(other, path) or _inside(path, other):
            return "skipped: overlaps the run directory of an active job"
    return None


def expired_jobs(session: Session, cutoff: datetime) -> list[Job]:
    """Jobs in a final status that finished before ``cutoff`` and still reference a run directory.

    Args:
        session: an open session.
        cutoff: timezone-aware UTC time; jobs that finished strictly before it are expired.

    Returns:
        The jobs, oldest finish first.
    """
    stmt = (select(Job).where(Job.status.in_(FINAL_STATUSES), Job.finished_at.is_not(None),
                              Job.finished_at < cutoff, Job.run_dir.is_not(None))
            .order_by(Job.finished_at))
    return list(session.scalars(stmt))


def purge_evidence(sessions: sessionmaker[Session], runs_root: Path, *,
                   older_than_days: int = DEFAULT_RETENTION_DAYS, dry_run: bool = False,
                   now: datetime | None = None) -> Iterator[PurgeItem]:
    """Delete the run directories of jobs that finished more than ``older_than_days`` ago.

    Each job is handled in its own transaction: the directory is removed, then ``jobs.run_dir`` is
    cleared and an ``admin_actions`` row (actor ``retention``) records the job, its finish time and
    what was removed. A generator, so a caller can print each job as it goes.

    Args:
        sessions: the store's session factory.
        runs_root: the only directory under which anything is deleted (the service's ``runs_dir``).
        older_than_days: retention period in days (>= 0); 0 purges every finished job.
        dry_run: report what would be removed; change nothing on disk or in the database.
        now: the current time (default now, UTC).

    Yields:
        One :class:`PurgeItem` per expired job, oldest first.

    Raises:
        ValueError: a negative ``older_than_days``.
    """
    if older_than_days < 0:
        raise ValueError(f"older_than_days must be >= 0, got {older_than_days}")
    cutoff = (now or utcnow()) - timedelta(days=older_than_days)
    root = Path(runs_root).expanduser().resolve()
    with sessions() as session:
        candidates = [(j.id, j.status, j.finished_at, j.run_dir) for j in expired_jobs(session, cutoff)]
        active = [Path(d).expanduser().resolve() for d in session.scalars(
            select(Job.run_dir).where(Job.status.not_in(FINAL_STATUSES), Job.run_dir.is_not(None)))]
    for job_id, status, finished_at, run_dir in candidates:
        path = Path(run_dir).expanduser().resolve()
        files, size = _size(path)
        why = _why_not(path, root, active)
        if why is not None or dry_run:
            yield PurgeItem(job_id, status, finished_at, run_dir, files, size, why or "would remove")
            continue
        with sessions.begin() as session:
            job = session.get(Job, job_id, with_for_update=True)
            if job is None or job.status not in FINAL_STATUSES or job.run_dir != run_dir:
                continue  # changed since the scan: leave it for the next purge
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
            job.run_dir = None
            log_admin_action(session, actor=PURGE_ACTOR, action=PURGE_ACTION, target=job_id,
                             detail={"finished_at": finished_at.isoformat(), "status": status, "run_dir": run_dir,
                                     "files": files, "bytes": size, "older_than_days": older_than_days})
        log.info("purged evidence of job %s (%d files, %d bytes)", job_id, files, size)
        yield PurgeItem(job_id, status, finished_at, run_dir, files, size, "removed")
