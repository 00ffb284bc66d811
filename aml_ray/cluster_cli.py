"""``aml-ray cluster``: keep a local Ray cluster warm for ``aml-ray run`` (:mod:`aml_ray.run.cluster`).

- ``aml-ray cluster up [--num-cpus N]``: start it (``ray start --head --block`` with aml-ray's settings, and
  the client registry its runs share, kept while it is up) in ``$RAY_TMPDIR`` (default
  ``<system temp>/aml-ray``), unless it is up already; prints its address.
- ``aml-ray cluster status``: its address and CPUs, or that none is up (exit 1).
- ``aml-ray cluster down``: stop it (never ``ray stop``, which stops every Ray cluster on the machine).

``aml-ray run`` joins it whenever it is up and neither ``RAY_ADDRESS`` nor another address is given.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from aml_ray.cli_common import console, fail

cluster_app = typer.Typer(help="A warm local Ray cluster that aml-ray run joins instead of starting one.",
                          no_args_is_help=True, pretty_exceptions_enable=False)


@cluster_app.command()
def up(num_cpus: Annotated[Optional[int], typer.Option(min=1, help="CPUs the cluster offers (default: all of "
                                                        "the machine's).")] = None) -> None:
    """Start the warm cluster (or say where the one already up is)."""
    from aml_ray.run import cluster
    from aml_ray.run.ray_runtime import default_temp_dir

    try:
        warm, started = cluster.up(default_temp_dir(), num_cpus=num_cpus)
    except RuntimeError as exc:
        fail(str(exc), 1)
    what = "started" if started else "already up"
    console.print(f"Ray cluster {what} at {warm.address} ({warm.num_cpus} CPUs, {warm.temp_dir}); "
                  "aml-ray run joins it; stop it with: aml-ray cluster down")


@cluster_app.command()
def status() -> None:
    """Print the warm cluster's address, or exit 1 when none is up."""
    from aml_ray.run import cluster
    from aml_ray.run.ray_runtime import default_temp_dir

    warm = cluster.read_state(default_temp_dir())
    if warm is None or not cluster.is_up(warm):
        console.print(f"no warm Ray cluster in {default_temp_dir()} (start one with: aml-ray cluster up)")
        raise typer.Exit(1)
    console.print(f"Ray cluster up at {warm.address} ({warm.num_cpus} CPUs, {warm.temp_dir})")


@cluster_app.command()
def down() -> None:
    """Stop the warm cluster and remove its record."""
    from aml_ray.run import cluster
    from aml_ray.run.ray_runtime import default_temp_dir

    stopped = cluster.down(default_temp_dir())
    console.print(f"Ray cluster at {stopped.address} stopped" if stopped is not None
                  else f"no warm Ray cluster in {default_temp_dir()}")
