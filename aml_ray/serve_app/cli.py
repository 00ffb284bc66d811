"""``aml-ray serve``: the service on Ray Serve (registered in :mod:`aml_ray.cli`)."""

from __future__ import annotations

from typing import Annotated

import typer


def serve_command(
    host: Annotated[str, typer.Option(help="Bind address of the HTTP proxy.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port of the HTTP proxy.")] = 8000,
    num_cpus: Annotated[int | None, typer.Option(help="CPUs for a local Ray cluster started here.")] = None,
) -> None:
    """Serve the participant API, admin API and public leaderboard pages (Ray Serve + FastAPI).

    State lives under AML_DATA_DIR (SQLite) or AML_DATABASE_URL; see aml_ray/serve_app/settings.py.
    """
    import time

    from ray import serve

    from aml_ray.ray_runtime import init_ray
    from aml_ray.serve_app.deployment import run
    from aml_ray.serve_app.settings import ServiceSettings

    settings = ServiceSettings.from_env()
    settings.num_cpus = num_cpus
    started = init_ray(num_cpus=num_cpus)
    try:
        run(settings, host=host, port=port)
        shown = f"[{host}]" if ":" in host else host
        typer.echo(f"aml-ray service on http://{shown}:{port} (leaderboard /leaderboard/textual, API docs /docs); "
                   "Ctrl-C stops it")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        if started:
            import ray

            ray.shutdown()
