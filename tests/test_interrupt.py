"""Ctrl-C during ``aml-ray run``: the run says it was interrupted, and ``--resume`` finishes it.

A terminal's Ctrl-C sends SIGINT to the command's whole process group (the command, and the Ray processes
of the cluster it started); here the command runs in a session of its own and the test sends SIGINT to
that group, as the terminal would. It used to leave run.json at ``running`` and print Ray's traceback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aml_ray.run.evidence import RunDir, read_adds
from scripts.loopback_servers import ServerProcess

AML_RAY = str(Path(sys.executable).parent / "aml-ray")
#: Only a guard against a hang.
GUARD_S = 90


def _journalled(adds: Path) -> int:
    return sum(len(p.read_text().splitlines()) for p in adds.glob("*.jsonl"))


@pytest.mark.parametrize("when", ["head start", "pipeline"])
def test_ctrl_c_marks_the_run_interrupted_and_resume_finishes_it(tmp_path, locomo_file, when):
    """``head start``: while Ray starts and the driver sends the first Adds; ``pipeline``: once the Ingest
    actor sends them (every one of the sample's 28 Adds journalled, Searches under way)."""
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # the command's own cluster
    env["PYTHONFAULTHANDLER"] = "1"  # a crash (it was SIGSEGV, -11, in 1 run of about 70) prints every thread's stack
    with ServerProcess("participant", "--latency-ms", "5", "--add-latency-ms", "150", "--capacity", "64") as server:
        base = [AML_RAY, "run", "--num-cpus", "2", "--participant", server.base_url]
        proc = subprocess.Popen([*base, "--data", str(locomo_file), "--limit-samples", "1", "--out", str(out),
                                 "--max-in-flight", "1"],
                                env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        adds = out / "evidence" / "adds"
        deadline, wanted = time.monotonic() + GUARD_S, 3 if when == "head start" else 28
        while time.monotonic() < deadline and _journalled(adds) < wanted:
            time.sleep(0.05)
        if when == "pipeline":
            time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C
        output = proc.communicate(timeout=GUARD_S)[0]
        said = " ".join(output.split())
        assert proc.returncode == 130, output
        assert "Traceback" not in output and "Error" not in output, output
        assert "interrupted" in said and f"--resume{out}" in "".join(said.split()), said
        info = json.loads((out / "run.json").read_text())
        assert info["status"] == "interrupted" and "resume" in info["error"] and info["wall_s"] > 0
        again = subprocess.run([*base, "--resume", str(out)], env=env, capture_output=True, text=True,
                               timeout=GUARD_S * 2)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "completed" and len(info["resumed_at"]) == 1
    evidence = read_adds(RunDir(out))
    assert evidence.height == info["dataset"]["chunks"] == evidence["chunk_index"].n_unique()
