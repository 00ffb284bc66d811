"""Durable service jobs (issue 28, items 1-4 and 9): the database queue, the track's suite, the locked
models, the dataset and size settings, and the smaller service rules.

Store tests run on SQLite and on the machine's PostgreSQL (a fresh schema per test, the ``engine`` fixture).
"""

from __future__ import annotations

import os
import stat
import threading
from datetime import timedelta

import pytest
import sqlalchemy as sa
from pydantic import SecretStr

from aml_ray.serve_app.settings import ServiceSettings
from aml_ray.store import make_engine, session_factory, upgrade
from aml_ray.store.jobs import create_job, get_job, mark_completed
from aml_ray.store.models import Job, PublicSubmission, utcnow
from aml_ray.store.queue import claim_job, owns, renew_lease
from tests.conftest import PG_URL, SHARED_DATASETS
from tests.service_suites import locomo_only_suite
from tests.test_service_api import bearer, make_client, onboard, stub_base  # noqa: F401 (fixture)
from tests.test_store import _approved_version
from tests.waits import wait_until_actor_gone

CHECKLIST = {"smoke_passed": True, "contract_followed": True, "run_instructions_complete": True,
             "original_work_disclosed": True, "no_integrity_violation": True}


def _queued_jobs(sessions, n: int) -> list[str]:
    """``n`` queued jobs of one version, created oldest first."""
    with sessions.begin() as s:
        version = _approved_version(s).version
        start = utcnow() - timedelta(minutes=10)
        jobs = [Job(key_id=version.system.key_id, version_id=version.id, mode="smoke", track="textual",
                    run_label=f"r{i}", created_at=start + timedelta(seconds=i)) for i in range(n)]
        s.add_all(jobs)
        s.flush()
        return [j.id for j in jobs]


# ------------------------------------------------------------------------------------------- the queue


