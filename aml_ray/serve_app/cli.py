"""``aml-ray serve``: the service on Ray Serve (registered in :mod:`aml_ray.cli`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer


def serve_command(
    host: Annotated[str, typer.Option(help="Bind address of the HTTP proxy.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port of the HTTP proxy.")] = 8000,
    num_cpus: Annotated[Optional[int], typer.Option(help="CPUs for a local Ray cluster started here.")] = None,
    datasets_dir: Annotated[Optional[Path], typer.Option(
        help="Folder with the suites' dataset files (layout of shared/datasets; default AML_DATASETS_DIR, "
             "else ~/.aml-ray/datasets). Files found there are never downloaded.")] = None,
    coding_bench: Annotated[Optional[Path], typer.Option(
        help="The Coding track's CAMBench file (cambench.jsonl) or a folder holding it or bench.json (default "
             "AML_CODING_BENCH, else <datasets dir>/cambench/cambench.jsonl).")] = None,
    smoke_samples: Annotated[Optional[int], typer.Option(
        min=1, help="Samples (Coding: tasks) per bundle in a smoke job (default AML_SMOKE_SAMPLES, else 1).")] = None,
    full_samples: Annotated[Optional[int], typer.Option(
        min=1, help="Samples per bundle in a full job (default AML_FULL_SAMPLES, else all: the formal suite).")] = None,
) -> None:
    """Serve the participant API, admin API and public leaderboard pages (Ray Serve + FastAPI).

    State lives under AML_DATA_DIR (SQLite) or AML_DATABASE_URL; see aml_ray/serve_app/settings.py.
    """
    from aml_ray.serve_app.settings import ServiceSettings

    settings = ServiceSettings.from_env()
    settings.num_cpus = num_cpus
    if datasets_dir is not None:
        settings.datasets_dir = datasets_dir.expanduser()
    if coding_bench is not None:
        settings.coding_bench = coding_bench.expanduser()
    if smoke_samples is not None:
        settings.smoke_limit_samples = smoke_samples
    if full_samples is not None:
        settings.full_limit_samples = full_samples
    _serve(settings, host=host, port=port, num_cpus=num_cpus)


def _serve(settings, *, host: str, port: int, num_cpus: int | None) -> None:
    """Start Ray (unless running), deploy the service and block until Ctrl-C."""
    import time

    from ray import serve

    from aml_ray.run.ray_runtime import init_ray
    from aml_ray.serve_app.deployment import run

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
            from aml_ray.run.ray_runtime import shutdown_ray

            shutdown_ray()
