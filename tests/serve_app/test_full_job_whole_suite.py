"""A full service job over every Textual bundle whose files ../shared/datasets holds, against the reference system,
ends ``completed`` and reaches the review queue (the suite's bundles each run a sample: AML_FULL_SAMPLES=1)."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from cryptography.fernet import Fernet
from pydantic import SecretStr

from aml_ray.config import ModelEndpoint
from aml_ray.reference.server import ReferenceServer
from aml_ray.serve_app.settings import ServiceSettings
from aml_ray.suite import SUITES_DIR
from tests.conftest import SHARED_DATASETS
from tests.fake_openai import FakeOpenAI, Reply
from tests.servers import ThreadServer
from tests.test_service_flow import ADMIN, MSK, Api, _onboard, free_port

pytestmark = pytest.mark.ray

#: The Textual bundles whose files ../shared/datasets holds (LongMemEval oracle stands in for the absent -S file).
PRESENT = ["locomo", "longmemeval_oracle", "beam"]


def present_bundles_suite() -> str:
    """A copy of the shipped Textual suite (same name and version) holding the present bundles, and LongMemEval-S
    whose absent file the oracle bundle stands in for."""
    suite = json.loads((SUITES_DIR / "textual.json").read_text())
    suite["bundles"] = [b for b in suite["bundles"] if b["name"] in PRESENT + ["longmemeval_s"]]  # its stand-in
    path = Path(tempfile.mkdtemp(prefix="aml-suite-")) / "textual-present.json"
    path.write_text(json.dumps(suite))
    return str(path)


def judge_reply(prompt: str) -> str:
    """The locked models' stand-in: a rubric verdict for BEAM's rubric judge, a label for the others (about
    half correct, by prompt length); the answers are the same text, which the judges never see as a verdict."""
    if '{"score": 0.5' in prompt:
        return '{"score": %s, "reason": "one sentence"}' % ("1.0" if len(prompt) % 2 else "0.5")
    return '{"label": "%s"}' % ("CORRECT" if len(prompt) % 2 else "WRONG")


@pytest.fixture
def service(ray_session, tmp_path):
    from ray import serve

    from aml_ray.serve_app.deployment import run

    fake = FakeOpenAI(lambda prompt, n: Reply(judge_reply(prompt)))
    http = ThreadServer(fake.app).__enter__()
    models = {role: ModelEndpoint(role=role, base_url=f"{http.base_url}/v1", model="gpt-4o-mini",
                                  api_key=SecretStr("sk-test"), cache_path=None) for role in ("answer", "judge")}
    settings = ServiceSettings(database_url=f"sqlite:///{tmp_path / 'aml.sqlite3'}",
                               master_keys=[SecretStr(Fernet.generate_key().decode())],
                               admin_token=SecretStr(ADMIN), allow_loopback=True, runs_dir=tmp_path / "runs",
                               datasets_dir=SHARED_DATASETS, suites={"textual": present_bundles_suite()},
                               smoke_limit_samples=1, full_limit_samples=1, **models)
    port = free_port()
    run(settings, host="127.0.0.1", port=port)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:  # Serve answers 404 until the routes are ready
        try:
            if httpx.get(f"{base}/api/leaderboard/textual", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "Serve app not ready within 120 s"
        time.sleep(0.2)
    try:
        yield base
    finally:
        serve.shutdown()
        http.__exit__(None, None, None)


def test_a_full_job_over_every_present_bundle_completes_and_reaches_review(service, tmp_path):
    api = Api(service)
    with ReferenceServer(tmp_path / "reference", auth="Bearer", secret=MSK) as ref:
        key, version_id = _onboard(api, ref, "BM25 reference")
        smoke = api.call("POST", "/api/jobs", key=key, json={"version_id": version_id, "mode": "smoke",
                                                             "run_label": "smoke-1", "track": "textual"})
        assert smoke.status_code == 202, smoke.text
        assert api.wait_job(smoke.json()["id"], key, timeout=600)["status"] == "completed"
        checklist = {"smoke_passed": True, "contract_followed": True, "run_instructions_complete": True,
                     "original_work_disclosed": True, "no_integrity_violation": True}
        full = api.call("POST", "/api/jobs", key=key, json={"version_id": version_id, "mode": "full",
                                                            "run_label": "full-1", "track": "textual",
                                                            "checklist": checklist})
        assert full.status_code == 202, full.text
        job = api.wait_job(full.json()["id"], key, timeout=900)
    assert job["status"] == "completed", job["error_summary"]
    res = api.call("GET", f"/api/results/{job['id']}", key=key).json()
    assert sorted(res["facts"]["datasets"]) == sorted(PRESENT)
    assert res["review"]["status"] == "pending"
    queue = api.call("GET", "/api/admin/reviews", key=ADMIN).json()
    assert [r["job_id"] for r in queue] == [job["id"]]
