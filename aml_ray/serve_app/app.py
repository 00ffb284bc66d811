"""``create_app(settings)``: the FastAPI application (API, pages, OpenAPI at ``/docs`` with local assets).

The store is migrated to head at start-up; the job dispatcher starts with the app's lifespan. A track
whose suite cannot run here (bundle files missing) is logged as an operator error at start
(:func:`aml_ray.serve_app.tracks.suite_problems`). Request bodies over ``settings.max_body_bytes`` get 413;
a state-changing request from another origin gets 403 (:mod:`aml_ray.serve_app.origin_check`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

import aml_ray
from aml_ray.security import SecretBox
from aml_ray.serve_app.admission import Admission
from aml_ray.serve_app.deps import Service
from aml_ray.serve_app.errors import error_responses, install_error_handlers
from aml_ray.serve_app.routes import (access, access_pages, admin, admin_pages, docs_pages, evaluate_pages, health,
                                      jobs, keys, leaderboard, pages, question_pages, results)
from aml_ray.serve_app.templating import STATIC_DIR
from aml_ray.serve_app.settings import ServiceSettings
from aml_ray.serve_app.limits import install_body_limit
from aml_ray.serve_app.origin_check import install_same_origin_writes
from aml_ray.store import make_engine, session_factory, upgrade


log = logging.getLogger("aml_ray.serve_app")


def build_service(settings: ServiceSettings) -> Service:
    """Open (and migrate) the database and build the shared :class:`Service`.

    Args:
        settings: the service settings.

    Returns:
        The service, its worker created but not started.
    """
    engine = make_engine(settings.database_url, schema=settings.db_schema)
    upgrade(engine)
    service = Service(settings=settings, engine=engine, sessions=session_factory(engine),
                      box=SecretBox(settings.master_keys),
                      admission=Admission(settings.access_requests_per_minute, settings.max_health_checks))
    if settings.run_worker:
        from aml_ray.serve_app.dispatch import JobDispatcher
        from aml_ray.serve_app.tracks import suite_problems

        for track, problem in suite_problems(settings).items():
            log.error("track %s: %s", track, problem)
        service.worker = JobDispatcher(service)
    return service


def create_app(settings: ServiceSettings | None = None) -> FastAPI:
    """The aml-ray service application.

    Args:
        settings: the settings (default :meth:`ServiceSettings.from_env`).

    Returns:
        The FastAPI app; ``app.state.service`` holds the shared :class:`Service`.
    """
    settings = settings or ServiceSettings.from_env()
    service = build_service(settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if service.worker is not None:
            service.worker.start()
        try:
            yield
        finally:
            if service.worker is not None:
                service.worker.stop()
            service.engine.dispose()

    app = FastAPI(title="aml-ray", version=aml_ray.__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Agent Memory Leaderboard service: access requests, keys, smoke and full jobs, "
                              "private results, review and the public leaderboard.")
    app.state.service = service
    install_error_handlers(app)
    install_body_limit(app, settings.max_body_bytes)
    install_same_origin_writes(app, settings.trusted_origins)
    body = (400, 403, 413, 422)  # any route with a body: unparseable, cross-origin, too large, invalid
    documented = {access: (*body, 401, 404, 409, 429, 503), jobs: (*body, 401, 404, 409, 429, 503),
                  keys: (401, 422), results: (401, 404, 422), admin: (*body, 401, 404, 409, 503),
                  leaderboard: (404, 422)}
    for module in (access, keys, jobs, results, admin, leaderboard, pages, evaluate_pages, question_pages, admin_pages,
                   access_pages, docs_pages, health):
        app.include_router(module.router, responses=error_responses(*documented.get(module, ())))
    # /docs and /redoc assets from the fastapi-offline package (no CDN), then the pages' own assets
    app.mount(docs_pages.DOCS_STATIC, StaticFiles(packages=[("fastapi_offline", "static")]), name="docs-static")
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app
