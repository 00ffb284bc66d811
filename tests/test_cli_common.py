"""``aml-ray run --participant reference:bm25``: the reference system's start (aml_ray.cli_common.open_participant)."""

from __future__ import annotations

from typer.testing import CliRunner

from aml_ray.cli import app
from aml_ray.reference.server import STARTUP_TIMEOUT_S

OFFLINE_ENV = {"ANSWER_API_BASE": "", "JUDGE_API_BASE": "", "AML_DATASETS_DIR": ""}


def test_a_reference_system_that_cannot_start_is_one_line_naming_its_log_and_exit_1(tmp_path, locomo_file):
    out = tmp_path / "run"
    (out / "reference" / "reference.sqlite3").mkdir(parents=True)  # its database path is a directory: it exits
    res = CliRunner().invoke(app, ["run", "--dataset", "locomo", "--data", str(locomo_file), "--limit-samples", "1",
                                   "--participant", "reference:bm25", "--out", str(out)], env=OFFLINE_ENV)
    log = out / "reference" / "reference.stderr.log"
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    flat = "".join(res.output.split())  # the console wraps at its width
    assert flat.startswith("error:thereferencesystemdidnotstart:itsprocessexitedwithstatus")
    assert flat.endswith(f"(itslog:{log})")
    assert "sqlite3" in log.read_text()  # the log holds the cause
    assert not (out / "run.json").exists()


def test_the_reference_systems_start_limit_is_generous():
    """A loaded machine stretches the server's start many times over (it is about a second when idle)."""
    assert STARTUP_TIMEOUT_S >= 120
