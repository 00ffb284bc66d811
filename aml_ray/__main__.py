"""The ``aml-ray`` command's entry (pyproject's script) and ``python -m aml_ray``: marks the command's start
(:mod:`aml_ray.command_clock`, what run.json's ``wall_s`` counts from), then :func:`aml_ray.cli.main`."""

from __future__ import annotations


def main() -> None:
    """``aml-ray ARGS``."""
    from aml_ray.command_clock import mark_start

    mark_start()
    from aml_ray.cli import main as command

    command()


if __name__ == "__main__":
    main()
