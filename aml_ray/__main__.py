"""The ``aml-ray`` command's entry (pyproject's script) and ``python -m aml_ray``: :func:`aml_ray.cli.main`."""

from __future__ import annotations

from aml_ray.cli import main

if __name__ == "__main__":
    main()