def test_claim_takes_the_oldest_once_and_an_expired_lease_is_claimed_again(engine):
    sessions = session_factory(engine)
    ids = _queued_jobs(sessions, 2)
    now = utcnow()
    with sessions.begin() as s:
        first = claim_job(s, owner="a", lease_s=30, now=now)
        assert (first.id, first.status, first.attempts, first.lease_owner) == (ids[0], "running", 1, "a")
    with sessions.begin() as s:
        assert claim_job(s, owner="b", lease_s=30, now=now).id == ids[1]
    with sessions.begin() as s:
        assert claim_job(s, owner="c", lease_s=30, now=now) is None  # both held
        assert renew_lease(s, ids[0], owner="a", lease_s=30, now=now + timedelta(seconds=20))
        assert not renew_lease(s, ids[0], owner="b", lease_s=30, now=now)  # not b's
    with sessions.begin() as s:  # a's lease was renewed to now+50 s; b's expired at now+30 s
        again = claim_job(s, owner="d", lease_s=30, now=now + timedelta(seconds=40))
        assert (again.id, again.attempts, again.lease_owner) == (ids[1], 2, "d")
        assert owns(s, ids[1], "d") and not owns(s, ids[1], "b")
        assert not renew_lease(s, ids[1], owner="b", lease_s=30)  # the old runner learns it lost the job
    with sessions.begin() as s:
        mark_completed(s, get_job(s, ids[0]))
    with sessions.begin() as s:  # a finished job is never claimed, whatever its lease said; d's expired one is
        assert claim_job(s, owner="e", lease_s=30, now=now + timedelta(hours=1)).id == ids[1]
        assert get_job(s, ids[0]).lease_owner is None and get_job(s, ids[1]).attempts == 3


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_two_replicas_take_different_jobs_never_the_same(dialect, tmp_path):
    """Two services ("replicas", each with its own engine and connection pool) on one database, four
    claiming threads each, race for 24 jobs: every job is claimed exactly once. Each thread claims at most
    3, so neither replica can take them all (on a loaded machine one replica's threads took every job
    before the other's ran, and the race was not tested)."""
    import secrets

    schema = f"aml_q_{secrets.token_hex(6)}" if dialect == "postgresql" else None
    url = PG_URL if dialect == "postgresql" else f"sqlite:///{tmp_path / 'q.sqlite3'}"
    engines = [make_engine(url, schema=schema) for _ in range(2)]
    try:
        upgrade(engines[0])
        ids = _queued_jobs(session_factory(engines[0]), 24)
        claims: dict[str, list[str]] = {}
        lock, start = threading.Lock(), threading.Barrier(8)

        def claimer(replica: int, n: int) -> None:
            sessions, owner = session_factory(engines[replica]), f"replica{replica}-t{n}"
            start.wait()
            mine = 0
            while mine < 3:
                with sessions.begin() as s:
                    job = claim_job(s, owner=owner, lease_s=60)
                    if job is not None:
                        mine += 1
                        with lock:
                            claims.setdefault(job.id, []).append(owner)
                        continue
                    # None: nothing claimable, or (SQLite) its 8 candidates all went to other claimers
                    left = s.scalar(sa.select(sa.func.count()).select_from(Job).where(Job.status == "queued"))
                if not left:
                    return

        threads = [threading.Thread(target=claimer, args=(r, n)) for r in range(2) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(claims) == sorted(ids)
        assert all(len(owners) == 1 for owners in claims.values()), claims
        assert {o.split("-")[0] for owners in claims.values() for o in owners} == {"replica0", "replica1"}
        with session_factory(engines[1])() as s:  # the stored owner is the one that claimed it
            stored = dict(s.execute(sa.select(Job.id, Job.lease_owner)).all())
        assert stored == {j: owners[0] for j, owners in claims.items()}
    finally:
        for e in engines:
            e.dispose()
        if schema:
            cleanup = sa.create_engine(PG_URL)
            with cleanup.begin() as conn:
                conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
            cleanup.dispose()


def test_postgresql_claim_skips_a_row_another_transaction_holds():
    """SKIP LOCKED: while replica A's claim transaction is open, replica B takes the next job at once."""
    import secrets

    schema = f"aml_q_{secrets.token_hex(6)}"
    engine = make_engine(PG_URL, schema=schema)
    try:
        upgrade(engine)
        sessions = session_factory(engine)
        ids = _queued_jobs(sessions, 2)
        with sessions() as a, sessions() as b:
            assert claim_job(a, owner="A", lease_s=60).id == ids[0]  # not committed: row locked
            b.execute(sa.text("SET LOCAL lock_timeout = '2s'"))  # a blocking claim would fail, not wait
            assert claim_job(b, owner="B", lease_s=60).id == ids[1]
            a.commit()
            b.commit()
    finally:
        engine.dispose()
        cleanup = sa.create_engine(PG_URL)
        with cleanup.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        cleanup.dispose()


# ----------------------------------------------------------------------------- suite, models, settings


def test_full_runs_the_track_suite_and_a_missing_bundle_is_an_operator_error(tmp_path, stub_base):
    from aml_ray.serve_app.tracks import job_bundles

    settings = ServiceSettings(database_url="sqlite://", master_keys=[SecretStr("k")], datasets_dir=SHARED_DATASETS)
    with pytest.raises(Exception) as missing:
        job_bundles(settings, "textual", "full")
    text = str(missing.value)
    assert text.startswith("operator error: the textual suite's bundle files are missing")
    assert "locomo_refined" in text and "clbench" in text and "AML_DATASETS_DIR" in text
    assert "longmemeval" not in text  # absent longmemeval_s: its substitute longmemeval_oracle is present
    # every present bundle of the fixed suite, in suite order, with the substitute standing for its absent primary
    complete = tmp_path / "datasets"
    complete.mkdir()
    for entry in SHARED_DATASETS.iterdir():
        (complete / entry.name).symlink_to(entry)
    for fake in ("locomo_refined/locomo_refined.json", "personamem/questions_32k.csv",
                 "personamem/shared_contexts_32k.jsonl", "clbench/CL-bench.jsonl"):
        (complete / fake).parent.mkdir(exist_ok=True)
        (complete / fake).write_text("")
    settings.datasets_dir = complete
    names = [b.name for b in job_bundles(settings, "textual", "full")]
    assert names == ["locomo", "locomo_refined", "longmemeval_oracle", "beam", "scriptmem", "personamem", "clbench"]
    assert [b.name for b in job_bundles(settings, "textual", "smoke")] == ["locomo"]
    # through the API: the full job is refused with 503 naming the bundle (after a passed smoke)
    with make_client(tmp_path, suites={}) as client:
        key, version_id = onboard(client, stub_base)
        smoke = client.post("/api/jobs", json={"version_id": version_id, "mode": "smoke", "run_label": "s1",
                                               "track": "textual"}, headers=bearer(key))
        assert smoke.status_code == 202, smoke.text
        with client.app.state.service.sessions.begin() as s:
            mark_completed(s, get_job(s, smoke.json()["id"]))
        full = client.post("/api/jobs", json={"version_id": version_id, "mode": "full", "run_label": "f1",
                                              "track": "textual", "checklist": CHECKLIST}, headers=bearer(key))
    assert full.status_code == 503
    assert "operator error" in full.json()["detail"]["reason"] and "clbench" in full.json()["detail"]["reason"]


def test_settings_for_dataset_files_and_sizes():
    base = {"AML_MASTER_KEYS": "x" * 43 + "=", "AML_DATABASE_URL": "sqlite:///:memory:"}
    default = ServiceSettings.from_env(base)
    assert (default.datasets_dir, default.smoke_limit_samples, default.full_limit_samples) == (None, 1, None)
    s = ServiceSettings.from_env({**base, "AML_DATASETS_DIR": str(SHARED_DATASETS), "AML_SMOKE_SAMPLES": "2",
                                  "AML_FULL_SAMPLES": "3", "AML_PURGE_INTERVAL_S": "0", "AML_MAX_BODY_BYTES": "4096"})
    assert (s.datasets_dir, s.smoke_limit_samples, s.full_limit_samples) == (SHARED_DATASETS, 2, 3)
    assert (s.purge_interval_s, s.max_body_bytes) == (None, 4096)
    from aml_ray.suite import load_suite

    assert s.bundle_path(load_suite("textual").bundle("locomo")) == SHARED_DATASETS / "locomo" / "locomo10.json"
    with pytest.raises(ValueError, match="AML_FULL_SAMPLES"):
        ServiceSettings.from_env({**base, "AML_FULL_SAMPLES": "some"})


def test_serve_command_takes_dataset_dir_and_sizes(monkeypatch):
    from typer.testing import CliRunner

    from aml_ray.cli import app

    seen = {}
    monkeypatch.setattr("aml_ray.serve_app.cli._serve", lambda settings, **kw: seen.update(settings=settings, **kw))
    r = CliRunner().invoke(app, ["serve", "--datasets-dir", str(SHARED_DATASETS), "--smoke-samples", "2",
                                 "--full-samples", "5", "--port", "8123"],
                           env={"AML_MASTER_KEYS": "x" * 43 + "=", "AML_DATABASE_URL": "sqlite:///:memory:"})
    assert r.exit_code == 0, r.output
    settings = seen["settings"]
    assert (settings.datasets_dir, settings.smoke_limit_samples, settings.full_limit_samples) == (SHARED_DATASETS, 2, 5)
    assert seen["port"] == 8123


def test_gate_refuses_the_offline_models_and_names_the_locked_ones(engine):
    from aml_ray.serve_app.gate import publication_gate

    sessions = session_factory(engine)
    with sessions.begin() as s:
        version = _approved_version(s).version
        job = Job(key_id=version.system.key_id, version_id=version.id, mode="full", track="textual",
                  run_label="f", status="completed")
        s.add(job)
        s.flush()
        ds = {"locomo": {"sha256": "a" * 64, "hash_mismatch_allowed": False, "files_match": True, "questions": 199}}
        baseline = {"suite": "textual@1", "answer_model": "gpt-4o-mini", "judge_model": "gpt-4o-mini",
                    "prompts": {"p": "1"}, "top_k": 100, "pipeline_code_sha256": "c",
                    "datasets": {"locomo": {"bundle": "locomo", "pinned": True, "questions": 199}}}
        table = [{"category": "overall", "n_errors": 0}]

        def facts(answer: str, offline: bool) -> dict:
            return {"suite": "textual@1", "offline_models": offline, "prompts": {"p": "1"}, "top_k": 100,
                    "models": {"answer": {"model": answer, "offline": offline},
                               "judge": {"model": answer, "offline": offline}},
                    "pipeline_code_sha256": "c", "datasets": ds, "adds": {"ok": 1, "failed": 0},
                    "limit_samples": None}

        offline = publication_gate(s, job, table, facts("gpt-4o-mini", True), baseline)
        online = publication_gate(s, job, table, facts("gpt-4o-mini", False), baseline)
        other = publication_gate(s, job, table, facts("gpt-4.1", False), baseline)
    assert offline["passed"] is False and offline["checks"]["locked_models"] == \
        {"ok": False, "detail": "offline answerer/judge: never published"}
    assert online["passed"] is True
    assert other["checks"]["locked_models"]["ok"] is False and "'gpt-4o-mini'" in other["checks"]["locked_models"]["detail"]


def test_the_release_baseline_locks_the_suite_models_not_the_environment(monkeypatch):
    from aml_ray.serve_app.gate import release_baseline

    monkeypatch.delenv("ANSWER_API_BASE", raising=False)  # the deployment's own models: offline
    settings = ServiceSettings(database_url="sqlite://", master_keys=[SecretStr("k")], datasets_dir=SHARED_DATASETS,
                               suites={"textual": locomo_only_suite()}, full_limit_samples=1)
    base = release_baseline(settings, "textual")
    assert (base["answer_model"], base["judge_model"]) == ("gpt-4o-mini", "gpt-4o-mini")
    assert base["suite"].startswith("textual-locomo@") and set(base["datasets"]) == {"locomo"}
    assert base["datasets"]["locomo"]["questions"] == 1986  # the suite's pin, not the deployment's sample limit


# ----------------------------------------------------------------------------------- smaller rules (9)


def test_checklist_booleans_are_strict(tmp_path, stub_base):
    with make_client(tmp_path) as client:
        key, version_id = onboard(client, stub_base)
        r = client.post("/api/jobs", json={"version_id": version_id, "mode": "full", "run_label": "f1",
                                           "track": "textual", "checklist": {**CHECKLIST, "smoke_passed": "yes"}},
                        headers=bearer(key))
    assert r.status_code == 422
    assert [e["loc"] for e in r.json()["detail"]["errors"]] == [["body", "checklist", "smoke_passed"]]


def test_body_over_the_limit_gets_413(tmp_path):
    with make_client(tmp_path, max_body_bytes=2048) as client:
        big = client.post("/api/access-requests", content=b"{" + b" " * 4096 + b"}",
                          headers={"Content-Type": "application/json"})
        chunked = client.post("/api/access-requests", content=iter([b"{", b" " * 4096, b"}"]),
                              headers={"Content-Type": "application/json"})
        small = client.post("/api/access-requests", json={})
    assert big.status_code == 413 and "2048 bytes" in big.json()["detail"]["reason"]
    assert chunked.status_code == 413 and "AML_MAX_BODY_BYTES" in chunked.json()["detail"]["reason"]
    assert small.status_code == 422


def test_tied_scores_share_a_rank_and_rows_name_their_model_and_suite(tmp_path, stub_base):
    with make_client(tmp_path) as client:
        service = client.app.state.service
        with service.sessions.begin() as s:
            for i, (name, overall) in enumerate([("A", 0.5), ("B", 0.7), ("C", 0.5), ("D", 0.3)]):
                version = _approved_version(s, system_name=name).version
                job = create_job(s, key_id=version.system.key_id, version=version, mode="smoke", run_label=f"r{i}",
                                 edition="cycle-2")
                s.add(PublicSubmission(job_id=job.id, version_id=version.id, track="textual", system_name=name,
                                       organization="Lab", version_label="v1", division="commercial",
                                       overall=overall, coverage=1.0, per_dataset={"locomo": {"accuracy": overall}},
                                       answer_model="gpt-4o-mini", suite="textual@2026.1"))
        rows = client.get("/api/leaderboard/textual").json()["rows"]
        by_locomo = client.get("/api/leaderboard/textual?dataset=locomo").json()["rows"]
    assert [(r["rank"], r["system"]) for r in rows] == [(1, "B"), (2, "A"), (2, "C"), (4, "D")]
    assert [r["rank"] for r in by_locomo] == [1, 2, 2, 4]
    assert {(r["answer_model"], r["suite"]) for r in rows} == {("gpt-4o-mini", "textual@2026.1")}


def test_sqlite_file_is_not_world_readable(tmp_path):
    path = tmp_path / "new.sqlite3"
    engine = make_engine(f"sqlite:///{path}")
    upgrade(engine)
    engine.dispose()
    old = tmp_path / "old.sqlite3"
    old.write_bytes(b"")
    os.chmod(old, 0o644)
    make_engine(f"sqlite:///{old}").dispose()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(old.stat().st_mode) == 0o600
    wal = path.with_name(path.name + "-wal")
    assert not wal.exists() or stat.S_IMODE(wal.stat().st_mode) == 0o600


def test_retention_purge_runs_on_the_dispatcher_schedule(tmp_path, stub_base):
    from aml_ray.serve_app.dispatch import JobDispatcher

    with make_client(tmp_path, retention_days=3) as client:
        key, version_id = onboard(client, stub_base)
        service = client.app.state.service
        old_dir = tmp_path / "runs" / "old"
        old_dir.mkdir(parents=True)
        (old_dir / "run.json").write_text("{}")
        with service.sessions.begin() as s:
            version = _approved_version(s, system_name="Other").version
            job = create_job(s, key_id=version.system.key_id, version=version, mode="smoke", run_label="r",
                             edition="cycle-2")
            job.status, job.finished_at, job.run_dir = "completed", utcnow() - timedelta(days=5), str(old_dir)
        dispatcher = JobDispatcher(service)
        assert dispatcher.turn() == []  # nothing queued; the first turn purges
        assert not old_dir.exists()
        with service.sessions() as s:
            assert s.get(Job, job.id).run_dir is None


# ------------------------------------------------------------------------------------------- standby


@pytest.mark.usefixtures("ray_session")
def test_a_job_runs_in_the_standby_actor_and_the_next_standby_starts(tmp_path):
    """Issue 29: the dispatcher keeps a job actor started ahead; the next job runs in it (no actor start
    before its first request), a new standby is started behind it, and stopping the service kills the
    standby (it holds no job)."""
    import ray

    from aml_ray.reference.server import ReferenceServer
    from aml_ray.serve_app.job_actor import NAMESPACE
    from tests.test_service_api import MSK
    from tests.test_service_restart import _wait

    with ReferenceServer(tmp_path / "ref", auth="Bearer", secret=MSK) as ref, \
            make_client(tmp_path, run_worker=True, poll_interval_s=0.2) as client:
        dispatcher = client.app.state.service.worker
        first = _wait(lambda: dispatcher.standby, 120, "a standby job actor")
        assert first.startswith("aml-job-standby-")
        assert ray.get(ray.get_actor(first, namespace=NAMESPACE).ping.remote(), timeout=60) is True
        key, version_id = onboard(client, ref.base_url)
        job = client.post("/api/jobs", json={"version_id": version_id, "mode": "smoke", "run_label": "s1",
                                             "track": "textual"}, headers=bearer(key)).json()
        done = _wait(lambda: (lambda j: j if j["status"] not in ("queued", "running") else None)(
            client.get(f"/api/jobs/{job['id']}", headers=bearer(key)).json()), 240, "the smoke job's end")
        assert done["status"] == "completed", done.get("error_summary")
        assert dispatcher.actor_names[job["id"]] == first  # it ran in the standby
        second = _wait(lambda: dispatcher.standby if dispatcher.standby != first else None, 120, "the next standby")
        assert ray.get(ray.get_actor(second, namespace=NAMESPACE).ping.remote(), timeout=60) is True

    def gone(name: str) -> bool:
        try:
            ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            return True
        return False

    _wait(lambda: gone(second), 30, "the stopped service's standby to be gone")
    _wait(lambda: gone(first), 30, "the job's actor to exit after its job")


@pytest.mark.usefixtures("ray_session")
def test_a_standby_nobody_pings_exits_by_itself(tmp_path):
    """A replica that died leaves no process behind: its standby exits once the pings stop."""
    import time

    import ray
    from cryptography.fernet import Fernet
    from ray.exceptions import RayActorError

    from aml_ray.serve_app.job_actor import NAMESPACE, JobActor, standby_name

    settings = ServiceSettings(database_url=f"sqlite:///{tmp_path / 'aml.sqlite3'}", runs_dir=tmp_path / "runs",
                               master_keys=[SecretStr(Fernet.generate_key().decode())])
    name = standby_name()
    # 10 s without a ping ends it: a loaded machine's slow pings (a round trip of a second or more) do not
    actor = JobActor.options(name=name, namespace=NAMESPACE, lifetime="detached").remote(settings, standby_s=10.0)
    for _ in range(8):  # pinged every 0.25 s for 2 s: it stays
        assert ray.get(actor.ping.remote(), timeout=60) is True
        time.sleep(0.25)
    wait_until_actor_gone(name, NAMESPACE, guard_s=120)  # no more pings: it kills itself
    with pytest.raises(RayActorError):
        ray.get(actor.ping.remote(), timeout=60)
