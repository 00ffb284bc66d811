"""run.json's ``wall_s`` counts from the command's own start (aml_ray.command_clock), not the process's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from aml_ray import command_clock

AML_RAY = str(Path(sys.executable).parent / "aml-ray")


def test_started_at_is_the_marked_start_on_the_monotonic_clock():
    command_clock.mark_start()
    time.sleep(0.05)
    elapsed = time.time() - command_clock.started_at()
    assert 0.05 <= elapsed < 600  # the clock is the marked start, not an earlier one


def test_a_command_execd_into_a_shell_that_slept_counts_from_its_own_start(tmp_path, locomo_file):
    """``bash -c 'sleep 3 && aml-ray run ...'`` runs the command in the shell's process, which began 3 s
    earlier: a start read from /proc put those 3 s into wall_s."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "ANSWER_API_BASE", "JUDGE_API_BASE")}
    out = tmp_path / "run"
    t0 = time.monotonic()
    subprocess.run(["bash", "-c", f"sleep 3 && exec {AML_RAY} run --data {locomo_file} --limit-samples 1 "
                    f"--retrieval-only --participant reference:bm25 --out {out}"],
                   env=env, check=True, capture_output=True, timeout=300)
    total = time.monotonic() - t0
    wall_s = json.loads((out / "run.json").read_text())["wall_s"]
    assert 0 < wall_s <= total - 3
