"""A full service job over every Textual bundle whose files ../shared/datasets holds, against the reference system,
ends ``completed`` and reaches the review queue (the suite's bundles each run a sample: AML_FULL_SAMPLES=1)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from aml_ray.reference.server import ReferenceServer
from aml_ray.suite import SUITES_DIR
from tests.conftest import SHARED_DATASETS
from tests.serve_harness import ADMIN, served
from tests.test_service_flow import MSK, Api, _onboard

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
    with served(tmp_path, judge_reply, datasets_dir=SHARED_DATASETS, suites={"textual": present_bundles_suite()},
                smoke_limit_samples=1, full_limit_samples=1) as base:
        yield base


def test_a_full_job_over_every_present_bundle_completes_and_reaches_review(service, tmp_path):
    api = Api(service)
    with ReferenceServer(tmp_path / "reference", auth="Bearer", secret=MSK) as ref:
        key, version_id = _onboard(api, ref, "BM25 reference")
        smoke = api.post_job(key, version_id, "smoke", "smoke-1")
        assert api.wait_job(smoke, key, timeout=600)["status"] == "completed"
        job = api.wait_job(api.post_job(key, version_id, "full", "full-1"), key, timeout=900)
    assert job["status"] == "completed", job["error_summary"]
    res = api.call("GET", f"/api/results/{job['id']}", key=key).json()
    assert sorted(res["facts"]["datasets"]) == sorted(PRESENT)
    assert res["review"]["status"] == "pending"
    queue = api.call("GET", "/api/admin/reviews", key=ADMIN).json()
    assert [r["job_id"] for r in queue] == [job["id"]]
