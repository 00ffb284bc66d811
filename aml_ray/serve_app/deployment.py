"""The Ray Serve deployment: one replica class whose FastAPI ingress is :func:`create_app`.

The app is built on the replica by a builder function (``serve.ingress(build_asgi_app)``, Serve's documented
form), so nothing unpicklable (engine, worker thread) crosses from the driver: the replica's constructor
keeps its settings for :func:`build_asgi_app`, which Serve calls right after it in the same process. With no
settings the replica reads them from its environment
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


#: The settings of the replica in this process (a replica is an actor: one per process), set by its
#: constructor for :func:`build_asgi_app`.
_replica_settings: list[ServiceSettings | None] = []


def build_asgi_app():
    """Build the FastAPI app on the replica, with the settings its constructor received (Serve calls it after
    the constructor: ``serve.ingress`` with a builder function).

    Raises:
        RuntimeError: called outside a replica (no constructor ran in this process).
    """
    from aml_ray.serve_app.app import create_app

    if not _replica_settings:
        raise RuntimeError("build_asgi_app: no AMLService replica was constructed in this process")
    return create_app(_replica_settings[-1])


@serve.deployment(name="aml-service", num_replicas=1, ray_actor_options={"num_cpus": 0},
                  max_ongoing_requests=MAX_ONGOING_REQUESTS)
@serve.ingress(build_asgi_app)
class AMLService:
    """Serve replica of the aml-ray service.

    Args:
        settings: the service settings; None reads them from the replica's environment.
    """

    def __init__(self, settings: ServiceSettings | None = None):
        # through the imported module: Serve ships this class by value (cloudpickle), with its own copy of
        # this module's globals, while build_asgi_app is imported on the replica
        from aml_ray.serve_app import deployment

        deployment._replica_settings.append(settings)


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
