"""Cross-site request forgery from a same-site page, in real headless Chromium: a page served on another
loopback port (same site as the service, so ``SameSite=Strict`` cookies go along) auto-submits forms to the
service while the victim is signed in. None of them may change anything; the service's own forms still work."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from cryptography.fernet import Fernet
from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from pydantic import SecretStr
from sqlalchemy import func, select

from aml_ray.serve_app.app import create_app
from aml_ray.serve_app.settings import ServiceSettings
from aml_ray.store.access import create_access_request
from aml_ray.store.models import AccessRequest, Job
from aml_ray.store.synthetic import access_request_fields, approved_key
from tests.conftest import SHARED_DATASETS
from tests.servers import ThreadServer
from tests.service_suites import locomo_only_suite

ADMIN = "admin-token-csrf-0123456789abcdef"


@dataclass
class Site:
    service_url: str
    attacker_url: str
    sessions: object
    key: str
    attacker_key: str
    version_id: str
    request_id: str


def _attacker_app(target: str, version_id: str, request_id: str, attacker_key: str) -> FastAPI:
    """Pages that post a hidden form to ``target`` as soon as they load."""
    forms = {
        "job": (f"{target}/evaluate/jobs", {"version_id": version_id, "run_label": "forged", "mode": "smoke"}),
        "approve": (f"{target}/admin/access-requests/{request_id}/approve", {}),
        "login": (f"{target}/evaluate/key", {"key": attacker_key}),
    }
    app = FastAPI()

    @app.get("/{name}", response_class=HTMLResponse)
    def attack(name: str) -> str:
        action, fields = forms[name]
        inputs = "".join(f'<input type="hidden" name="{k}" value="{v}">' for k, v in fields.items())
        return (f'<html><body><form method="post" action="{action}">{inputs}</form>'
                f'<script>document.forms[0].submit()</script></body></html>')

    return app


@pytest.fixture
def site(tmp_path) -> Iterator[Site]:
    settings = ServiceSettings(database_url=f"sqlite:///{tmp_path / 'aml.sqlite3'}",
                               master_keys=[SecretStr(Fernet.generate_key().decode())], admin_token=SecretStr(ADMIN),
                               run_worker=False, health_check=False, runs_dir=tmp_path / "runs",
                               datasets_dir=SHARED_DATASETS, suites={"textual": locomo_only_suite()})
    app = create_app(settings)
    sessions = app.state.service.sessions
    with sessions.begin() as s:
        key, _key_id, version = approved_key(s, system="Victim Memory")
        attacker_key, _, _ = approved_key(s, system="Attacker Memory")
        request = create_access_request(s, access_request_fields("Pending Memory"))
        version_id, request_id = version.id, request.id
    with ThreadServer(app) as service:
        attacker = _attacker_app(service.base_url, version_id, request_id, attacker_key)
        with ThreadServer(attacker) as evil:
            yield Site(service.base_url, evil.base_url, sessions, key, attacker_key, version_id, request_id)
    app.state.service.engine.dispose()


def _forged_post_status(page, site: Site, name: str) -> int:
    """Open the attacker's page ``name``; the status the service gave its auto-submitted form."""
    with page.expect_response(lambda r: r.url.startswith(site.service_url) and r.request.method == "POST") as info:
        page.goto(f"{site.attacker_url}/{name}")
    return info.value.status


def test_forms_posted_from_another_port_change_nothing(browser, site):
    context = browser.new_context()
    page = context.new_page()
    # the victim signs in on the service's own pages: the same-origin forms still work
    page.goto(f"{site.service_url}/evaluate")
    page.fill("input[name=key]", site.key)
    page.click("form[action='/evaluate/key'] button[type=submit]")
    assert page.url == f"{site.service_url}/evaluate"
    assert page.locator("text=Victim Memory").count() >= 1
    page.goto(f"{site.service_url}/admin")
    page.fill("input[name=token]", ADMIN)
    page.click("form[action='/admin/login'] button[type=submit]")
    assert page.url.startswith(f"{site.service_url}/admin/access-requests")

    assert _forged_post_status(page, site, "job") == 403
    assert _forged_post_status(page, site, "approve") == 403
    assert _forged_post_status(page, site, "login") == 403
    with site.sessions() as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 0
        assert s.get(AccessRequest, site.request_id).status == "pending"
    # the victim's page session is still the victim's (the forged sign-in did not replace it)
    page.goto(f"{site.service_url}/evaluate")
    assert page.locator("text=Victim Memory").count() >= 1 and page.locator("text=Attacker Memory").count() == 0
    # and the victim's own job form works
    page.fill("input[name=run_label]", "own-smoke")
    page.click("form[action='/evaluate/jobs'] button[type=submit]")
    assert "/evaluate/jobs/" in page.url
    with site.sessions() as s:
        assert s.scalars(select(Job.run_label)).all() == ["own-smoke"]
    context.close()


@pytest.mark.parametrize("headers, status", [
    ({"Origin": "http://testserver"}, 303),  # the site's own page
    ({}, 303),  # no browser: API clients and scripts send neither header
    ({"Referer": "http://testserver/evaluate"}, 303),  # Origin absent: the Referer's origin counts
    ({"Origin": "https://proxy.example.org"}, 303),  # a trusted origin (a proxy in front)
    ({"Origin": "http://testserver:8081"}, 403),  # another port of the same host
    ({"Origin": "null"}, 403),  # opaque origin (sandboxed frame)
    ({"Referer": "http://evil.example/page"}, 403),
    ({"Origin": "http://evil.example", "Referer": "http://testserver/evaluate"}, 403),  # Origin wins
])
def test_state_changing_requests_need_this_origin(tmp_path, headers, status):
    from fastapi.testclient import TestClient

    settings = ServiceSettings(database_url=f"sqlite:///{tmp_path / 'aml.sqlite3'}",
                               master_keys=[SecretStr(Fernet.generate_key().decode())], run_worker=False,
                               runs_dir=tmp_path / "runs", trusted_origins=("https://proxy.example.org/",))
    with TestClient(create_app(settings)) as client:
        r = client.post("/evaluate/forget", headers=headers, follow_redirects=False)
        assert r.status_code == status, r.text
        if status == 403:
            assert "cross-origin request refused" in r.json()["detail"]["reason"]
        assert client.get("/evaluate", headers=headers).status_code == 200  # reads are never refused
