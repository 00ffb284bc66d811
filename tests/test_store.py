"""The store on both databases: SQLite (a temp file) and the machine's PostgreSQL (one schema per test)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet
from sqlalchemy.orm import Session

from aml_ray.security import SecretBox, hash_key
from aml_ray.store import session_factory, upgrade
from aml_ray.store.access import approve_access_request, create_access_request, reject_access_request
from aml_ray.store.errors import Conflict, NotFound, QuotaExceeded
from aml_ray.store.jobs import create_job, get_job_for_key, mark_completed, record_progress
from aml_ray.store.keys import find_key, issue_key, load_secret, rotate_credentials, store_credential
from aml_ray.store.models import Credential, LeaderboardKey, QuotaUsage, utcnow
from aml_ray.store.quotas import SMOKE_PER_TRACK_PER_EDITION
from aml_ray.store.results import approve_review, leaderboard, open_review, save_result

TABLES = {"access_requests", "leaderboard_keys", "systems", "versions", "credentials", "jobs", "job_stages",
          "results", "reviews", "public_submissions", "quota_usage", "admin_actions", "alembic_version"}



@pytest.fixture
def session(engine) -> Iterator[Session]:
    with session_factory(engine)() as s:
        yield s


def _request_fields(**over):
    fields = dict(kind="new_key", contact_name="Ada", contact_email="ada@example.org", organization="Lab",
                  system_name="MemSys", version_label="v1", track="textual", division="open_source",
                  endpoints={"add_url": "https://m.example.org/add", "search_url": "https://m.example.org/search",
                             "health_url": None, "add_status_url": None, "auth_scheme": "none",
                             "max_in_flight": 8, "requests_per_s": None, "timeout_s": 60.0},
                  repository_url="https://github.com/x/y", commit="abc123")
    fields.update(over)
    return fields


def _approved_version(session, **over):
    req = create_access_request(session, _request_fields(**over))
    return approve_access_request(session, req.id, actor="admin")


def test_upgrade_creates_every_table_and_is_idempotent(engine):
    upgrade(engine)
    assert TABLES <= set(sa.inspect(engine).get_table_names())
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one() == "0006_job_bundles"


def test_issued_key_is_stored_only_as_hash(session):
    row, key = issue_key(session)
    session.commit()
    stored = session.scalars(sa.select(LeaderboardKey)).all()
    assert [r.key_hash for r in stored] == [hash_key(key)] and row.display_prefix == key[:8]
    assert find_key(session, key).id == row.id
    assert find_key(session, key + "x") is None
    row.revoked_at = utcnow()
    assert find_key(session, key) is None


def test_credentials_are_encrypted_and_rotate(session):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    cred = store_credential(session, SecretBox([old]), "msk-secret-value")
    session.commit()
    raw = session.scalar(sa.select(Credential.ciphertext).where(Credential.id == cred.id))
    assert "msk-secret-value" not in raw and cred.id.startswith("cred_")
    assert rotate_credentials(session, SecretBox([new, old])) == 1
    session.commit()
    assert load_secret(session, SecretBox([new]), cred.id).get_secret_value() == "msk-secret-value"
    with pytest.raises(NotFound):
        load_secret(session, SecretBox([new]), "cred_missing")


def test_approval_issues_key_then_binds_new_version_to_it(session):
    first = _approved_version(session)
    assert first.key.startswith("aml_") and first.request.status == "approved"
    assert first.version.system.name == "MemSys" and first.version.commit == "abc123"
    with pytest.raises(Conflict, match="already approved"):
        approve_access_request(session, first.request.id, actor="admin")
    key_id = find_key(session, first.key).id
    second = _approved_version(session, kind="add_version", existing_key_id=key_id, version_label="v2")
    assert second.key is None
    assert second.version.system_id == first.version.system_id
    with pytest.raises(Conflict, match="already has version 'v2'"):
        _approved_version(session, kind="add_version", existing_key_id=key_id, version_label="v2")
    rejected = reject_access_request(session, create_access_request(session, _request_fields()).id,
                                     actor="admin", reason="no endpoints")
    assert rejected.status == "rejected" and rejected.decision_reason == "no endpoints"


def test_job_rules_run_label_smoke_first_and_smoke_quota(session):
    appr = _approved_version(session)
    key_id = find_key(session, appr.key).id
    t0 = utcnow()
    with pytest.raises(Conflict, match="passed smoke"):
        create_job(session, key_id=key_id, version=appr.version, mode="full", run_label="f1", edition="e1",
                   now=t0)
    smoke = create_job(session, key_id=key_id, version=appr.version, mode="smoke", run_label="s1",
                       edition="e1", now=t0)
    assert [s.stage for s in smoke.stages] == ["add", "search", "answer", "judge"]
    with pytest.raises(Conflict, match="already used"):
        create_job(session, key_id=key_id, version=appr.version, mode="smoke", run_label="s1", edition="e1",
                   now=t0)
    with pytest.raises(Conflict, match="active job"):
        create_job(session, key_id=key_id, version=appr.version, mode="smoke", run_label="s2", edition="e1",
                   now=t0)
    mark_completed(session, smoke)
    with pytest.raises(QuotaExceeded, match="1 per hour") as info:
        create_job(session, key_id=key_id, version=appr.version, mode="smoke", run_label="s2", edition="e1",
                   now=t0 + timedelta(minutes=59))
    assert info.value.available_at == t0 + timedelta(hours=1)
    later = create_job(session, key_id=key_id, version=appr.version, mode="smoke", run_label="s2",
                       edition="e1", now=t0 + timedelta(minutes=61))
    assert later.status == "queued"
    assert get_job_for_key(session, later.id, key_id).run_label == "s2"
    other_key, _ = issue_key(session)
    with pytest.raises(NotFound):
        get_job_for_key(session, later.id, other_key.id)


def test_smoke_edition_cap(session):
    appr = _approved_version(session)
    key_id = find_key(session, appr.key).id
    t0 = utcnow() - timedelta(days=60)
    for i in range(SMOKE_PER_TRACK_PER_EDITION):
        job = create_job(session, key_id=key_id, version=appr.version, mode="smoke", run_label=f"s{i}",
                         edition="e1", now=t0 + timedelta(hours=i))
        mark_completed(session, job)
    with pytest.raises(QuotaExceeded, match="at most 30 per track"):
        create_job(session, key_id=key_id, version=appr.version, mode="smoke", run_label="s31", edition="e1")
    # another edition has its own count
    create_job(session, key_id=key_id, version=appr.version, mode="smoke", run_label="n1", edition="e2")


def test_full_quota_two_per_key_and_track_second_after_30_days(session):
    appr = _approved_version(session)
    key_id = find_key(session, appr.key).id
    mark_completed(session, create_job(session, key_id=key_id, version=appr.version, mode="smoke",
                                       run_label="s", edition="e1"))
    first = create_job(session, key_id=key_id, version=appr.version, mode="full", run_label="f1", edition="e1",
                       checklist={"smoke_passed": True})
    mark_completed(session, first)
    done_at = session.scalar(sa.select(QuotaUsage.completed_at).where(QuotaUsage.job_id == first.id))
    assert done_at is not None
    with pytest.raises(QuotaExceeded, match="unlocks at") as info:
        create_job(session, key_id=key_id, version=appr.version, mode="full", run_label="f2", edition="e1",
                   now=done_at + timedelta(days=29))
    assert info.value.available_at == done_at + timedelta(days=30)
    second = create_job(session, key_id=key_id, version=appr.version, mode="full", run_label="f2",
                        edition="e1", now=done_at + timedelta(days=30, seconds=1))
    mark_completed(session, second)
    with pytest.raises(QuotaExceeded, match="at most 2 full runs"):
        create_job(session, key_id=key_id, version=appr.version, mode="full", run_label="f3", edition="e1",
                   now=done_at + timedelta(days=90))


def test_progress_is_recorded_per_stage(session):
    appr = _approved_version(session)
    job = create_job(session, key_id=find_key(session, appr.key).id, version=appr.version, mode="smoke",
                     run_label="p", edition="e1")
    record_progress(job, "totals", {"add": 28, "search": 152, "answer": 152, "judge": 152})
    record_progress(job, "done", {"add": 28, "search": 40})
    assert [(s.stage, s.done, s.total) for s in job.stages] == \
        [("add", 28, 28), ("search", 40, 152), ("answer", 0, 152), ("judge", 0, 152)]
    assert job.stage == "search"


def _table(acc_a, acc_b=None):
    rows = [{"dataset": "locomo", "category": "overall", "accuracy": acc_a, "coverage": 1.0, "f1": 0.1,
             "n_total": 10, "n_scored": 10},
            {"dataset": "locomo", "category": "1", "accuracy": 0.0, "coverage": 1.0, "f1": 0.0,
             "n_total": 2, "n_scored": 2}]
    if acc_b is not None:
        rows.append({"dataset": "longmemeval", "category": "overall", "accuracy": acc_b, "coverage": 0.5,
                     "f1": 0.2, "n_total": 10, "n_scored": 5})
    return rows


def _published(session, name, division, table, gate_ok=True):
    appr = _approved_version(session, system_name=name, division=division)
    key_id = find_key(session, appr.key).id
    job = create_job(session, key_id=key_id, version=appr.version, mode="smoke", run_label="x", edition="e1")
    mark_completed(session, job)
    save_result(session, job, table, {"pipeline_code_sha256": "h"})
    review = open_review(session, job, {"checks": {"pipeline_code_hash": {"ok": gate_ok}}})
    return review


def test_review_gate_publication_and_leaderboard_order(session):
    failing = _published(session, "Failing", "commercial", _table(0.9), gate_ok=False)
    with pytest.raises(Conflict, match="gate failed: pipeline_code_hash"):
        approve_review(session, failing.id, actor="admin")
    a = approve_review(session, _published(session, "A", "open_source", _table(0.4, 0.6)).id, actor="admin")
    assert a.overall == pytest.approx(0.5) and a.coverage == pytest.approx(15 / 20)
    assert a.per_dataset["longmemeval"]["accuracy"] == 0.6
    approve_review(session, _published(session, "B", "commercial", _table(0.7)).id, actor="admin")
    session.commit()
    assert [r.system_name for r in leaderboard(session, "textual")] == ["B", "A"]
    assert [r.system_name for r in leaderboard(session, "textual", division="open_source")] == ["A"]
    assert [r.system_name for r in leaderboard(session, "textual", sort="system", descending=False)] == ["A", "B"]
    assert leaderboard(session, "coding") == []
    assert leaderboard(session, "textual")[0].published_at.tzinfo is not None
    with pytest.raises(ValueError, match="sort must be one of"):
        leaderboard(session, "textual", sort="secret")
