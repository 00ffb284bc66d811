"""``aml-ray --help`` is fast (no heavy imports before a command runs) and readable at 80 columns."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

#: Modules that cost a second or more to import together; none is needed to print help.
HEAVY = ("ray", "pyarrow", "polars", "sqlalchemy", "alembic", "bpe_openai", "openai", "aiohttp", "fastapi")

PROBE = """
import sys
from aml_ray.cli import app
try:
    app({args!r}, prog_name="aml-ray")
except SystemExit:
    pass
print("LOADED", *sorted(m for m in {heavy!r} if m in sys.modules))
"""


def help_output(*args: str) -> tuple[str, list[str]]:
    """``aml-ray ARGS`` in a fresh interpreter at 80 columns: (its output, heavy modules it loaded)."""
    code = PROBE.format(args=list(args), heavy=HEAVY)
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    text, _, loaded = res.stdout.rpartition("LOADED")
    return text, loaded.split()


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["coding", "--help"], ["check", "--help"]])
def test_help_loads_no_heavy_module(args):
    _, loaded = help_output(*args)
    assert loaded == [], f"aml-ray {' '.join(args)} imported {loaded}: import them inside the command"


def test_run_help_fits_80_columns_with_whole_option_names():
    text, _ = help_output("run", "--help")
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "…" not in text, text
    for name in ("--allow-hash-mismatch", "--answer-prompt-sha256", "--judge-prompt-sha256", "--datasets-dir",
                 "--stream-checkpoints", "--retrieval-only", "--limit-samples", "--verbose"):
        assert name in text, f"{name} missing or cut:\n{text}"
