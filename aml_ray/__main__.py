"""The ``aml-ray`` command's entry (pyproject's script) and ``python -m aml_ray``.

Before anything else is imported, ``aml-ray run`` pauses Python's cyclic garbage collector
(:func:`aml_ray.run.collector.pause`): the start's imports and the dataset's objects are no garbage, and
its collections cost about 40 ms before the pre-flight's first request (issue 29, the fixed cost). The run
resumes it before its pipeline starts. Then :func:`aml_ray.cli.main`.
"""

from __future__ import annotations

import sys


def main() -> None:
    """``aml-ray ARGS``: :func:`aml_ray.cli.main`, with the collector paused for ``run``."""
    from aml_ray.command_clock import mark_start

    mark_start()  # wall_s counts from here (aml_ray.command_clock)
    if sys.argv[1:2] == ["run"]:
        from aml_ray.run.collector import pause

        pause()
    from aml_ray.cli import main as command

    command()


if __name__ == "__main__":
    main()
