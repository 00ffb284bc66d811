"""The publication gate against the pinned release baseline of the track's suite file: a full job that ran
part of the suite, or a sample of each bundle, never passes; one that ran every pinned bundle whole does."""

from __future__ import annotations

from typing import Any

from pydantic import SecretStr

from aml_ray.run.provenance import pipeline_code_hash
from aml_ray.serve_app.gate import publication_gate, release_baseline, run_facts, suite_facts
from aml_ray.serve_app.settings import ServiceSettings
from aml_ray.store import session_factory
from aml_ray.store.models import Job
from aml_ray.suite import load_suite
from tests.test_store import _approved_version

SUITE = load_suite("textual")


def _run_info(bundle, *, samples: int, questions: int, limit: int | None) -> dict[str, Any]:
    """A run.json of one bundle as the evaluation writes it, with the suite's models and prompt pins."""
    return {"run_id": f"r-{bundle.name}", "offline_models": False,
            "models": {role: {"model": getattr(SUITE.models, role), "offline": False} for role in ("answer", "judge")},
            "prompts": {role: {"name": p.name, "sha256": p.sha256} for role, p in bundle.prompts.items()},
            "top_k": SUITE.top_k, "pipeline_code_sha256": pipeline_code_hash(),
            "dataset": {"name": bundle.dataset, "sha256": "f" * 64, "hash_mismatch_allowed": False,
                        "samples": samples, "questions": questions, "scorable_questions": questions},
            "bundle": {"bundle": bundle.name, "files_match": True}, "adds": {"ok": 5, "failed": 0},
            "limit_samples": limit, "wall_s": 1.0}


def _gate(engine, infos: list[dict[str, Any]]) -> dict[str, Any]:
    settings = ServiceSettings(database_url="sqlite://", master_keys=[SecretStr("k")])  # the shipped suites
    facts = suite_facts([run_facts(i) for i in infos], suite=f"{SUITE.name}@{SUITE.version}")
    table = [{"dataset": i["dataset"]["name"], "category": "overall", "n_errors": 0} for i in infos]
    with session_factory(engine).begin() as s:
        version = _approved_version(s).version
        job = Job(key_id=version.system.key_id, version_id=version.id, mode="full", track="textual",
                  run_label="f", status="completed")
        s.add(job)
        s.flush()
        return publication_gate(s, job, table, facts, release_baseline(settings, "textual"))


def test_three_of_eight_bundles_one_sample_each_fail_the_gate(engine):
    primaries = [b for b in SUITE.bundles if b.substitute_for is None]
    gate = _gate(engine, [_run_info(b, samples=1, questions=20, limit=1) for b in primaries[:3]])
    failed = {name: c["detail"] for name, c in gate["checks"].items() if not c["ok"]}
    assert gate["passed"] is False
    assert set(failed) == {"suite_bundles", "dataset_bundle_hashes", "question_counts", "all_samples",
                           "evaluation_contract"}, failed
    missing = [b.name for b in primaries[3:]]
    assert failed["suite_bundles"] == f"ran 3 of the suite's {len(primaries)} bundles; missing: " + ", ".join(
        sorted(b.dataset for b in primaries[3:]))
    assert missing and failed["all_samples"].startswith("limited to 1 sample(s) per bundle (AML_FULL_SAMPLES)")
    assert f"{primaries[0].dataset}: 20 of {primaries[0].expected.total}" in failed["question_counts"]


def test_every_pinned_bundle_whole_passes_the_release_checks(engine):
    primaries = [b for b in SUITE.bundles if b.substitute_for is None]
    gate = _gate(engine, [_run_info(b, samples=10, questions=b.expected.total, limit=None) for b in primaries])
    checks = {name: c["ok"] for name, c in gate["checks"].items()}
    assert checks["suite_bundles"] and checks["question_counts"] and checks["all_samples"] and checks["locked_models"]
    # the shipped suite still has bundles without sha256 pins (or prompt pins): those are named, not passed
    unpinned = [b.dataset for b in primaries if not b.pinned]
    if unpinned:
        assert not checks["dataset_bundle_hashes"]
        assert gate["checks"]["dataset_bundle_hashes"]["detail"].endswith(", ".join(unpinned))


def test_the_job_page_names_each_failed_check_and_why(tmp_path):
    from cryptography.fernet import Fernet
    from fastapi.testclient import TestClient

    from aml_ray.serve_app.app import create_app
    from aml_ray.store.jobs import create_job, mark_completed
    from aml_ray.store.results import open_review, save_result
    from aml_ray.store.synthetic import FULL_CHECKLIST, approved_key

    settings = ServiceSettings(database_url=f"sqlite:///{tmp_path / 'aml.sqlite3'}",
                               master_keys=[SecretStr(Fernet.generate_key().decode())], run_worker=False,
                               runs_dir=tmp_path / "runs")
    app = create_app(settings)
    with app.state.service.sessions.begin() as s:
        key, key_id, version = approved_key(s, system="Gate Probe")
        mark_completed(s, create_job(s, key_id=key_id, version=version, mode="smoke", run_label="s", edition="e"))
        full = create_job(s, key_id=key_id, version=version, mode="full", run_label="f", edition="e",
                          checklist=FULL_CHECKLIST)
        mark_completed(s, full)
        save_result(s, full, [{"dataset": "locomo", "category": "overall", "accuracy": 0.4, "coverage": 1.0,
                               "f1": 0.2, "n_total": 10, "n_scored": 10, "n_errors": 0}], {})
        open_review(s, full, {"passed": False, "checks": {
            "unique": {"ok": True, "detail": "no other publication of this version"},
            "all_samples": {"ok": False, "detail": "limited to 1 sample(s) per bundle (AML_FULL_SAMPLES): never "
                                                   "publishable"}}})
        job_id = full.id
    with TestClient(app) as client:
        client.post("/evaluate/key", data={"key": key})
        page = client.get(f"/evaluate/jobs/{job_id}").text
    assert '<li data-check="all_samples"><strong>all samples</strong>: limited to 1 sample(s) per bundle ' \
           '(AML_FULL_SAMPLES): never publishable</li>' in page
    assert 'data-check="unique"' not in page
