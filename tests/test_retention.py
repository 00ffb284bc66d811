"""Evidence retention: ``purge_evidence`` and ``aml-ray purge`` on SQLite and PostgreSQL.

Jobs are created through the store, their run directories filled with files, and their finish times
moved into the past; the purge must remove exactly the expired final jobs' directories, clear their
references, keep everything else (running jobs, recent jobs, scores, public rows) and audit each removal.
"""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from aml_ray.store import make_engine, session_factory, upgrade
from aml_ray.store.jobs import create_job, mark_completed, mark_failed, mark_running
from aml_ray.store.models import AdminAction, Job, PublicSubmission, Result, utcnow
from aml_ray.store.retention import PURGE_ACTION, purge_evidence
from aml_ray.store.synthetic import SyntheticEntry, approved_key, publish




def _run_dir(root: Path, name: str, n_files: int = 3) -> Path:
    d = root / name
    (d / "evidence" / "adds").mkdir(parents=True)
    for i in range(n_files - 1):
        (d / "evidence" / "adds" / f"conv-{i}.parquet").write_bytes(b"x" * 100)
    (d / "run.json").write_text("{}")
    return d


def _seed(sessions, root: Path, outside: Path) -> dict[str, Job]:
    """Jobs of every kind; returns them by role."""
    now = utcnow()
    jobs: dict[str, Job] = {}
    with sessions.begin() as s:
        key_id_and_versions = []
        for i, role in enumerate(("old_completed", "old_failed", "recent", "old_running", "queued", "outside",
                                  "already_purged")):
            _key, key_id, version = approved_key(s, system=f"System {i}")
            key_id_and_versions.append((role, key_id, version))
        for role, key_id, version in key_id_and_versions:
            job = create_job(s, key_id=key_id, version=version, mode="smoke", run_label="smoke-1", edition="e",
                             now=now - timedelta(days=70))
            jobs[role] = job
            if role == "queued":
                continue
            mark_running(job, str(_run_dir(outside if role == "outside" else root, job.id)))
            if role == "old_failed":
                mark_failed(job, "contract error")
            elif role != "old_running":
                mark_completed(s, job)
            job.started_at = now - timedelta(days=70)
        for role, days in (("old_completed", 45), ("old_failed", 31), ("recent", 29), ("outside", 60),
                           ("already_purged", 90)):
            jobs[role].finished_at = now - timedelta(days=days)
        shutil.rmtree(jobs["already_purged"].run_dir)  # the directory is gone, the reference is not
        _key, pub = publish(s, SyntheticEntry("Published", "Lab", "commercial", {"locomo": 0.5}))
        jobs["published"] = s.get(Job, pub.job_id)
        jobs["published"].run_dir = str(_run_dir(root, pub.job_id))
        jobs["published"].finished_at = now - timedelta(days=40)
    return jobs


def test_purge_removes_only_expired_final_jobs_and_keeps_scores(engine, tmp_path):
    sessions = session_factory(engine)
    root, outside = tmp_path / "runs", tmp_path / "elsewhere"
    jobs = _seed(sessions, root, outside)
    dirs = {role: Path(j.run_dir) for role, j in jobs.items() if j.run_dir}

    dry = list(purge_evidence(sessions, root, older_than_days=30, dry_run=True))
    assert {i.job_id: i.action for i in dry} == {
        jobs["already_purged"].id: "would remove", jobs["outside"].id: f"skipped: outside the runs root {root}",
        jobs["old_completed"].id: "would remove", jobs["published"].id: "would remove",
        jobs["old_failed"].id: "would remove"}
    assert [i.job_id for i in dry][0] == jobs["already_purged"].id  # oldest finish first
    assert all(d.exists() for role, d in dirs.items() if role != "already_purged")  # dry run: nothing touched
    with sessions() as s:
        assert all(s.get(Job, j.id).run_dir is not None for role, j in jobs.items() if role != "queued")

    items = list(purge_evidence(sessions, root, older_than_days=30))
    removed = {i.job_id: (i.files, i.bytes) for i in items if i.action == "removed"}
    assert removed == {jobs["old_completed"].id: (3, 202), jobs["old_failed"].id: (3, 202),
                       jobs["published"].id: (3, 202), jobs["already_purged"].id: (0, 0)}
    for role in ("old_completed", "old_failed", "published"):
        assert not dirs[role].exists()
    for role in ("recent", "old_running", "outside"):
        assert (dirs[role] / "run.json").exists()
    assert root.is_dir()
    with sessions() as s:
        refs = {role: s.get(Job, j.id).run_dir for role, j in jobs.items()}
        assert {r for r, d in refs.items() if d is None} == {"old_completed", "old_failed", "published",
                                                             "already_purged", "queued"}
        assert s.get(Job, jobs["old_running"].id).status == "running"
        audit = {a.target: a.detail for a in s.scalars(select(AdminAction).where(AdminAction.action == PURGE_ACTION))}
        assert set(audit) == set(removed)
        assert audit[jobs["old_failed"].id]["status"] == "failed" and audit[jobs["old_failed"].id]["files"] == 3
        assert s.scalar(select(PublicSubmission.system_name)) == "Published"  # the board keeps its row
        assert s.scalar(select(Result.overall).where(Result.job_id == jobs["published"].id)) == 0.5

    again = list(purge_evidence(sessions, root, older_than_days=30))
    assert [i.action for i in again] == [f"skipped: outside the runs root {root}"]
    everything = [i.job_id for i in purge_evidence(sessions, root, older_than_days=0, dry_run=True)]
    assert jobs["recent"].id in everything and jobs["old_running"].id not in everything


