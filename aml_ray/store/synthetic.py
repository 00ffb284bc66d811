"""Synthetic store content for page tests and load drills: published rows and a participant's job.

Everything goes through the store's own functions (access request -> approval -> smoke -> full ->
result -> review -> publication), so what the pages and drills read is shaped exactly like real data.
Never call this on a production database: the rows are invented scores, not evaluations.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from aml_ray.store.access import approve_access_request, create_access_request
from aml_ray.store.jobs import create_job, mark_completed, mark_failed, mark_running, record_progress
from aml_ray.store.keys import find_key
from aml_ray.store.models import Job, PublicSubmission, utcnow
from aml_ray.store.results import approve_review, open_review, save_result

#: Every checklist item confirmed (a full job needs them all).
FULL_CHECKLIST = {"smoke_passed": True, "contract_followed": True, "run_instructions_complete": True,
                  "original_work_disclosed": True, "no_integrity_violation": True}
#: Edition used for synthetic quota rows, so they never count against a real edition.
SYNTHETIC_EDITION = "synthetic"


@dataclass(frozen=True)
class SyntheticEntry:
    """One leaderboard entry to publish.

    Attributes:
        system: system name shown on the board.
        organization: organization shown under the name.
        division: ``open_source`` | ``commercial``.
        accuracy: accuracy (0..1) per dataset name; each dataset becomes a column.
        coverage: coverage (0..1) on every dataset.
        n_questions: questions per dataset (the denominator of coverage).
        version_label: the version's label.
        published_at: publication time (default now, UTC).
    """

    system: str
    organization: str
    division: str
    accuracy: dict[str, float]
    coverage: float = 1.0
    n_questions: int = 100
    version_label: str = "v1"
    published_at: datetime | None = None


def access_request_fields(system: str, organization: str = "Example Lab", division: str = "commercial",
                          version_label: str = "v1", track: str = "textual") -> dict[str, Any]:
    """Column values of a complete ``new_key`` access request (endpoints on example.org, auth none)."""
    endpoints = {"add_url": "https://memory.example.org/add", "search_url": "https://memory.example.org/search",
                 "health_url": None, "add_status_url": None, "auth_scheme": "none", "max_in_flight": 16,
                 "requests_per_s": None, "timeout_s": 60.0}
    fields = dict(kind="new_key", contact_name="Synthetic", contact_email="synthetic@example.org",
                  organization=organization, system_name=system, version_label=version_label, track=track,
                  division=division, endpoints=endpoints)
    if division == "open_source":
        fields.update(repository_url="https://github.com/example/memory", commit="0123abcd",
                      attribution="synthetic entry")
    return fields


def approved_key(session: Session, *, system: str, organization: str = "Example Lab",
                 division: str = "commercial", version_label: str = "v1", track: str = "textual"):
    """A new approved key with one version.

    Returns:
        ``(key in clear, key id, version)``.
    """
    req = create_access_request(session, access_request_fields(system, organization, division, version_label, track))
    approval = approve_access_request(session, req.id, actor="synthetic")
    return approval.key, find_key(session, approval.key).id, approval.version


def _table(entry: SyntheticEntry) -> list[dict[str, Any]]:
    scored = round(entry.n_questions * entry.coverage)
    return [{"dataset": name, "category": "overall", "accuracy": acc, "accuracy_se": 0.0, "coverage": entry.coverage,
             "f1": None, "bleu1": None, "n_total": entry.n_questions, "n_scored": scored, "n_errors": 0,
             "n_excluded": 0} for name, acc in entry.accuracy.items()]


def publish(session: Session, entry: SyntheticEntry, *, track: str = "textual") -> tuple[str, PublicSubmission]:
    """Publish ``entry`` on ``track`` through smoke, full, review and approval.

    Args:
        session: an open session (flushed, not committed).
        entry: what to publish.
        track: the board.

    Returns:
        ``(leaderboard key in clear, the public row)``.
    """
    key, key_id, version = approved_key(session, system=entry.system, organization=entry.organization,
                                        division=entry.division, version_label=entry.version_label, track=track)
    smoke = create_job(session, key_id=key_id, version=version, mode="smoke", run_label="smoke-1",
                       edition=SYNTHETIC_EDITION)
    mark_completed(session, smoke)
    full = create_job(session, key_id=key_id, version=version, mode="full", run_label="full-1",
                      edition=SYNTHETIC_EDITION, checklist=FULL_CHECKLIST)
    mark_completed(session, full)
    save_result(session, full, _table(entry), {"synthetic": True})
    review = open_review(session, full, {"passed": True, "checks": {"synthetic": {"ok": True}}})
    sub = approve_review(session, review.id, actor="synthetic")
    if entry.published_at is not None:
        sub.published_at = entry.published_at
    session.flush()
    return key, sub


def job_in_progress(session: Session, *, system: str = "Progress Probe", done: dict[str, int] | None = None,
                    totals: dict[str, int] | None = None, failed: str | None = None) -> tuple[str, Job]:
    """A participant's smoke job part-way through its stages (or failed with ``failed`` as summary).

    Args:
        session: an open session.
        system: the system name of the new key's version.
        done: done counts per stage (default add finished, search part-way).
        totals: totals per stage (default 28 Adds, 152 questions).
        failed: an error summary: the job is marked failed with it.

    Returns:
        ``(leaderboard key in clear, the job)``.
    """
    key, key_id, version = approved_key(session, system=system)
    job = create_job(session, key_id=key_id, version=version, mode="smoke", run_label="smoke-1",
                     edition=SYNTHETIC_EDITION, now=utcnow() - timedelta(minutes=5))
    mark_running(job, run_dir="")
    job.run_dir = None  # no evidence on disk
    record_progress(job, "totals", totals or {"add": 28, "search": 152, "answer": 152, "judge": 152})
    record_progress(job, "done", done or {"add": 28, "search": 61, "answer": 40, "judge": 12})
    if failed is not None:
        mark_failed(job, failed)
    session.flush()
    return key, job
