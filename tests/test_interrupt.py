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


def _output_or_stacks(proc: subprocess.Popen) -> str:
    """The command's output once it ended; a command still running after :data:`GUARD_S` fails the test with
    every thread's stack (SIGABRT: faulthandler, which the test's ``PYTHONFAULTHANDLER`` arms, prints them), so
    that a hang says where it hangs."""
    try:
        return proc.communicate(timeout=GUARD_S)[0]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            output = proc.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output = proc.communicate()[0]
        pytest.fail(f"still running {GUARD_S} s after Ctrl-C; its output and stacks:\n{output[-20000:]}")


#: The participant's Searches: the pre-flight's probe, then the sample's 152.
SEARCHES = 1 + 152


@pytest.mark.parametrize("when", ["head start", "pipeline", "tail"])
def test_ctrl_c_marks_the_run_interrupted_and_resume_finishes_it(tmp_path, locomo_file, when):
    """``head start``: while Ray starts and the driver sends the first Adds; ``pipeline``: once the Ingest
    actor sends them (every one of the sample's 28 Adds journalled, 10 of its 152 Searches arrived at the
    participant, about 3 s of Searches left); ``tail``: once the last Search arrived, while the run ends
    (its last rows, the clean-up, the scoring, Ray's shutdown).

    The pipeline case used to wait a fixed 1 s after the Adds, when the Searches (5 ms each) were nearly
    done: the interrupt then landed in the run's tail, where in 2 of 35 local runs it was dropped (inside
    Ray's ``ActorHandle.__del__``: the run completed, exit 0; inside a polars callback: a ``TypeError``
    and a traceback, exit 1). The tail case is that moment on purpose: the run is ``interrupted`` and
    resumable, or, when the Ctrl-C came after run.json said the run had ended, says so, exit 130 either way.
    """
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # the command's own cluster
    env["PYTHONFAULTHANDLER"] = "1"  # a crash (it was SIGSEGV, -11, in 1 run of about 70) prints every thread's stack
    with ServerProcess("participant", "--latency-ms", "20", "--add-latency-ms", "150", "--capacity", "64") as server:
        base = [AML_RAY, "run", "--num-cpus", "2", "--participant", server.base_url]
        proc = subprocess.Popen([*base, "--data", str(locomo_file), "--limit-samples", "1", "--out", str(out),
                                 "--max-in-flight", "1"],
                                env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        adds = out / "evidence" / "adds"
        deadline, wanted = time.monotonic() + GUARD_S, 3 if when == "head start" else 28
        while time.monotonic() < deadline and _journalled(adds) < wanted:
            time.sleep(0.05)
        searches = {"head start": 0, "pipeline": 1 + 10, "tail": SEARCHES}[when]
        while time.monotonic() < deadline and server.stats()["n"].get("search", 0) < searches:
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C
        output = _output_or_stacks(proc)
        said = " ".join(output.split())
        assert proc.returncode == 130, output
        assert "Traceback" not in output and "Error" not in output and "Exception" not in output, output
        info = json.loads((out / "run.json").read_text())
        if when == "tail" and info["status"] == "completed":  # the Ctrl-C came after run.json was written
            assert "interrupted after the run had ended" in said and "--resume" not in said, said
            return
        assert "interrupted" in said and f"--resume{out}" in "".join(said.split()), said
        assert info["status"] == "interrupted" and "resume" in info["error"] and info["wall_s"] > 0
        again = subprocess.run([*base, "--resume", str(out)], env=env, capture_output=True, text=True,
                               timeout=GUARD_S * 2)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "completed" and len(info["resumed_at"]) == 1
    evidence = read_adds(RunDir(out))
    assert evidence.height == info["dataset"]["chunks"] == evidence["chunk_index"].n_unique()