def test_purge_never_deletes_a_directory_an_active_job_uses(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'aml.sqlite3'}")
    upgrade(engine)
    sessions = session_factory(engine)
    root = tmp_path / "runs"
    shared = _run_dir(root, "shared")
    with sessions.begin() as s:
        _key, key_id, version = approved_key(s, system="A")
        done = create_job(s, key_id=key_id, version=version, mode="smoke", run_label="a", edition="e",
                          now=utcnow() - timedelta(days=90))
        mark_running(done, str(root))  # a reference to the root itself
        mark_completed(s, done)
        done.finished_at = utcnow() - timedelta(days=80)
        _key, key_id, version = approved_key(s, system="B")
        first = create_job(s, key_id=key_id, version=version, mode="smoke", run_label="b", edition="e",
                           now=utcnow() - timedelta(days=90))
        mark_running(first, str(shared))
        mark_completed(s, first)
        first.finished_at = utcnow() - timedelta(days=80)
        _key, key_id, version = approved_key(s, system="C")
        running = create_job(s, key_id=key_id, version=version, mode="smoke", run_label="c", edition="e")
        mark_running(running, str(shared / "evidence"))
    actions = {i.job_id: i.action for i in purge_evidence(sessions, root)}
    assert actions == {done.id: "skipped: it is the runs root itself",
                       first.id: "skipped: overlaps the run directory of an active job"}
    assert (shared / "run.json").exists()
    with pytest.raises(ValueError, match="older_than_days must be >= 0"):
        list(purge_evidence(sessions, root, older_than_days=-1))
    engine.dispose()


def test_purge_command_prints_what_it_removes(tmp_path, monkeypatch):
    from aml_ray.cli import app

    db = tmp_path / "aml.sqlite3"
    monkeypatch.setenv("AML_DATABASE_URL", f"sqlite:///{db}")
    monkeypatch.setenv("AML_DATA_DIR", str(tmp_path / "data"))
    runner = CliRunner()
    empty = runner.invoke(app, ["purge"])
    assert empty.exit_code == 0 and f"no service database at {db}: nothing to purge" in empty.output
    engine = make_engine(f"sqlite:///{db}")
    upgrade(engine)
    sessions = session_factory(engine)
    root = tmp_path / "data" / "service-runs"  # the service's default runs directory
    with sessions.begin() as s:
        _key, key_id, version = approved_key(s, system="A")
        job = create_job(s, key_id=key_id, version=version, mode="smoke", run_label="a", edition="e",
                         now=utcnow() - timedelta(days=50))
        mark_running(job, str(_run_dir(root, "job_a")))
        mark_completed(s, job)
        job.finished_at = utcnow() - timedelta(days=40)
        job_id = job.id
    engine.dispose()

    dry = runner.invoke(app, ["purge", "--older-than-days", "30", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert dry.output.startswith("dry run: evidence of jobs finished before ")
    assert f"{job_id}  completed" in dry.output and "3 files, 202 B  would remove" in dry.output
    assert "would remove the evidence of 1 job(s): 3 files, 202 B" in dry.output
    assert (root / "job_a").exists()
    kept = runner.invoke(app, ["purge", "--older-than-days", "45"])
    assert kept.exit_code == 0 and kept.output.rstrip().endswith("nothing to purge")
    real = runner.invoke(app, ["purge"])
    assert real.exit_code == 0, real.output
    assert "3 files, 202 B  removed" in real.output and "removed the evidence of 1 job(s)" in real.output
    assert not (root / "job_a").exists()
    assert runner.invoke(app, ["purge", "--older-than-days", "-1"]).exit_code == 2
