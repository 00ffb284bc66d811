"""The pages' forms over HTTP (TestClient, no browser): refusals name the field and never echo a secret;
the page session cookie holds no credential and cannot be forged; the status token delivers the key once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cryptography.fernet import Fernet
from fastapi.testclient import TestClient
from pydantic import SecretStr

from aml_ray.serve_app.app import create_app
from aml_ray.serve_app.settings import ServiceSettings

ADMIN = "admin-token-forms-0123456789abcdef"
MSK = "msk-forms-secret-1a2b3c4d5e6f"


@pytest.fixture
def client(tmp_path) -> Iterator[TestClient]:
    settings = ServiceSettings(database_url=f"sqlite:///{tmp_path / 'aml.sqlite3'}",
                               master_keys=[SecretStr(Fernet.generate_key().decode())], admin_token=SecretStr(ADMIN),
                               allow_loopback=True, run_worker=False, health_check=False, runs_dir=tmp_path / "runs")
    with TestClient(create_app(settings)) as c:
        yield c


def api_request(client: TestClient) -> dict:
    body = {"contact_name": "Ada", "contact_email": "ada@example.org", "organization": "Lab", "system_name": "MemSys",
            "version_label": "v1", "track": "textual", "division": "commercial", "add_url": "http://127.0.0.1:9/add",
            "search_url": "http://127.0.0.1:9/search", "auth_scheme": "Bearer", "memory_system_key": MSK}
    r = client.post("/api/access-requests", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def test_status_token_delivers_the_issued_key_once_through_the_api(client):
    created = api_request(client)
    token = created["status_token"]
    assert token.startswith("amls_") and MSK not in str(created)
    pending = client.post("/api/access-requests/status", json={"status_token": token}).json()
    assert (pending["status"], pending["leaderboard_key"]) == ("pending", None)
    approved = client.post(f"/api/admin/access-requests/{created['id']}/approve",
                           headers={"Authorization": f"Bearer {ADMIN}"}).json()
    assert approved["delivered_to_submitter"] is True
    first = client.post("/api/access-requests/status", json={"status_token": token}).json()
    assert first["status"] == "approved" and first["leaderboard_key"] == approved["leaderboard_key"]
    assert first["version_id"] == approved["version_id"]
    again = client.post("/api/access-requests/status", json={"status_token": token}).json()
    assert again["leaderboard_key"] is None
    assert client.get("/api/keys/me", headers={"Authorization": f"Bearer {first['leaderboard_key']}"}).status_code == 200
    unknown = client.post("/api/access-requests/status", json={"status_token": "amls_" + "x" * 43})
    assert unknown.status_code == 404 and unknown.json()["detail"]["reason"] == "no access request for this status token"


def test_refused_forms_name_the_field_and_never_echo_secrets(client):
    r = client.post("/evaluate/key", data={"key": "aml_not-a-key-but-secret-looking"})
    assert r.status_code == 401 and "not valid" in r.text and "aml_not-a-key-but-secret-looking" not in r.text
    r = client.post("/apply", data={"kind": "new_key", "contact_name": "Ada", "contact_email": "not-an-email",
                                    "organization": "Lab", "system_name": "S", "version_label": "v1", "track": "textual",
                                    "division": "open_source", "add_url": "http://127.0.0.1:9/add",
                                    "search_url": "http://127.0.0.1:9/search", "auth_scheme": "Bearer",
                                    "memory_system_key": MSK, "max_in_flight": "16", "timeout_s": "1800"})
    assert r.status_code == 422 and MSK not in r.text
    assert "contact_email: String should match pattern" in r.text
    r = client.post("/access-requests/status", data={"status_token": "amls_wrong"})
    assert r.status_code == 404 and "no access request for this status token" in r.text and "amls_wrong" not in r.text
    r = client.post("/admin/login", data={"token": "guess"})
    assert r.status_code == 401 and "guess" not in r.text


def test_page_session_cookie_holds_the_key_id_only_and_rejects_forgery(client):
    created = api_request(client)
    key = client.post(f"/api/admin/access-requests/{created['id']}/approve",
                      headers={"Authorization": f"Bearer {ADMIN}"}).json()["leaderboard_key"]
    r = client.post("/evaluate/key", data={"key": key}, follow_redirects=False)
    assert r.status_code == 303
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/evaluate" in cookie
    value = r.cookies["aml_eval"]
    assert key not in cookie and key[4:20] not in value
    page = client.get("/evaluate")
    assert key[:8] in page.text and key not in page.text and "MemSys" in page.text
    # a full job without the checklist is refused with every missing item named
    version_id = client.post("/api/access-requests/status", json={"status_token": created["status_token"]}).json()["version_id"]
    r = client.post("/evaluate/jobs", data={"version_id": version_id, "run_label": "f1", "mode": "full",
                                            "checklist": ["smoke_passed"]})
    assert r.status_code == 422
    for item in ("contract_followed", "run_instructions_complete", "original_work_disclosed", "no_integrity_violation"):
        assert f"checklist.{item}: must be confirmed (true) before a full run" in r.text
    client.cookies.clear()
    client.cookies.set("aml_eval", value[:-2] + ("AA" if not value.endswith("AA") else "BB"), path="/evaluate")
    assert "Verify your Leaderboard API key" in client.get("/evaluate").text
    client.cookies.clear()
    assert client.get("/admin/reviews", follow_redirects=False).headers["location"] == "/admin"
    r = client.post(f"/admin/access-requests/{created['id']}/reject", data={"reason": "x"}, follow_redirects=False)
    assert r.status_code == 303  # no admin session: nothing decided


def test_pages_send_a_same_origin_policy_and_no_cache(client):
    for path in ("/evaluate", "/apply", "/access-requests/status", "/guide", "/guide/api", "/benchmarks/propose", "/admin"):
        r = client.get(path)
        assert r.status_code == 200, path
        assert r.headers["cache-control"] == "no-store"
        assert "script-src 'self'" in r.headers["content-security-policy"] and "http" not in r.headers["content-security-policy"]
        assert "//" not in "".join(line for line in r.text.splitlines() if "src=" in line or "href=\"http" in line)


def test_the_key_verification_returns_to_a_job_id_only(client):
    """A job link without a page session goes to the verification and back to that job, never to a URL."""
    created = api_request(client)
    key = client.post(f"/api/admin/access-requests/{created['id']}/approve",
                      headers={"Authorization": f"Bearer {ADMIN}"}).json()["leaderboard_key"]
    short = client.get("/jobs/job_abc", follow_redirects=False)
    assert (short.status_code, short.headers["location"]) == (307, "/evaluate/jobs/job_abc")
    page = client.get("/evaluate/jobs/job_abc", follow_redirects=False)
    assert (page.status_code, page.headers["location"]) == (303, "/evaluate?job=job_abc")
    assert 'name="job" value="job_abc"' in client.get("/evaluate?job=job_abc").text
    for target in ("//evil.example", "https://evil.example/", "../admin", "job_abc/../../admin"):
        assert client.get("/evaluate", params={"job": target}).status_code == 422
        r = client.post("/evaluate/key", data={"key": key, "job": target}, follow_redirects=False)
        assert r.status_code == 422 and "set-cookie" not in r.headers, target
    assert client.get("/jobs/..%2Fadmin", follow_redirects=False).status_code in (404, 422)
    r = client.post("/evaluate/key", data={"key": key, "job": "job_abc"}, follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, "/evaluate/jobs/job_abc")
    assert client.get("/evaluate/jobs/job_abc").status_code == 404  # verified, but no such job for this key
