"""Coding and Multimodal jobs through the service API (issue 27, last item), each on its own board.

Each test: access request -> approval -> smoke -> full -> result -> the gate's track checks -> review
approve -> the row on that track's board (JSON and page) and not on the Textual one. Real parts: the
reference memory system on loopback, the session's Ray, the store on SQLite, the Coding sandbox with its
namespaces; the locked models are tests/fake_openai.py. Jobs run synchronously through
:class:`aml_ray.serve_app.worker.JobWorker` (the code a job's Ray actor runs).
"""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from aml_ray.coding.cambench import write_cambench
from aml_ray.coding.fixtures import generate_bench
from aml_ray.coding.sandbox import SandboxConfig
from aml_ray.config import ModelEndpoint
from aml_ray.reference.server import ReferenceServer
from aml_ray.serve_app.settings import ServiceSettings
from aml_ray.serve_app.worker import JobWorker
from aml_ray.store.jobs import get_job, mark_completed
from tests.fake_openai import FakeOpenAI, Reply
from tests.mm_fixtures import write_memgallery_release
from tests.servers import ThreadServer
from tests.service_suites import SAMPLE_LIMIT_CHECKS, one_bundle_suite, waive_sample_limit
from tests.test_coding_e2e import clue_script
from tests.test_service_api import MSK, admin_headers, bearer, make_client, onboard

pytestmark = pytest.mark.usefixtures("ray_session")

CHECKLIST = {"smoke_passed": True, "contract_followed": True, "run_instructions_complete": True,
             "original_work_disclosed": True, "no_integrity_violation": True}


def _models(base_url: str, *, vision: bool = False) -> dict[str, ModelEndpoint]:
    return {role: ModelEndpoint(role=role, base_url=f"{base_url}/v1", model="gpt-4o-mini", api_key=SecretStr("sk-t"),
                                cache_path=None, vision=vision) for role in ("answer", "judge")}


def _run(client, key: str, version_id: str, track: str, mode: str, label: str) -> dict:
    body = {"version_id": version_id, "mode": mode, "run_label": label, "track": track}
    if mode == "full":
        body["checklist"] = CHECKLIST
    r = client.post("/api/jobs", json=body, headers=bearer(key))
    assert r.status_code == 202, r.text
    JobWorker(client.app.state.service).run_job(r.json()["id"])
    return client.get(f"/api/jobs/{r.json()['id']}", headers=bearer(key)).json()


def _approve(client, job_id: str) -> None:
    [review] = [r for r in client.get("/api/admin/reviews", headers=admin_headers()).json() if r["job_id"] == job_id]
    approved = client.post(f"/api/admin/reviews/{review['id']}/approve", headers=admin_headers())
    assert approved.status_code == 200, approved.text


