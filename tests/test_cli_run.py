"""``aml-ray run`` on the platform's own errors: run.json gets a final status, the command one line
(aml_ray.cli_run.fail_internal, aml_ray.run.evaluation.mark_failed), and a live run is never resumed twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aml_ray.run.evaluation import EvaluationConfig, evaluate, process_alive, this_process

AML_RAY = str(Path(sys.executable).parent / "aml-ray")


def test_a_ray_start_that_fails_ends_the_run_failed_with_one_line_and_no_traceback(tmp_path, locomo_file):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "ANSWER_API_BASE", "JUDGE_API_BASE")}
    env["RAY_TMPDIR"] = str(blocker / "ray")  # Ray's temp dir cannot be made: its start fails
    out = tmp_path / "run"
    res = subprocess.run([AML_RAY, "run", "--data", str(locomo_file), "--limit-samples", "1", "--participant",
                          "reference:bm25", "--out", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stdout + res.stderr
    assert " ".join(res.stderr.split()).startswith("error: run failed: NotADirectoryError:")
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "failed" and run["failure"]["kind"] == "internal"
    assert run["error"].startswith("internal error: NotADirectoryError") and "\n" not in run["error"]
    assert "Traceback" in (out / "error.log").read_text()


def test_a_run_whose_process_lives_is_not_resumed_and_a_stale_one_is_told_apart():
    me = this_process()
    assert process_alive(me)
    assert not process_alive({**me, "started": me["started"] + 1})  # the pid reused by a later process
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert not process_alive({**me, "pid": int(dead.stdout)})
    assert not process_alive({**me, "host": "another-host"}) and not process_alive(None)


def test_resume_refuses_a_run_that_is_still_running(tmp_path, locomo_file):
    from aml_ray.config import model_endpoint_from_env

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # the run's live process
    running = {**this_process(), "pid": other.pid}
    running["started"] = int(Path(f"/proc/{other.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r1", "status": "running", "process": running}))
    cfg = EvaluationConfig(dataset="locomo", participant=None, out_dir=tmp_path, data_path=locomo_file, resume=True,
                           run_id="r1", answer=model_endpoint_from_env("answer", {}), judge=model_endpoint_from_env("judge", {}))
    try:
        with pytest.raises(ValueError, match=f"is still running \\(process {other.pid} on "):
            evaluate(cfg)
    finally:
        other.kill()
        other.wait()
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "running"  # never marked by the refusal


def test_an_internal_error_never_writes_the_memory_system_key(tmp_path, monkeypatch):
    import typer

    from aml_ray.cli_run import fail_internal

    monkeypatch.setenv("MEMORY_KEY", "msk-very-secret-1234")
    with pytest.raises(typer.Exit) as info:
        fail_internal(RuntimeError("connect failed with key msk-very-secret-1234"), tmp_path, "MEMORY_KEY")
    assert info.value.exit_code == 1
    log = (tmp_path / "error.log").read_text()
    assert "msk-very-secret-1234" not in log and "connect failed with key ***" in log
