"""The Ray Serve deployment: one replica class whose FastAPI ingress is :func:`create_app`.

The app is built on the replica (``__serve_build_asgi_app__``), so nothing unpicklable (engine, worker
thread) crosses from the driver. With no settings the replica reads them from its environment
(:meth:`ServiceSettings.from_env`); pass ``env_vars`` in the Serve config's ``runtime_env`` on a cluster.

Replicas: jobs never run in a replica (each runs in its own detached Ray actor, claimed from the database
queue by every replica's dispatcher: :mod:`aml_ray.serve_app.dispatch`), so with PostgreSQL any number of
replicas can run (``num_replicas`` in the Serve config); the SQLite default is for one machine.
"""

from __future__ import annotations

from ray import serve

from aml_ray.serve_app.settings import ServiceSettings

#: Serve application name and route prefix.
APP_NAME = "aml"
ROUTE_PREFIX = "/"


#: Requests the replica takes at once. Serve's default (5) made the router back off and retry under a
#: burst of 32 concurrent reads, and throughput collapsed (scripts/drill_load.py; docs/benchmarks.md). The FastAPI
#: app queues work on its own thread pool, so the replica accepts as many as that pool runs.
MAX_ONGOING_REQUESTS = 64


@serve.deployment(name="aml-service", num_replicas=1, ray_actor_options={"num_cpus": 0},
                  max_ongoing_requests=MAX_ONGOING_REQUESTS)
@serve.ingress()
class AMLService:
    """Serve replica of the aml-ray service.

    Args:
        settings: the service settings; None reads them from the replica's environment.
    """

    def __init__(self, settings: ServiceSettings | None = None):
        self._settings = settings

    def __serve_build_asgi_app__(self):
        """Build the FastAPI app on the replica."""
        from aml_ray.serve_app.app import create_app

        return create_app(self._settings)


def build(settings: ServiceSettings | None = None):
    """The bound Serve application.

    Args:
        settings: passed to the replica (None: from its environment).

    Returns:
        A ``serve.Application`` for ``serve.run``.
    """
    return AMLService.bind(settings)


def app_builder(args: dict[str, str] | None = None):
    """Entry for ``import_path: aml_ray.serve_app.deployment:app_builder`` in a Serve config file.

    Args:
        args: the config's ``args`` (unused; settings come from ``runtime_env.env_vars``).

    Returns:
        The bound application.
    """
    return build(None)


def run(settings: ServiceSettings | None = None, *, host: str = "127.0.0.1", port: int = 8000,
        blocking: bool = False):
    """Start Serve's HTTP proxy on ``host:port`` and deploy the service (Ray must be initialised).

    Args:
        settings: the service settings (None: from the replica environment).
        host: bind address of the proxy.
        port: port of the proxy.
        blocking: keep running until interrupted.

    Returns:
        The deployment handle.
    """
    serve.start(http_options={"host": host, "port": port})
    return serve.run(build(settings), name=APP_NAME, route_prefix=ROUTE_PREFIX, blocking=blocking)
