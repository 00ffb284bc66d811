"""Concurrent requests against the service over real HTTP (uvicorn on loopback), on SQLite and PostgreSQL:
a burst of job submissions for one key is accepted at most as often as the quota allows."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi.testclient import TestClient

from aml_ray.serve_app.app import create_app
from aml_ray.serve_app.settings import ServiceSettings
from tests.servers import ThreadServer
from tests.service_db import DATABASES, settings_on
from tests.test_service_api import ADMIN, onboard, stub_base  # noqa: F401  (stub_base is a fixture)

BURST = 16


@pytest.fixture(params=DATABASES)
def service_settings(request, tmp_path) -> Iterator[ServiceSettings]:
    with settings_on(request.param, tmp_path, ADMIN) as settings:
        yield settings


def test_a_burst_of_smoke_submissions_for_one_key_is_accepted_once(service_settings, stub_base):  # noqa: F811
    app = create_app(service_settings)
    with TestClient(app) as client:
        key, version_id = onboard(client, stub_base)
    barrier = threading.Barrier(BURST)

    def submit(i: int) -> int:
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            barrier.wait()
            r = http.post("/api/jobs", headers={"Authorization": f"Bearer {key}"},
                          json={"version_id": version_id, "mode": "smoke", "run_label": f"burst-{i}",
                                "track": "textual"})
            return r.status_code

    with ThreadServer(app) as server, ThreadPoolExecutor(BURST) as pool:
        codes = sorted(pool.map(submit, range(BURST)))
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            jobs = http.get("/api/jobs", headers={"Authorization": f"Bearer {key}"}).json()
    app.state.service.engine.dispose()
    # one accepted; the others meet either the active job of the version (409) or the hourly quota (429)
    assert codes.count(202) == 1, codes
    assert set(codes) <= {202, 409, 429}, codes
    assert len(jobs) == 1
