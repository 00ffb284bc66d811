"""``GET /api/health``: the database, the job dispatcher and the Ray cluster of a replica, 503 when failing."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi.testclient import TestClient

from aml_ray.serve_app.app import create_app
from tests.service_db import settings_on
from tests.test_service_api import ADMIN


def test_health_reports_each_part_and_503_when_one_fails(tmp_path):
    with settings_on("sqlite", tmp_path, ADMIN, run_worker=True, standby_job_actor=False,
                     poll_interval_s=60.0) as settings:
        app = create_app(settings)
        service = app.state.service
        with TestClient(app) as client:
            ok = client.get("/api/health")
            assert ok.status_code == 200, ok.text
            body = ok.json()
            assert body["status"] == "ok"
            assert body["database"] == {"state": "ok", "detail": "sqlite answers"}
            assert body["dispatcher"] == {"state": "ok", "detail": "running, 0 job(s) in progress here"}
            assert body["cluster"]["state"] in ("off", "ok")

            service.worker.stop()
            stopped = client.get("/api/health")
            assert stopped.status_code == 503
            assert stopped.json()["dispatcher"] == {"state": "failing", "detail": "the job dispatcher is not running"}

            engine, service.engine = service.engine, sa.create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
            try:
                down = client.get("/api/health")
            finally:
                service.engine.dispose()
                service.engine = engine
            assert down.status_code == 503 and down.json()["status"] == "failing"
            assert down.json()["database"] == {"state": "failing",
                                               "detail": "the database did not answer (OperationalError)"}
            assert "nobody" not in down.text


def test_health_without_a_dispatcher_is_ok(tmp_path):
    with settings_on("postgresql", tmp_path, ADMIN) as settings:
        app = create_app(settings)
        with TestClient(app) as client:
            r = client.get("/api/health")
        app.state.service.engine.dispose()
    assert r.status_code == 200
    assert r.json()["database"] == {"state": "ok", "detail": "postgresql answers"}
    assert r.json()["dispatcher"] == {"state": "off", "detail": "this replica runs no jobs (run_worker off)"}
