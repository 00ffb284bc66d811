"""Acceptance (issue 28): the service restarts while a full job runs; the job resumes from its evidence
and ends with the result of an uninterrupted run.

Service 1 (an app on a SQLite file, its dispatcher and a detached job actor on the session's Ray) runs a
full job against the reference system behind a proxy that holds every Add after the 10th. The test then
stops service 1, kills the job's actor (its runner dies: nothing renews the lease) and starts service 2 on
the same database. Service 2's dispatcher claims the job once the lease expires, a new actor resumes the
run from its evidence, and the job completes; its score table equals that of an uninterrupted evaluation
of the same sample against a fresh reference system.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from aml_ray.config import model_endpoint_from_env
from aml_ray.reference.server import ReferenceServer
from aml_ray.store.jobs import create_job, get_job, mark_completed
from aml_ray.store.keys import find_key
from aml_ray.store.models import Result, Version
from tests.servers import ThreadServer
from tests.test_service_api import ADMIN, MSK, bearer, make_client, onboard

pytestmark = pytest.mark.usefixtures("ray_session")
CHECKLIST = {"smoke_passed": True, "contract_followed": True, "run_instructions_complete": True,
             "original_work_disclosed": True, "no_integrity_violation": True}


class HoldingProxy:
    """Forwards to the reference system; once ``hold_after`` Adds of the run passed, holds the rest until
    ``release`` is set (the run is then mid-ingest, with evidence of the first Adds)."""

    def __init__(self, upstream: str, hold_after: int):
        self.passed, self.hold_after = 0, hold_after
        self.held = threading.Event()
        self.release = threading.Event()
        self.app = FastAPI()

        @self.app.get("/health")
        async def health():
            return JSONResponse({"status": "ok"})

        @self.app.post("/add")
        async def add(request: Request):
            body = await request.json()
            if not body["user_id"].endswith(":preflight"):
                if self.passed >= self.hold_after and not self.release.is_set():
                    self.held.set()
                    while not self.release.is_set():
                        await _sleep(0.05)
                    # its sender died meanwhile: never stored (as a request lost with a killed process)
                    return JSONResponse({"detail": "held"}, status_code=503)
                else:
                    self.passed += 1
            return await self._forward(request, "/add", body)

        @self.app.post("/search")
        async def search(request: Request):
            return await self._forward(request, "/search", await request.json())

        self.upstream = upstream

    async def _forward(self, request: Request, path: str, body):
        async with httpx.AsyncClient() as c:
            r = await c.post(f"{self.upstream}{path}", json=body,
                             headers={"Authorization": request.headers.get("Authorization", "")})
        return JSONResponse(r.json(), status_code=r.status_code)


async def _sleep(s: float) -> None:
    import asyncio

    await asyncio.sleep(s)


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached in {timeout} s")


def test_a_restarted_service_resumes_the_full_job_and_ends_as_an_uninterrupted_run(tmp_path, locomo_file):
    import ray

    from aml_ray.actors.participant import ParticipantSpec
    from aml_ray.run.evaluation import EvaluationConfig, evaluate
    from aml_ray.serve_app.job_actor import NAMESPACE

    from cryptography.fernet import Fernet
    from pydantic import SecretStr

    fast = {"full_limit_samples": 1, "run_worker": True, "lease_s": 6.0, "poll_interval_s": 0.2,
            "master_keys": [SecretStr(Fernet.generate_key().decode())]}  # both services decrypt the same key
    with ReferenceServer(tmp_path / "ref", auth="Bearer", secret=MSK) as ref:
        proxy = HoldingProxy(ref.base_url, hold_after=10)
        with ThreadServer(proxy.app) as server:
            with make_client(tmp_path, **fast) as client:  # service 1
                key, version_id = onboard(client, server.base_url)
                service = client.app.state.service
                with service.sessions.begin() as s:  # a passed smoke, written as completed at once
                    smoke = create_job(s, key_id=find_key(s, key).id, version=s.get(Version, version_id),
                                       mode="smoke", run_label="s1", edition=service.settings.edition)
                    mark_completed(s, smoke)
                full = client.post("/api/jobs", json={"version_id": version_id, "mode": "full", "run_label": "f1",
                                                      "track": "textual", "checklist": CHECKLIST}, headers=bearer(key))
                assert full.status_code == 202, full.text
                job_id = full.json()["id"]
                assert proxy.held.wait(60), str(client.get(f"/api/jobs/{job_id}", headers=bearer(key)).json())[:1500]
                first = client.get(f"/api/jobs/{job_id}", headers=bearer(key)).json()
                runner = client.app.state.service.worker.actor_names[job_id]  # the standby it took, or its own
            # service 1 is stopped; its job actor still runs (detached) until its runner dies with it
            assert first["status"] == "running"
            ray.kill(ray.get_actor(runner, namespace=NAMESPACE))
            proxy.release.set()
            with make_client(tmp_path, **fast) as client:  # service 2, same database and runs directory
                done = _wait(lambda: (lambda j: j if j["status"] not in ("queued", "running") else None)(
                    client.get(f"/api/jobs/{job_id}", headers=bearer(key)).json()), 180, "the resumed job's end")
                with client.app.state.service.sessions() as s:
                    job = get_job(s, job_id)
                    attempts, result = job.attempts, s.query(Result).filter_by(job_id=job_id).one()
                    table = result.table
                reviews = client.get("/api/admin/reviews", headers=bearer(ADMIN)).json()
    assert [r["job_id"] for r in reviews] == [job_id]
    assert done["status"] == "completed", done
    assert attempts == 2 and done["progress"] == 1.0
    run_info = (tmp_path / "runs" / job_id / "locomo" / "run.json").read_text()
    assert '"resumed_at"' in run_info

    # the uninterrupted run of the same sample against a fresh reference system
    offline = {"answer": model_endpoint_from_env("answer", {}), "judge": model_endpoint_from_env("judge", {})}
    with ReferenceServer(tmp_path / "ref-clean", auth="Bearer", secret=MSK) as clean_ref:
        clean = evaluate(EvaluationConfig(
            dataset="locomo", participant=ParticipantSpec(add_url=clean_ref.add_url, search_url=clean_ref.search_url,
                                                          auth="Bearer", secret=MSK),
            out_dir=tmp_path / "clean", data_path=locomo_file, limit_samples=1, participant_label="clean", **offline))
    assert table == clean.table.to_dicts()
