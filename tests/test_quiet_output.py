"""A default ``aml-ray run`` prints no Ray log line: neither the C++ core worker's
(``[2026-12-03 04:37:11,602 E 32049 32049] core_worker.cc:...``) nor Ray's Python loggers'
(``2026-12-03 04:38:37,886<TAB>ERROR streaming_executor_state.py:...``), also when the contract stops the
run; ``--verbose`` lets them through. Each test runs the command line in a process of its own, as a user
would, against a Ray cluster of its own."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

#: A line that starts like one of Ray's log lines: the C++ prefix, or the Python loggers' timestamp + level.
RAY_LOG_LINE = re.compile(r"^(\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [TDIWEF] \d+ \d+\]"
                          r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\s+(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b)",
                          re.MULTILINE)
AML_RAY = str(Path(sys.executable).with_name("aml-ray"))


@pytest.fixture
def ray_tmp() -> Iterator[str]:
    """A short private RAY_TMPDIR (Ray's socket paths have a length limit), removed after the test."""
    path = tempfile.mkdtemp(prefix="amlq-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def aml_ray_run(*args: str, ray_tmp: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ANSWER_API_BASE": "", "JUDGE_API_BASE": "", "AML_DATASETS_DIR": "", "RAY_TMPDIR": ray_tmp}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([AML_RAY, "run", *args], capture_output=True, text=True, env=env, timeout=600)


def ray_lines(res: subprocess.CompletedProcess) -> list[str]:
    text = res.stdout + res.stderr
    return [m.group(0) + text[m.end():].split("\n", 1)[0] for m in RAY_LOG_LINE.finditer(text)]


def test_the_pattern_knows_both_kinds_of_ray_line():
    native = "[2026-12-03 04:37:11,602 E 32049 32049] core_worker.cc:2465: Actor with class name: ..."
    python = "2026-12-03 04:10:16,903\tERROR exceptions.py:79 -- Exception occurred in user code"
    assert RAY_LOG_LINE.match(native) and RAY_LOG_LINE.match(python)
    assert not RAY_LOG_LINE.match("[bold red]error:[/] run stopped") and not RAY_LOG_LINE.match("2026 runs")


def test_default_run_prints_no_ray_log_line(tmp_path, locomo_file, ray_tmp):
    out = tmp_path / "run"
    res = aml_ray_run("--data", str(locomo_file), "--limit-samples", "1", "--retrieval-only", "--out", str(out),
                      ray_tmp=ray_tmp)
    assert res.returncode == 0, res.stdout + res.stderr
    assert ray_lines(res) == []
    assert "retrieval only" in res.stdout and json.loads((out / "run.json").read_text())["status"] == "completed"


def test_a_contract_stop_prints_our_error_and_no_ray_log_line_unless_verbose(tmp_path, locomo_file, ray_tmp):
    """The second Add of each sample answers ``success: false``: the run stops inside Ray Data."""
    from tests.bad_participants import BadParticipant

    args = ("--data", str(locomo_file), "--limit-samples", "1")
    with BadParticipant("success_false_second_add", capacity=64) as bp:
        quiet = aml_ray_run(*args, "--participant", bp.base_url, "--out", str(tmp_path / "quiet"), ray_tmp=ray_tmp)
        verbose = aml_ray_run(*args, "--participant", bp.base_url, "--out", str(tmp_path / "verbose"), "--verbose",
                              ray_tmp=ray_tmp)
    for res in (quiet, verbose):
        assert res.returncode == 1, res.stdout + res.stderr
        assert "run stopped: ContractError: field 'success'" in res.stderr
    assert ray_lines(quiet) == []
    assert "max_errored_blocks" not in quiet.stdout + quiet.stderr
    assert ray_lines(verbose), verbose.stdout + verbose.stderr  # Ray's own lines are allowed, and there are some
