"""The sandbox on Ray workers: resolved diffs, broken passing tests, endless loops, escaping paths."""

from __future__ import annotations

import os
import tarfile

import pytest
import ray

from aml_ray.coding.fixtures import generate_bench
from aml_ray.coding.sandbox import (
    ContainerSandbox,
    SandboxConfig,
    SandboxJob,
    SubprocessSandbox,
    TestReport,
    sandbox_remote,
)
from aml_ray.coding.scoring import report_resolved

pytestmark = pytest.mark.usefixtures("ray_session")


@pytest.fixture(scope="module")
def fixture_bench(tmp_path_factory):
    return generate_bench(tmp_path_factory.mktemp("bench"), n_repos=2, seed=3)


def _job(task, diff: str, snapshot: str | None = None) -> SandboxJob:
    return SandboxJob(instance_id=task.instance_id, snapshot=snapshot or task.snapshot, diff=diff,
                      test_patch=task.test_patch, fail_to_pass=task.fail_to_pass, pass_to_pass=task.pass_to_pass)


def _run_all(sandbox, jobs) -> list[TestReport]:
    return ray.get([sandbox_remote(sandbox, j, max_retries=1) for j in jobs])


def test_fix_resolves_and_a_broken_passing_test_does_not(fixture_bench):
    bench, keys = fixture_bench
    sandbox = SubprocessSandbox(SandboxConfig(wall_clock_s=60))
    task, key = bench.tasks[0], keys[0]
    fixed, broken, untouched, wrong = _run_all(sandbox, [_job(task, key.fix_diff), _job(task, key.breaking_diff),
                                                        _job(task, ""), _job(task, key.wrong_diff)])
    assert fixed.status == "ok" and set(fixed.tests.values()) == {"passed"}
    assert fixed.cross_check == "agree" and fixed.flags == [] and fixed.returncode == 0
    assert fixed.summary_line.startswith(f"{len(fixed.tests)} passed in ")
    assert report_resolved(fixed, task.fail_to_pass, task.pass_to_pass)
    assert fixed.files_changed == [key.module] and fixed.isolation == "namespaces;proc=fresh"
    # the breaking diff fixes the bug (FAIL_TO_PASS pass) but a PASS_TO_PASS test now fails
    assert all(broken.tests[t] == "passed" for t in task.fail_to_pass)
    assert any(broken.tests[t] == "failed" for t in task.pass_to_pass)
    assert not report_resolved(broken, task.fail_to_pass, task.pass_to_pass)
    assert broken.cross_check == "agree" and broken.returncode == 1  # an honest failure is not a forgery
    # before any change the hidden tests fail and the visible ones pass (a valid SWE-bench-style task)
    assert all(untouched.tests[t] == "failed" for t in task.fail_to_pass)
    assert all(untouched.tests[t] == "passed" for t in task.pass_to_pass)
    assert not report_resolved(wrong, task.fail_to_pass, task.pass_to_pass)


def test_an_endless_loop_is_stopped_by_the_wall_clock_limit(fixture_bench):
    bench, keys = fixture_bench
    task, key = bench.tasks[0], keys[0]
    report = ray.get(sandbox_remote(SubprocessSandbox(SandboxConfig(wall_clock_s=6)), _job(task, key.looping_diff)))
    assert report.status == "timeout" and report.timed_out and report.returncode is None
    assert "wall-clock limit of 6 s" in report.detail
    assert report.tests[task.fail_to_pass[0]] == "timeout"  # the test running when the limit struck
    assert all(report.tests[t] == "not_run" for t in task.pass_to_pass)
    assert 6 <= report.wall_s < 30
    assert not report_resolved(report, task.fail_to_pass, task.pass_to_pass)


def test_diffs_outside_the_repository_are_refused(fixture_bench, tmp_path):
    bench, _ = fixture_bench
    task = bench.tasks[1]
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.py").write_text("a\n")
    # a snapshot holding a symlink that leads out of the repository
    snap = tmp_path / "snap"
    import shutil

    shutil.copytree(task.snapshot, snap)
    os.symlink(outside, snap / "vendor")
    diffs = ["--- a/../victim.py\n+++ b/../victim.py\n@@ -1 +1 @@\n-a\n+b\n",
             f"--- {outside}/victim.py\n+++ {outside}/victim.py\n@@ -1 +1 @@\n-a\n+b\n",
             "--- a/vendor/victim.py\n+++ b/vendor/victim.py\n@@ -1 +1 @@\n-a\n+b\n"]
    reports = _run_all(SubprocessSandbox(SandboxConfig(wall_clock_s=60)), [_job(task, d, str(snap)) for d in diffs])
    assert [r.status for r in reports] == ["refused"] * 3
    assert all(set(r.tests.values()) == {"not_run"} for r in reports)
    assert "'..'" in reports[0].detail and "absolute" in reports[1].detail and "symlink" in reports[2].detail
    assert (outside / "victim.py").read_text() == "a\n"


