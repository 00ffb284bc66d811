"""Service routes over HTTP (TestClient), without the job worker: auth, validation, quotas, visibility."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from cryptography.fernet import Fernet
from fastapi.testclient import TestClient
from pydantic import SecretStr

from aml_ray.serve_app.app import create_app
from aml_ray.serve_app.settings import ServiceSettings
from aml_ray.store.jobs import get_job, mark_completed
from aml_ray.store.models import QuotaUsage
from tests.conftest import SHARED_DATASETS
from tests.service_suites import locomo_only_suite

ADMIN = "admin-token-for-tests-0123456789"
MSK = "msk-very-secret-memory-key-42"


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        self.send_response(200 if self.path == "/health" else 503)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def stub_base() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def make_client(tmp_path, **over) -> TestClient:
    settings = ServiceSettings(database_url=f"sqlite:///{tmp_path / 'aml.sqlite3'}",
                               master_keys=[SecretStr(Fernet.generate_key().decode())],
                               admin_token=SecretStr(ADMIN), allow_loopback=True, run_worker=False,
                               runs_dir=tmp_path / "runs", datasets_dir=SHARED_DATASETS,
                               suites={"textual": locomo_only_suite()})
    for k, v in over.items():
        setattr(settings, k, v)
    return TestClient(create_app(settings))


@pytest.fixture
def client(tmp_path) -> Iterator[TestClient]:
    with make_client(tmp_path) as c:
        yield c


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN}"}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def request_body(base: str, **over) -> dict:
    body = {"contact_name": "Ada", "contact_email": "ada@example.org", "organization": "Lab",
            "system_name": "MemSys", "version_label": "v1", "track": "textual", "division": "commercial",
            "add_url": f"{base}/add", "search_url": f"{base}/search", "health_url": f"{base}/health",
            "auth_scheme": "Bearer", "memory_system_key": MSK}
    body.update(over)
    return body


def onboard(client: TestClient, base: str, **over) -> tuple[str, str]:
    """Access request -> approval; returns (leaderboard key, version id)."""
    r = client.post("/api/access-requests", json=request_body(base, **over))
    assert r.status_code == 201, r.text
    a = client.post(f"/api/admin/access-requests/{r.json()['id']}/approve", headers=admin_headers())
    assert a.status_code == 200, a.text
    return a.json()["leaderboard_key"], a.json()["version_id"]


def test_access_request_is_stored_pending_with_health_and_no_secret(client, stub_base):
    r = client.post("/api/access-requests", json=request_body(stub_base))
    assert r.status_code == 201
    body = r.json()
    assert body["status"] == "pending" and body["health"] == "HTTP 200" and body["has_memory_system_key"]
    assert MSK not in r.text
    listed = client.get("/api/admin/access-requests", headers=admin_headers())
    assert [x["id"] for x in listed.json()] == [body["id"]] and MSK not in listed.text


def test_validation_errors_have_field_details_and_never_echo_input(client, stub_base):
    r = client.post("/api/access-requests", json=request_body(stub_base, track="chess", max_in_flight=0))
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert detail["reason"] == "request validation failed"
    assert {tuple(e["loc"]) for e in detail["errors"]} == {("body", "track"), ("body", "max_in_flight")}
    assert MSK not in r.text
    r = client.post("/api/access-requests", json=request_body(stub_base, memory_system_key=None))
    assert r.status_code == 422 and "needs memory_system_key" in r.text
    r = client.post("/api/access-requests", json=request_body(stub_base, division="open_source"))
    assert r.status_code == 422 and "repository_url, commit and attribution" in r.text


def test_private_and_credentialed_endpoints_are_rejected_per_field(tmp_path, stub_base):
    with make_client(tmp_path, allow_loopback=False) as client:
        r = client.post("/api/access-requests", json=request_body(
            stub_base, add_url="http://10.0.0.5/add", search_url="http://u:pw@example.org/search"))
    assert r.status_code == 422
    errors = {e["loc"][1]: e["msg"] for e in r.json()["detail"]["errors"]}
    assert "private address" in errors["add_url"]
    assert "credentials in the URL" in errors["search_url"]
    assert "loopback" in errors["health_url"]
    assert "pw@" not in r.text


def test_failing_health_check_refuses_the_request(client, stub_base):
    r = client.post("/api/access-requests", json=request_body(stub_base, health_url=f"{stub_base}/down"))
    assert r.status_code == 422
    assert r.json() == {"detail": {"reason": "health check failed: GET health_url gave HTTP 503; any 2xx is "
                                             "healthy"}}


def test_admin_authentication_is_separate(client, tmp_path, stub_base):
    assert client.get("/api/admin/reviews").status_code == 401
    assert client.get("/api/admin/reviews", headers=bearer("wrong")).status_code == 401
    key, _ = onboard(client, stub_base)
    assert client.get("/api/admin/reviews", headers=bearer(key)).status_code == 401
    with make_client(tmp_path / "noadmin", admin_token=None) as other:
        r = other.get("/api/admin/reviews", headers=admin_headers())
    assert r.status_code == 503 and "AML_ADMIN_TOKEN" in r.json()["detail"]["reason"]


def test_key_is_shown_once_and_verifies(client, stub_base):
    key, version_id = onboard(client, stub_base)
    assert key.startswith("aml_")
    me = client.get("/api/keys/me", headers=bearer(key))
    assert me.status_code == 200
    assert me.json()["key_prefix"] == key[:8]
    assert [(v["id"], v["auth_scheme"], v["has_memory_system_key"]) for v in me.json()["versions"]] == \
        [(version_id, "Bearer", True)]
    assert key not in me.text and MSK not in me.text
    assert client.get("/api/keys/me").status_code == 401
    assert client.get("/api/keys/me", headers=bearer(key + "x")).json() == \
        {"detail": {"reason": "invalid Leaderboard API key"}}


def test_add_version_binds_to_the_presented_key(client, stub_base):
    key, v1 = onboard(client, stub_base)
    assert client.post("/api/access-requests",
                       json=request_body(stub_base, kind="add_version", version_label="v2")).status_code == 401
    r = client.post("/api/access-requests", headers=bearer(key),
                    json=request_body(stub_base, kind="add_version", version_label="v2"))
    assert r.status_code == 201
    a = client.post(f"/api/admin/access-requests/{r.json()['id']}/approve", headers=admin_headers())
    assert "leaderboard_key" not in a.json()
    labels = [v["label"] for v in client.get("/api/keys/me", headers=bearer(key)).json()["versions"]]
    assert labels == ["v1", "v2"]
    again = client.post(f"/api/admin/access-requests/{r.json()['id']}/approve", headers=admin_headers())
    assert again.status_code == 409 and "already approved" in again.json()["detail"]["reason"]
    actions = client.get("/api/admin/actions", headers=admin_headers()).json()
    assert [a["action"] for a in actions] == ["access_request.approve", "access_request.approve"]


def test_job_rules_checklist_label_quota_and_visibility(client, stub_base):
    key, version_id = onboard(client, stub_base)
    other_key, other_version = onboard(client, stub_base, system_name="Other")
    job = {"version_id": version_id, "mode": "smoke", "run_label": "smoke-1", "track": "textual"}
    assert client.post("/api/jobs", json=job).status_code == 401
    r = client.post("/api/jobs", json={**job, "mode": "full", "checklist": {"smoke_passed": True}},
                    headers=bearer(key))
    assert r.status_code == 422
    assert [e["loc"][-1] for e in r.json()["detail"]["errors"]] == \
        ["contract_followed", "run_instructions_complete", "original_work_disclosed", "no_integrity_violation"]
    assert client.post("/api/jobs", json={**job, "version_id": other_version}, headers=bearer(key)).status_code == 404
    assert client.post("/api/jobs", json={**job, "track": "coding"}, headers=bearer(key)).status_code == 409
    first = client.post("/api/jobs", json=job, headers=bearer(key))
    assert first.status_code == 202
    body = first.json()
    assert (body["status"], body["stage"], body["progress"]) == ("queued", "queued", 0.0)
    assert [s["stage"] for s in body["stages"]] == ["add", "search", "answer", "judge"]
    dup = client.post("/api/jobs", json=job, headers=bearer(key))
    assert dup.status_code == 409 and "run label 'smoke-1' is already used" in dup.json()["detail"]["reason"]
    active = client.post("/api/jobs", json={**job, "run_label": "smoke-2"}, headers=bearer(key))
    assert active.status_code == 409 and "active job" in active.json()["detail"]["reason"]
    service = client.app.state.service
    with service.sessions.begin() as s:
        mark_completed(s, get_job(s, body["id"]))
    quota = client.post("/api/jobs", json={**job, "run_label": "smoke-2"}, headers=bearer(key))
    assert quota.status_code == 429
    detail = quota.json()["detail"]
    assert "1 per hour" in detail["reason"]
    with service.sessions() as s:
        charged = s.query(QuotaUsage).filter_by(job_id=body["id"]).one().charged_at
    assert detail["available_at"] == (charged + timedelta(hours=1)).isoformat()
    assert client.get(f"/api/jobs/{body['id']}", headers=bearer(key)).json()["status"] == "completed"
    assert client.get(f"/api/jobs/{body['id']}", headers=bearer(other_key)).status_code == 404
    assert [j["id"] for j in client.get("/api/jobs", headers=bearer(key)).json()] == [body["id"]]
    assert client.get("/api/jobs", headers=bearer(other_key)).json() == []
    assert client.get(f"/api/results/{body['id']}", headers=bearer(key)).status_code == 404  # no result yet


def test_public_leaderboard_is_empty_before_publication_and_needs_no_key(client):
    r = client.get("/api/leaderboard/textual")
    assert r.status_code == 200 and r.json() == {"track": "textual", "datasets": ["locomo"], "rows": []}
    page = client.get("/leaderboard/textual")
    assert page.status_code == 200 and "No published results on this board yet." in page.text
    assert client.get("/api/leaderboard/chess").status_code == 422
    assert client.get("/api/leaderboard/textual?sort=secret").status_code == 422
    docs = client.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


def test_cluster_serve_config_validates_and_points_at_the_deployment():
    from pathlib import Path

    import yaml
    from ray.serve.schema import ServeDeploySchema

    from aml_ray.serve_app import deployment

    config = yaml.safe_load((Path(__file__).resolve().parents[1] / "cluster" / "serve_config.yaml").read_text())
    schema = ServeDeploySchema.model_validate(config)
    app = schema.applications[0]
    module, _, attr = app.import_path.partition(":")
    assert module == deployment.__name__ and callable(getattr(deployment, attr))
    assert [d.name for d in app.deployments] == ["aml-service"]


def test_smoke_runs_the_conformance_battery_first_and_stops_on_failure(tmp_path):
    from aml_ray.serve_app.worker import JobWorker
    from tests.bad_participants import BadParticipant

    with BadParticipant("top_k_plus_one", auth="Bearer", secret=MSK) as bad, make_client(tmp_path) as client:
        key, version_id = onboard(client, bad.base_url)
        job = client.post("/api/jobs", json={"version_id": version_id, "mode": "smoke", "run_label": "s1",
                                             "track": "textual"}, headers=bearer(key)).json()
        JobWorker(client.app.state.service).run_job(job["id"])  # synchronously; no worker thread in these tests
        status = client.get(f"/api/jobs/{job['id']}", headers=bearer(key)).json()
    assert status["status"] == "failed"
    assert status["error_summary"].startswith("conformance checks failed: top_k [data]")
    report = status["conformance"]
    outcomes = {c["name"]: c["outcome"] for c in report["checks"]}
    assert outcomes["top_k"] == "fail" and outcomes["add_shape"] == "pass" and outcomes["isolation"] == "pass"
    # the integrity canary: the memory addressed to the model came back and the smoke's report holds its flags
    integrity = next(c for c in report["checks"] if c["name"] == "integrity")
    assert (integrity["outcome"], integrity["required"]) == ("pass", False)
    assert integrity["data"]["rules"] == ["ignore_instructions", "role_marker", "verdict_request", "addresses_model",
                                          "fence_escape"]
    assert report["summary"]["exit_code"] == 1
    assert MSK not in str(status)


def test_public_leaderboard_shows_the_multimodal_track_with_its_datasets(client, stub_base):
    from aml_ray.store.jobs import create_job
    from aml_ray.store.keys import find_key
    from aml_ray.store.models import PublicSubmission, Version

    empty = client.get("/api/leaderboard/multimodal")
    assert empty.status_code == 200
    assert empty.json() == {"track": "multimodal", "datasets": ["atmbench", "atmbench_hard", "memgallery"], "rows": []}
    page = client.get("/leaderboard/multimodal")
    assert page.status_code == 200 and "Agent Memory Leaderboard: Multimodal" in page.text
    assert "No published results on this board yet." in page.text and "Mem-Gallery (memgallery_f1)" in page.text
    # a published multimodal row on a job of its version (the service does not run multimodal jobs yet, so the
    # row is written as approve_review would write it)
    key, version_id = onboard(client, stub_base, track="multimodal")
    service = client.app.state.service
    per = {"memgallery": {"accuracy": 0.5, "coverage": 1.0}, "atmbench": {"accuracy": 0.25, "coverage": 1.0},
           "atmbench_hard": {"accuracy": 0.75, "coverage": 0.9}}
    with service.sessions.begin() as s:
        version = s.get(Version, version_id)
        job = create_job(s, key_id=find_key(s, key).id, version=version, mode="smoke", run_label="mm-1",
                         edition=service.settings.edition)
        mark_completed(s, job)
        s.add(PublicSubmission(job_id=job.id, version_id=version.id, track="multimodal", system_name="MemSys",
                               organization="Lab", version_label="v1", division="commercial", overall=0.5,
                               coverage=0.97, per_dataset=per))
    board = client.get("/api/leaderboard/multimodal").json()
    assert board["datasets"] == ["atmbench", "atmbench_hard", "memgallery"]
    [row] = board["rows"]
    assert row["system"] == "MemSys" and row["overall"] == 0.5 and row["datasets"]["atmbench_hard"]["accuracy"] == 0.75
    only = client.get("/api/leaderboard/multimodal?dataset=atmbench").json()
    assert only["datasets"] == ["atmbench"] and only["rows"][0]["datasets"] == {"atmbench": per["atmbench"]}
    assert client.get("/api/leaderboard/textual").json()["rows"] == []  # boards are per track
    html = client.get("/leaderboard/multimodal").text
    assert 'data-system="MemSys"' in html and 'title="ATM-Bench-Hard (atmbench_qs)"' in html and "75.0" in html
