"""Service jobs take the run's honest status (issue 24): a full job whose participant dies mid-run ends
``failed`` with an error summary and failed counts, gives its quota slot back and opens no review.

The app runs in-process (FastAPI TestClient) with the job run synchronously by the real worker code on the
session's Ray; the participant is a real loopback server that stops listening after 3 Adds.
"""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from aml_ray.serve_app.worker import JobWorker
from aml_ray.store.jobs import get_job, mark_completed
from aml_ray.store.models import Result, Review
from aml_ray.store.quotas import count_usage
from tests.dying_participants import FAST_RETRY, FailingParticipant
from tests.test_service_api import bearer, make_client, onboard

pytestmark = pytest.mark.usefixtures("ray_session")
CHECKLIST = {"smoke_passed": True, "contract_followed": True, "run_instructions_complete": True,
             "original_work_disclosed": True, "no_integrity_violation": True}


def _full_job(client, base_url: str) -> tuple[str, str, str]:
    """Onboard, pass a smoke (marked completed in the store), submit a full job; returns (key, version, job id)."""
    key, version_id = onboard(client, base_url)
    smoke = client.post("/api/jobs", json={"version_id": version_id, "mode": "smoke", "run_label": "s1",
                                           "track": "textual"}, headers=bearer(key)).json()
    with client.app.state.service.sessions.begin() as s:
        mark_completed(s, get_job(s, smoke["id"]))
    full = client.post("/api/jobs", json={"version_id": version_id, "mode": "full", "run_label": "f1",
                                          "track": "textual", "checklist": CHECKLIST}, headers=bearer(key))
    assert full.status_code == 202, full.text
    return key, version_id, full.json()["id"]


def test_full_job_whose_participant_dies_ends_failed_and_gives_its_quota_back(tmp_path, locomo_file, monkeypatch):
    participant = JobWorker._participant
    monkeypatch.setattr(JobWorker, "_participant",  # quick retries: the budget is reached in about a second
                        lambda self, s, v: (lambda spec, secret: (spec.model_copy(update={"retry": FAST_RETRY}),
                                                                  secret))(*participant(self, s, v)))
    with FailingParticipant(die_after_adds=3) as dying, \
            make_client(tmp_path, dataset_paths={"locomo": locomo_file}, full_limit_samples=1) as client:
        key, version_id, job_id = _full_job(client, dying.base_url)
        service = client.app.state.service
        with service.sessions() as s:
            assert count_usage(s, key_id=get_job(s, job_id).key_id, track="textual", mode="full",
                               edition=service.settings.edition) == 1
        JobWorker(service).run_job(job_id)
        job = client.get(f"/api/jobs/{job_id}", headers=bearer(key)).json()
        with service.sessions() as s:
            key_id = get_job(s, job_id).key_id
            full_charged = count_usage(s, key_id=key_id, track="textual", mode="full", edition=service.settings.edition)
            reviews = s.scalar(select(func.count()).select_from(Review))
            results = s.scalar(select(func.count()).select_from(Result))
    assert job["status"] == "failed"
    assert job["error_summary"].startswith("failure budget exceeded: 5 of 8 Adds failed after retries")
    add = next(st for st in job["stages"] if st["stage"] == "add")
    assert (add["done"], add["failed"]) == (8, 5) and job["progress"] < 1.0
    assert full_charged == 0 and reviews == 0 and results == 0