def test_archive_snapshot_and_a_clean_environment(fixture_bench, tmp_path, monkeypatch):
    bench, keys = fixture_bench
    task, key = bench.tasks[1], keys[1]
    archive = tmp_path / f"{task.instance_id}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(task.snapshot, arcname="repo-at-base")  # one top folder, unwrapped on extraction
    # a hidden test that fails when a platform secret or proxy reaches the tests' environment
    leak = ("--- /dev/null\n+++ b/tests/test_env.py\n@@ -0,0 +1,4 @@\n+import os\n+\n+def test_no_secrets():\n"
            "+    assert not {'ANSWER_API_KEY', 'HTTPS_PROXY'} & set(os.environ)\n")
    monkeypatch.setenv("ANSWER_API_KEY", "sk-must-not-leak")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    sandbox = SubprocessSandbox(SandboxConfig(wall_clock_s=60))
    env = sandbox.test_env(tmp_path)
    assert "ANSWER_API_KEY" not in env and "HTTPS_PROXY" not in env and env["no_proxy"] == "*"
    assert env["HOME"] == "/home/sandbox" and "PYTHONPATH" not in env  # the launcher sets sys.path itself
    job = SandboxJob(instance_id=task.instance_id, snapshot=str(archive), diff=key.fix_diff,
                     test_patch=task.test_patch + leak,
                     fail_to_pass=(*task.fail_to_pass, "tests/test_env.py::test_no_secrets"),
                     pass_to_pass=task.pass_to_pass)
    report = sandbox.run(job)  # in-process too: the Sandbox interface does not need Ray
    assert report.status == "ok", report.output_tail
    assert set(report.tests.values()) == {"passed"} and report.isolation == "namespaces;proc=fresh"


def test_missing_snapshot_and_unknown_test_ids(fixture_bench):
    bench, key = fixture_bench[0].tasks[0], fixture_bench[1][0]
    sandbox = SubprocessSandbox(SandboxConfig(wall_clock_s=60))
    missing = sandbox.run(_job(bench, key.fix_diff).model_copy(update={"snapshot": None}))
    assert missing.status == "no_snapshot"
    job = _job(bench, key.fix_diff).model_copy(update={"pass_to_pass": ("tests/test_core.py::does_not_exist",)})
    report = sandbox.run(job)
    assert report.tests["tests/test_core.py::does_not_exist"] == "not_run"
    assert not report_resolved(report, job.fail_to_pass, job.pass_to_pass)


def test_memory_limit_turns_a_huge_allocation_into_a_failure(fixture_bench):
    bench, keys = fixture_bench
    task, key = bench.tasks[0], keys[0]
    hog = ("--- /dev/null\n+++ b/tests/test_hog.py\n@@ -0,0 +1,2 @@\n+def test_hog():\n"
           "+    assert len(bytearray(2 * 1024 ** 3)) > 0\n")
    job = _job(task, key.fix_diff).model_copy(  # a hidden test: a diff's own test files are put back
        update={"test_patch": task.test_patch + hog,
                "pass_to_pass": (*task.pass_to_pass, "tests/test_hog.py::test_hog")})
    report = SubprocessSandbox(SandboxConfig(wall_clock_s=60, memory_mb=512)).run(job)
    assert report.status == "ok" and report.config["memory_mb"] == 512
    assert report.tests["tests/test_hog.py::test_hog"] == "failed" and "MemoryError" in report.output_tail
    assert all(report.tests[t] == "passed" for t in task.fail_to_pass)


def test_container_sandbox_command_has_no_network_and_limits(tmp_path):
    sandbox = ContainerSandbox("swebench/sweb.eval.x86_64.{instance_id}:latest",
                               SandboxConfig(memory_mb=2048, wall_clock_s=10), runtime="podman")
    job = SandboxJob(instance_id="Django__django-11905", snapshot=None, fail_to_pass=("tests/a.py::t",))
    cmd = sandbox.command(tmp_path, job, "aml-sandbox-x")
    assert cmd[:3] == ["podman", "run", "--rm"]
    assert cmd[cmd.index("--network") + 1] == "none" and cmd[cmd.index("--memory") + 1] == "2048m"
    assert "swebench/sweb.eval.x86_64.django__django-11905:latest" in cmd
    assert f"{tmp_path / 'repo'}:/testbed" in cmd and cmd[-1] == "tests/a.py::t"
    assert sandbox.describe()["kind"] == "container"