def test_coding_job_through_the_api_to_the_coding_board(tmp_path):
    bench_dir = tmp_path / "bench"
    bench, keys = generate_bench(bench_dir, n_repos=1, seed=7)
    write_cambench(bench, bench_dir)
    fake = FakeOpenAI(clue_script(bench, keys))  # the right diff only when the clue is among the memories
    with ThreadServer(fake.app) as http, ReferenceServer(tmp_path / "ref", auth="Bearer", secret=MSK) as ref, \
            make_client(tmp_path, coding_bench=bench_dir / "cambench.jsonl", smoke_limit_samples=1,
                        coding_sandbox=SandboxConfig(wall_clock_s=60), **_models(http.base_url)) as client:
        key, version_id = onboard(client, ref.base_url, track="coding", system_name="BM25 coder")
        smoke = _run(client, key, version_id, "coding", "smoke", "s1")
        assert (smoke["status"], smoke["error_summary"]) == ("completed", None), smoke
        assert [(s["stage"], s["done"], s["total"]) for s in smoke["stages"]] == [("attempts", 2, 2)]
        assert smoke["conformance"]["summary"]["exit_code"] == 0

        # a host whose sandbox cannot run the tests: the job fails with the sandbox's reason, nothing runs
        settings = client.app.state.service.settings
        settings.coding_sandbox = SandboxConfig(python=str(tmp_path / "no-python"))
        refused = _run(client, key, version_id, "coding", "full", "f0")
        assert refused["status"] == "failed"
        assert refused["error_summary"].startswith("the Coding sandbox refused to run on this host: ")
        assert "does not run" in refused["error_summary"]
        assert not (tmp_path / "runs" / refused["id"] / "cambench" / "run.json").exists()
        settings.coding_sandbox = SandboxConfig(wall_clock_s=60)

        full = _run(client, key, version_id, "coding", "full", "f1")
        assert full["status"] == "completed", full
        res = client.get(f"/api/results/{full['id']}", headers=bearer(key)).json()
        assert (res["track"], res["overall"], res["coverage"]) == ("coding", 1.0, 1.0)
        assert res["per_dataset"]["cambench"] == {
            "accuracy": 1.0, "resolved_rate": 1.0, "noisy_resolved_rate": 0.0, "memory_gain": 1.0,
            "coverage": 1.0, "n_total": 2}
        assert {(r["condition"], r["repo"]): r["n_resolved"] for r in res["table"] if r["repo"] == "overall"} == \
            {("noisy", "overall"): 0, ("relevant", "overall"): 1}
        gate = res["review"]["gate"]
        assert {name: c["ok"] for name, c in gate["checks"].items()} == {
            "full_run_completed": True, "all_tasks_succeeded": True, "locked_models": True, "suite": True,
            "evaluation_contract": True, "pipeline_code_hash": True, "dataset_bundle_hashes": True,
            "task_counts": True, "sandbox_isolated": True, "unique": True}, gate
        assert res["facts"]["datasets"]["cambench"]["attempts"] == 2 and res["facts"]["sandbox"] == "namespaces"
        assert client.get("/api/leaderboard/coding").json()["rows"] == []  # not before approval
        _approve(client, full["id"])

        board = client.get("/api/leaderboard/coding").json()
        assert board["datasets"] == ["cambench"]
        [row] = board["rows"]
        assert (row["rank"], row["system"], row["overall"], row["memory_gain"], row["coverage"]) == \
            (1, "BM25 coder", 1.0, 1.0, 1.0)
        assert row["suite"] == "cambench@2026.1-draft.1" and row["answer_model"] == "gpt-4o-mini"
        assert client.get("/api/leaderboard/textual").json()["rows"] == []
        assert client.get("/api/leaderboard/multimodal").json()["rows"] == []
        page = client.get("/leaderboard/coding").text
        assert 'data-system="BM25 coder"' in page and "Memory gain" in page and "+100.0" in page
        assert "CAMBench resolved rate with relevant memory" in page
        assert 'data-system="BM25 coder"' not in client.get("/leaderboard/textual").text
    assert MSK not in str(res) and "sk-t" not in str(res)


