"""What the API accepts, on SQLite and PostgreSQL: capacity numbers within bounds, text without control
characters (422 naming the field, never a 500), and the admin lists' ``status`` filter."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from aml_ray.serve_app.app import create_app
from tests.service_db import DATABASES, settings_on
from tests.test_service_api import ADMIN, admin_headers, onboard, request_body, stub_base  # noqa: F401


@pytest.fixture(params=DATABASES)
def client(request, tmp_path) -> Iterator[TestClient]:
    with settings_on(request.param, tmp_path, ADMIN) as settings:
        app = create_app(settings)
        with TestClient(app) as c:
            yield c
        app.state.service.engine.dispose()


def _error_fields(response) -> list[tuple]:
    return [tuple(e["loc"]) for e in response.json()["detail"]["errors"]]


@pytest.mark.parametrize("field, value", [
    ("requests_per_s", 1e-300), ("requests_per_s", 5e-324), ("requests_per_s", 0.05), ("requests_per_s", 1e9),
    ("timeout_s", 1e-300), ("timeout_s", 0.5), ("timeout_s", 1801), ("max_in_flight", 0), ("max_in_flight", 4096)])
def test_capacity_numbers_outside_their_bounds_are_refused(client, stub_base, field, value):  # noqa: F811
    r = client.post("/api/access-requests", json=request_body(stub_base, **{field: value}))
    assert r.status_code == 422, r.text
    assert _error_fields(r) == [("body", field)]
    assert any(word in r.json()["detail"]["errors"][0]["msg"] for word in ("greater than", "less than"))


def test_capacity_numbers_at_their_bounds_are_accepted(client, stub_base):  # noqa: F811
    r = client.post("/api/access-requests", json=request_body(stub_base, requests_per_s=0.1, timeout_s=1,
                                                              max_in_flight=1024))
    assert r.status_code == 201, r.text


def test_control_characters_in_text_fields_are_refused(client, stub_base):  # noqa: F811
    for field in ("system_name", "contact_name", "organization", "contact_email", "description", "public_info"):
        for char in ("\x00", "\x1b", "\x7f"):
            value = "ada" + char + "@example.org" if field == "contact_email" else f"Zed{char}Mem"
            r = client.post("/api/access-requests", json=request_body(stub_base, **{field: value}))
            assert r.status_code == 422, (field, char, r.text)
            assert _error_fields(r) == [("body", field)]
            assert f"U+{ord(char):04X}" in r.json()["detail"]["errors"][0]["msg"]
    assert client.get("/api/admin/access-requests?status=all", headers=admin_headers()).json() == []
    assert client.get("/api/admin/access-requests?status=pending", headers=admin_headers()).json() == []


def test_line_breaks_stay_allowed_in_free_text(client, stub_base):  # noqa: F811
    r = client.post("/api/access-requests", json=request_body(stub_base, description="line 1\nline 2\tend"))
    assert r.status_code == 201, r.text


def test_a_rejection_reason_with_a_nul_is_refused(client, stub_base):  # noqa: F811
    r = client.post("/api/access-requests", json=request_body(stub_base))
    reject = client.post(f"/api/admin/access-requests/{r.json()['id']}/reject", headers=admin_headers(),
                         json={"reason": "no\x00"})
    assert reject.status_code == 422 and _error_fields(reject) == [("body", "reason")]


def test_admin_lists_filter_by_status_and_all_returns_every_row(client, stub_base):  # noqa: F811
    onboard(client, stub_base, system_name="Approved one")
    client.post("/api/access-requests", json=request_body(stub_base, system_name="Pending one"))

    def names(status: str) -> list[str]:
        r = client.get(f"/api/admin/access-requests?status={status}", headers=admin_headers())
        assert r.status_code == 200, r.text
        return [row["system_name"] for row in r.json()]

    assert names("all") == ["Approved one", "Pending one"]
    assert names("pending") == ["Pending one"] and names("approved") == ["Approved one"]
    assert names("rejected") == []
    assert [row["system_name"] for row in client.get("/api/admin/access-requests", headers=admin_headers()).json()] \
        == ["Pending one"]
    bad = client.get("/api/admin/access-requests?status=everything", headers=admin_headers())
    assert bad.status_code == 422 and _error_fields(bad) == [("query", "status")]
    assert client.get("/api/admin/reviews?status=all", headers=admin_headers()).json() == []
