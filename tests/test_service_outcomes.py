"""Service jobs take the run's honest status: a full job whose participant dies mid-run ends ``failed`` with
an error summary and failed counts, gives its quota slot back and opens no review; a full job that fails on
one bundle of several keeps the other bundles' results, names the failing bundle and its cause, and its
overall progress never drops when the next bundle starts.

The app runs in-process (FastAPI TestClient) with the job run synchronously by the real worker code on the
session's Ray; the participant is a real loopback server that stops listening after 3 Adds.
"""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from aml_ray.serve_app import worker
from aml_ray.serve_app.routes.jobs import job_out
from aml_ray.serve_app.worker import JobWorker
from aml_ray.store.jobs import get_job, mark_completed
from aml_ray.store.models import Result, Review
from aml_ray.store.quotas import count_usage
from tests.dying_participants import FAST_RETRY, FailingParticipant
from tests.service_suites import bundles_suite
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


def _fast_retries(monkeypatch) -> None:
    participant = JobWorker._participant
    monkeypatch.setattr(JobWorker, "_participant",  # quick retries: a failure budget is reached in about a second
                        lambda self, s, v: (lambda spec, secret: (spec.model_copy(update={"retry": FAST_RETRY}),
                                                                  secret))(*participant(self, s, v)))


def test_full_job_whose_participant_dies_ends_failed_and_gives_its_quota_back(tmp_path, locomo_file, monkeypatch):
    _fast_retries(monkeypatch)
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


def test_a_full_job_that_fails_on_one_bundle_keeps_the_others_and_names_it(tmp_path, monkeypatch):
    """LoCoMo (first) stops at its first Search (HTTP 400); LongMemEval oracle (standing in for the absent -S
    file) runs. Overall progress is sampled at every progress write of the worker."""
    _fast_retries(monkeypatch)
    samples: list[float] = []
    write = worker._Progress._write

    def sampled(self, kind, values):
        write(self, kind, values)
        with self.sessions() as s:
            samples.append(job_out(get_job(s, self.job_id)).progress)

    monkeypatch.setattr(worker._Progress, "_write", sampled)
    suite = bundles_suite("textual", "locomo", "longmemeval_s", "longmemeval_oracle")
    with FailingParticipant(refuse_search_of="locomo") as participant, \
            make_client(tmp_path, suites={"textual": suite}, full_limit_samples=1) as client:
        key, _, job_id = _full_job(client, participant.base_url)
        service = client.app.state.service
        JobWorker(service).run_job(job_id)
        job = client.get(f"/api/jobs/{job_id}", headers=bearer(key)).json()
        result = client.get(f"/api/results/{job_id}", headers=bearer(key))
        listed = client.get("/api/jobs", headers=bearer(key)).json()
        with service.sessions() as s:
            reviews = s.scalar(select(func.count()).select_from(Review))
        drill = f"/evaluate/jobs/{job_id}/datasets/longmemeval_oracle"
        anonymous = client.get(drill).status_code
        other_key, _ = onboard(client, participant.base_url, system_name="Someone else")
        assert client.post("/evaluate/key", data={"key": other_key}, follow_redirects=False).status_code == 303
        other = client.get(drill).status_code
        assert client.post("/evaluate/key", data={"key": key}, follow_redirects=False).status_code == 303
        questions = client.get(drill)
        wrong = client.get(drill, params={"show": "wrong"}).text
        refused_bundle = client.get(f"/evaluate/jobs/{job_id}/datasets/locomo").status_code  # it failed
        qid = questions.text.split('data-question="')[1].split('"')[0]
        question = client.get(f"{drill}/questions/{qid}")
        public = client.get("/api/leaderboard/textual").text
    # the owner's drill-down: the question list (filters) and one question's memories, answer, gold, verdict
    assert (anonymous, other, refused_bundle, questions.status_code, question.status_code) == (403, 404, 404, 200, 200)
    assert "1 of 1 questions." in questions.text and ("1 of 1 questions." in wrong) != ("0 of 1 questions." in wrong)
    assert all(f'id="{part}"' in question.text for part in ("memories", "answer", "gold", "verdict", "judge-raw"))
    assert question.text.count('<td class="num">1</td>') == 1  # rank 1 of the memories Search returned
    assert qid not in public
    assert job["status"] == "partial"
    locomo, oracle = job["bundles"]
    assert (locomo["name"], locomo["status"]) == ("locomo", "failed")
    assert locomo["reason"].startswith("stopped: ParticipantError: search ") and "HTTP 400 is not retried" in \
        locomo["reason"] and "ray::" not in locomo["reason"], locomo["reason"]  # the cause, not Ray's traceback
    assert 0 < locomo["progress"] < 1 and locomo["score"] is None
    assert (oracle["name"], oracle["status"], oracle["progress"]) == ("longmemeval_oracle", "ran", 1.0)
    assert (oracle["n_total"], oracle["n_scored"]) == (1, 1) and 0 <= oracle["score"] <= 1
    assert job["error_summary"].startswith("bundle locomo failed: stopped: "), job["error_summary"]
    judge = next(st for st in job["stages"] if st["stage"] == "judge")
    assert judge["done"] < judge["total"]  # LoCoMo's questions were never judged
    assert job["progress"] == round((locomo["progress"] + 1) / 2, 4) < 1.0
    assert [j["progress"] for j in listed if j["id"] == job_id] == [job["progress"]]
    assert len(samples) > 4 and samples == sorted(samples), samples  # never drops when the oracle bundle starts
    assert result.status_code == 200, result.text
    assert {r["dataset"] for r in result.json()["table"]} == {"longmemeval_oracle"}
    assert reviews == 0