def test_multimodal_job_through_the_api_to_the_multimodal_board(tmp_path):
    datasets = tmp_path / "datasets"
    write_memgallery_release(datasets / "memgallery")
    fake = FakeOpenAI(lambda prompt, n: Reply('A red bicycle.\n{"label": "CORRECT"}'))
    with ThreadServer(fake.app) as http, \
            ReferenceServer(tmp_path / "ref", auth="Bearer", secret=MSK, multimodal=True) as ref, \
            make_client(tmp_path, datasets_dir=datasets,
                        suites={"multimodal": one_bundle_suite("multimodal", "memgallery")}, smoke_limit_samples=1,
                        full_limit_samples=1, **_models(http.base_url, vision=True)) as client:
        key, version_id = onboard(client, ref.base_url, track="multimodal", system_name="BM25 gallery")
        # the smoke runs the same bundle code as the full job (one sample): accepted through the API, marked
        # passed in the store, so the test runs one evaluation
        smoke = client.post("/api/jobs", json={"version_id": version_id, "mode": "smoke", "run_label": "s1",
                                               "track": "multimodal"}, headers=bearer(key))
        assert smoke.status_code == 202, smoke.text
        with client.app.state.service.sessions.begin() as s:
            mark_completed(s, get_job(s, smoke.json()["id"]))
        full = _run(client, key, version_id, "multimodal", "full", "f1")
        assert full["status"] == "completed", full
        res = client.get(f"/api/results/{full['id']}", headers=bearer(key)).json()
        gate = res["review"]["gate"]
        failed = {name for name, c in gate["checks"].items() if not c["ok"]}
        # one sample of a draft suite that pins neither the bundle's files nor its prompts yet
        assert failed == SAMPLE_LIMIT_CHECKS | {"dataset_bundle_hashes", "evaluation_contract"}, gate
        assert gate["checks"]["suite_bundles"]["detail"] == "ran 1 of the suite's 1 bundles"
        waive_sample_limit(client.app.state.service.settings.database_url, full["id"])
        assert res["facts"]["suite"] == "multimodal@2026.1-draft.3"
        mg = res["per_dataset"]["memgallery"]
        assert res["overall"] == pytest.approx(mg["accuracy"]) and 0.0 < mg["accuracy"] < 1.0 and mg["n_total"] == 2
        _approve(client, full["id"])

        board = client.get("/api/leaderboard/multimodal").json()
        [row] = board["rows"]
        assert (row["system"], row["suite"]) == ("BM25 gallery", "multimodal@2026.1-draft.3")
        assert row["overall"] == pytest.approx(res["overall"]) and row["memory_gain"] is None
        assert row["datasets"] == {"memgallery": mg}
        assert client.get("/api/leaderboard/textual").json()["rows"] == []
        assert client.get("/api/leaderboard/coding").json()["rows"] == []
        page = client.get("/leaderboard/multimodal?dataset=memgallery").text
        assert 'data-system="BM25 gallery"' in page and f"{mg['accuracy'] * 100:.1f}" in page


def test_coding_settings_bench_file_and_no_unsandboxed_mode(tmp_path):
    base = {"AML_MASTER_KEYS": "x" * 43 + "=", "AML_DATABASE_URL": "sqlite:///:memory:"}
    default = ServiceSettings.from_env({**base, "AML_DATASETS_DIR": str(tmp_path)})
    assert default.coding_bench_path() == tmp_path / "cambench" / "cambench.jsonl"
    given = ServiceSettings.from_env({**base, "AML_CODING_BENCH": str(tmp_path / "b.jsonl")})
    assert given.coding_bench_path() == tmp_path / "b.jsonl"
    with pytest.raises(ValueError, match="never runs participants' diffs without isolation"):
        ServiceSettings(database_url="sqlite://", master_keys=[SecretStr("k")],
                        coding_sandbox=SandboxConfig(unsandboxed=True))
    from aml_ray.serve_app.tracks import MissingBundles, job_bundles

    with pytest.raises(MissingBundles) as missing:
        job_bundles(given, "coding", "full")
    assert "AML_CODING_BENCH" in str(missing.value) and str(tmp_path / "b.jsonl") in str(missing.value)


def test_serve_command_takes_the_coding_bench(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from aml_ray.cli import app

    seen = {}
    monkeypatch.setattr("aml_ray.serve_app.cli._serve", lambda settings, **kw: seen.update(settings=settings))
    r = CliRunner().invoke(app, ["serve", "--coding-bench", str(tmp_path / "cambench.jsonl")],
                           env={"AML_MASTER_KEYS": "x" * 43 + "=", "AML_DATABASE_URL": "sqlite:///:memory:"})
    assert r.exit_code == 0, r.output
    assert seen["settings"].coding_bench_path() == tmp_path / "cambench.jsonl"
