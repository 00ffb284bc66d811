"""Ctrl-C during ``aml-ray run --participant reference:bm25``: the reference system keeps answering, so the
run is interrupted with no Add recorded as failed, and ``--resume`` ends it equal to an uninterrupted run,
question by question (aml_ray.reference.server runs the server in a session of its own)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl

from aml_ray.run.evidence import RunDir, read_questions

AML_RAY = str(Path(sys.executable).parent / "aml-ray")
#: Only a guard against a hang.
GUARD_S = 180
SAMPLES = "2"


def _journalled(adds: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in adds.glob("*.jsonl")) if adds.exists() else 0


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([AML_RAY, "run", *args], env=env, capture_output=True, text=True, timeout=GUARD_S)


def _answers(out: Path) -> pl.DataFrame:
    return read_questions(RunDir(out), columns=("question_id", "status", "answer", "score")).sort("question_id")


def test_ctrl_c_during_the_adds_leaves_the_reference_system_up_and_resume_equals_a_whole_run(tmp_path, locomo_file):
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "ANSWER_API_BASE", "JUDGE_API_BASE")}
    common = ["--num-cpus", "2", "--participant", "reference:bm25", "--data", str(locomo_file),
              "--limit-samples", SAMPLES, "--max-in-flight", "2"]
    whole = _run(*common, "--out", str(tmp_path / "whole"), env=env)
    assert whole.returncode == 0, whole.stdout + whole.stderr

    out = tmp_path / "cut"
    proc = subprocess.Popen([AML_RAY, "run", *common, "--out", str(out)], env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + GUARD_S
    while time.monotonic() < deadline and _journalled(out / "evidence" / "adds") < 10 and proc.poll() is None:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the command's whole process group
    output = proc.communicate(timeout=GUARD_S)[0]
    assert proc.returncode == 130, output
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "interrupted"
    journalled = [json.loads(line) for p in (out / "evidence" / "adds").glob("*.jsonl") for line in p.read_text().splitlines()]
    assert journalled and [r for r in journalled if r["status"] != "ok"] == []  # the server was still there

    resumed = _run("--resume", str(out), env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "completed"
    whole_run = json.loads((tmp_path / "whole" / "run.json").read_text())
    assert run["outcome"]["counts"] == whole_run["outcome"]["counts"]
    mine, theirs = _answers(out), _answers(tmp_path / "whole")
    assert mine.height == theirs.height > 0
    assert mine.to_dicts() == theirs.to_dicts()
