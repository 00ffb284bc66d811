"""Results, reviews and public submissions, and the public leaderboard query."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from aml_ray.store.errors import Conflict, NotFound
from aml_ray.store.models import Job, PublicSubmission, Result, Review, Version, utcnow

#: Tracks with a public board (seed: Textual, Multimodal, Coding).
TRACKS = ("textual", "multimodal", "coding")
#: Sort keys accepted by :func:`leaderboard`.
SORT_KEYS = ("overall", "coverage", "published_at", "system")


def summarize_table(table: list[dict[str, Any]]) -> tuple[float | None, float | None, dict[str, Any]]:
    """Overall score, coverage and per-dataset scores from an aggregate table.

    Overall is the unweighted mean of the datasets' ``overall`` accuracies (each dataset counts once,
    whatever its size); coverage is scored / total summed over datasets.

    Args:
        table: rows of :func:`aml_ray.scoring.aggregate`.

    Returns:
        ``(overall, coverage, {dataset: {"accuracy", "coverage", "f1", "n_total"}})``.
    """
    per: dict[str, Any] = {}
    scored = total = 0
    for row in table:
        if row["category"] != "overall":
            continue
        per[row["dataset"]] = {"accuracy": row["accuracy"], "coverage": row["coverage"], "f1": row["f1"],
                               "n_total": row["n_total"]}
        scored += row["n_scored"]
        total += row["n_total"]
    accs = [v["accuracy"] for v in per.values() if v["accuracy"] is not None]
    overall = sum(accs) / len(accs) if accs else None
    return overall, (scored / total if total else None), per


def save_result(session: Session, job: Job, table: list[dict[str, Any]], facts: dict[str, Any],
                summary: tuple[float | None, float | None, dict[str, Any]] | None = None) -> Result:
    """Store a completed job's score table and gate facts.

    Args:
        session: an open session.
        job: the job.
        table: aggregate rows (Coding: the resolved-rate rows).
        facts: secret-free run facts (models, pipeline hash, dataset hashes, question counts).
        summary: ``(overall, coverage, per_dataset)`` when the track computes its own headline (Coding,
            :func:`aml_ray.serve_app.coding_jobs.coding_summary`); None: :func:`summarize_table` of ``table``.

    Returns:
        The row.
    """
    overall, coverage, per = summary if summary is not None else summarize_table(table)
    row = Result(job_id=job.id, table=table, overall=overall, coverage=coverage, per_dataset=per, facts=facts)
    session.add(row)
    session.flush()
    return row


def result_for_key(session: Session, job_id: str, key_id: str) -> tuple[Job, Result]:
    """A job's result, visible only to its key.

    Raises:
        NotFound: unknown job, another key's job, or no result yet.
    """
    job = session.get(Job, job_id)
    if job is None or job.key_id != key_id:
        raise NotFound(f"job {job_id} not found for this key")
    result = session.scalar(select(Result).where(Result.job_id == job_id))
    if result is None:
        raise NotFound(f"job {job_id} has no result (status {job.status})")
    return job, result


def open_review(session: Session, job: Job, gate: dict[str, Any]) -> Review:
    """Put a completed full job in the review queue with its gate checks."""
    row = Review(job_id=job.id, gate=gate)
    session.add(row)
    session.flush()
    return row


def list_reviews(session: Session, status: str | None = None) -> list[Review]:
    """Reviews, oldest first, optionally only those with ``status``."""
    stmt = select(Review).order_by(Review.created_at)
    if status:
        stmt = stmt.where(Review.status == status)
    return list(session.scalars(stmt))


def _pending_review(session: Session, review_id: str) -> Review:
    review = session.get(Review, review_id)
    if review is None:
        raise NotFound(f"review {review_id} not found")
    if review.status != "pending":
        raise Conflict(f"review {review_id} is already {review.status}")
    return review


def approve_review(session: Session, review_id: str, *, actor: str) -> PublicSubmission:
    """Approve: the gate must have passed and the version must not already be on the board.

    Raises:
        NotFound: unknown review.
        Conflict: decided already, gate failed (the failing checks are listed), or a duplicate.
    """
    review = _pending_review(session, review_id)
    failed = [name for name, check in review.gate.get("checks", {}).items() if not check.get("ok")]
    if failed:
        raise Conflict(f"publication gate failed: {', '.join(sorted(failed))}; reject this review instead")
    job = session.get(Job, review.job_id)
    version = session.get(Version, job.version_id)
    if session.scalar(select(PublicSubmission.id).where(PublicSubmission.version_id == version.id,
                                                        PublicSubmission.track == job.track)):
        raise Conflict(f"version {version.id} already has a public submission on track {job.track}")
    result = session.scalar(select(Result).where(Result.job_id == job.id))
    system = version.system
    sub = PublicSubmission(job_id=job.id, version_id=version.id, track=job.track, system_name=system.name,
                           organization=system.organization, version_label=version.label,
                           division=system.division, overall=result.overall, coverage=result.coverage,
                           per_dataset=result.per_dataset, suite=(result.facts or {}).get("suite"),
                           answer_model=((result.facts or {}).get("models", {}).get("answer") or {}).get("model"))
    session.add(sub)
    review.status, review.decided_by, review.decided_at = "approved", actor, utcnow()
    session.flush()
    return sub


def reject_review(session: Session, review_id: str, *, actor: str, reason: str) -> Review:
    """Reject: the result stays private.

    Raises:
        NotFound: unknown review.
        Conflict: decided already.
    """
    review = _pending_review(session, review_id)
    review.status, review.decided_by, review.decided_at, review.reason = "rejected", actor, utcnow(), reason
    return review


def leaderboard(session: Session, track: str, *, division: str | None = None, sort: str = "overall",
                descending: bool = True) -> list[PublicSubmission]:
    """The public rows of a track.

    Args:
        session: an open session.
        track: one of :data:`TRACKS`.
        division: keep only this division (``open_source`` | ``commercial``).
        sort: one of :data:`SORT_KEYS` (ties broken by earlier publication).
        descending: sort direction.

    Returns:
        The rows in display order.

    Raises:
        ValueError: unknown sort key.
    """
    if sort not in SORT_KEYS:
        raise ValueError(f"sort must be one of {', '.join(SORT_KEYS)}, got {sort!r}")
    stmt = select(PublicSubmission).where(PublicSubmission.track == track)
    if division:
        stmt = stmt.where(PublicSubmission.division == division)
    rows = list(session.scalars(stmt.order_by(PublicSubmission.published_at)))
    column = {"system": "system_name"}.get(sort, sort)
    present = [r for r in rows if getattr(r, column) is not None]
    missing = [r for r in rows if getattr(r, column) is None]
    present.sort(key=lambda r: getattr(r, column), reverse=descending)
    return present + missing
