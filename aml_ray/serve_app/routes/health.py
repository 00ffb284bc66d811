"""``GET /api/health``: is this replica able to serve? For load balancers, probes and the load drill.

Three parts, each a short word and a detail: the database (a ``SELECT 1`` on the service's engine), the
job dispatcher (running, off by configuration, or stopped) and the Ray cluster this process is attached
to (nodes and CPUs; "not started" until the first job starts it). 200 while the database answers and the
dispatcher (when configured) runs; 503 otherwise. No secret, path or URL appears in the answer.
"""

from __future__ import annotations

import sys
from typing import Literal

from fastapi import APIRouter, Response
from pydantic import BaseModel
from sqlalchemy import text

from aml_ray.serve_app.deps import Service, ServiceDep

router = APIRouter(tags=["health"])


class Part(BaseModel):
    """One part's state: ``ok`` | ``off`` | ``failing``, and what was seen."""

    state: Literal["ok", "off", "failing"]
    detail: str


class HealthOut(BaseModel):
    """``GET /api/health``: ``status`` is ``ok`` when no part is ``failing``."""

    status: Literal["ok", "failing"]
    database: Part
    dispatcher: Part
    cluster: Part


def database_part(service: Service) -> Part:
    """A ``SELECT 1`` on the service's database (the error's class name on failure, never its text)."""
    try:
        with service.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # noqa: BLE001 - any failure is the answer
        return Part(state="failing", detail=f"the database did not answer ({type(exc).__name__})")
    return Part(state="ok", detail=f"{service.engine.dialect.name} answers")


def dispatcher_part(service: Service) -> Part:
    """The job dispatcher of this replica."""
    worker = service.worker
    if worker is None:
        return Part(state="off", detail="this replica runs no jobs (run_worker off)")
    if not worker.alive:
        return Part(state="failing", detail="the job dispatcher is not running")
    return Part(state="ok", detail=f"running, {len(worker.running_jobs())} job(s) in progress here")


def cluster_part() -> Part:
    """The Ray cluster this process is attached to (Ray is not imported here when no job started it)."""
    ray = sys.modules.get("ray")
    is_initialized = getattr(ray, "is_initialized", None)  # None also while another thread imports Ray
    if is_initialized is None or not is_initialized():
        return Part(state="off", detail="not started: the first job starts or joins it")
    try:
        nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        cpus = ray.cluster_resources().get("CPU", 0)
    except Exception as exc:  # noqa: BLE001 - a cluster that does not answer is the answer
        return Part(state="failing", detail=f"the Ray cluster did not answer ({type(exc).__name__})")
    return Part(state="ok", detail=f"{nodes} node(s), {cpus:g} CPU(s)")


@router.get("/api/health", response_model=HealthOut, responses={503: {"model": HealthOut,
                                                                      "description": "a part is failing"}})
def health(service: ServiceDep, response: Response) -> HealthOut:
    """The replica's database, job dispatcher and Ray cluster; 503 when one of them is failing."""
    parts = {"database": database_part(service), "dispatcher": dispatcher_part(service), "cluster": cluster_part()}
    failing = any(p.state == "failing" for p in parts.values())
    response.status_code = 503 if failing else 200
    return HealthOut(status="failing" if failing else "ok", **parts)
