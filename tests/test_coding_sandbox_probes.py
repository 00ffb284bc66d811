"""Issue 27's probes against the Coding sandbox: each escape or scoring trick is blocked or scored unresolved.

Every probe is a test that PASSES when the trick works, so a sandbox that lets it through would report it
``passed``: blocked means ``failed``. The probes run in-process (``Sandbox.run``; no Ray needed).
"""

from __future__ import annotations

import difflib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

import aml_ray
from aml_ray.coding.fixtures import generate_bench
from aml_ray.coding.runner import CodingRunConfig, run_coding
from aml_ray.coding.sandbox import SandboxConfig, SandboxJob, SubprocessSandbox
from aml_ray.coding.scoring import report_resolved
from aml_ray.config import ModelEndpoint
from aml_ray.actors.participant import ParticipantSpec

SECRET = f"sk-probe-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    return generate_bench(tmp_path_factory.mktemp("probe-bench"), n_repos=1, seed=4)


def _new_file(path: str, source: str) -> str:
    body = textwrap.dedent(source).strip("\n").splitlines()
    return f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(body)} @@\n" + "".join(f"+{line}\n" for line in body)


def _edit(repo: Path, rel: str, new_text: str) -> str:
    old = (repo / rel).read_text() if (repo / rel).exists() else None
    src = f"a/{rel}" if old is not None else "/dev/null"
    diff = "".join(difflib.unified_diff((old or "").splitlines(True), new_text.splitlines(True), src, f"b/{rel}"))
    return diff.replace("@@ -1,0 ", "@@ -0,0 ")


def test_a_diff_cannot_change_how_it_is_judged(bench):
    """A conftest hook, pytest config, a start-up hook and a forged results line: the bug stays, so unresolved."""
    bench, keys = bench
    task, key = bench.tasks[0], keys[0]
    repo = Path(task.snapshot)
    hook = textwrap.dedent('''
        import pytest


        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(item, call):
            outcome = yield
            report = outcome.get_result()
            report.outcome = "passed"
            report.longrepr = None
        ''')
    forge = textwrap.dedent(f'''

        import atexit as _atexit, glob as _glob, json as _json, os as _os


        def _forge():
            paths = [_os.environ.get("AML_SANDBOX_RESULTS")] + _glob.glob("/sandbox/out/*.jsonl")
            for path in filter(None, paths):
                with open(path, "a") as fh:
                    for node in {list(task.fail_to_pass)!r}:
                        fh.write(_json.dumps({{"event": "report", "nodeid": node, "when": "call",
                                               "outcome": "passed", "wasxfail": False}}) + "\\n")


        _atexit.register(_forge)
        ''')
    diff = (_edit(repo, "conftest.py", hook) + _edit(repo, "tests/conftest.py", hook)
            + _edit(repo, "pytest.ini", "[pytest]\naddopts = -p tests.conftest\n")
            + _edit(repo, "sitecustomize.py", hook)
            + _edit(repo, key.module, (repo / key.module).read_text() + forge))
    job = SandboxJob(instance_id=task.instance_id, snapshot=task.snapshot, diff=diff, test_patch=task.test_patch,
                     fail_to_pass=task.fail_to_pass, pass_to_pass=task.pass_to_pass)
    report = SubprocessSandbox(SandboxConfig(wall_clock_s=60)).run(job)
    assert report.status == "ok", report.output_tail
    assert report.harness_restored == ["conftest.py", "pytest.ini", "sitecustomize.py", "tests/conftest.py"]
    assert all(report.tests[t] == "failed" for t in task.fail_to_pass), report.tests
    assert not report_resolved(report, task.fail_to_pass, task.pass_to_pass)
    # the same library edit without the forging still applies: only harness files are put back
    assert report.files_changed[-1] == key.module


PROBES = '''
import glob, json, os, socket, subprocess, sys, time

HOST_FILE = {host_file!r}
HOST_DIR = {host_dir!r}
PACKAGE_DIR = {package_dir!r}
SITE_PACKAGES = {site_packages!r}
BENCH_FILE = {bench_file!r}
CLUE = {clue!r}
SECRET = {secret!r}
PORT = {port!r}
MARKER = {marker!r}


def _cmdlines():
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            yield open(path, "rb").read().split(b"\\0")
        except OSError:
            pass


def _try_write(folder):
    probe = os.path.join(folder, ".aml-probe-" + str(os.getpid()))
    with open(probe, "w") as fh:
        fh.write("x")
    os.unlink(probe)


def test_read_etc_passwd():
    assert "root:x:0:0" in open("/etc/passwd").read()


def test_read_host_file():
    assert open(HOST_FILE).read() == "host secret"


def test_write_host_dir():
    _try_write(HOST_DIR)


def test_write_editable_package():
    _try_write(PACKAGE_DIR)


def test_write_site_packages():
    _try_write(SITE_PACKAGES)


def _gold(path):
    return [row["patch"] for row in json.load(open(path))["tasks"]]


def test_gold_patch_hunt_through_proc():
    found = [a.decode() for args in _cmdlines() for a in args if a.endswith(b"bench.json")]
    assert any(CLUE in patch for p in found for patch in _gold(p))


def test_gold_patch_at_a_known_path():
    assert any(CLUE in patch for patch in _gold(BENCH_FILE))


def test_environment_secrets():
    seen = dict(os.environ)
    for path in glob.glob("/proc/[0-9]*/environ"):
        try:
            seen[path] = open(path, "rb").read().decode(errors="replace")
        except OSError:
            pass
    assert any(SECRET in v for v in seen.values())


def test_network_to_a_loopback_listener():
    socket.create_connection(("127.0.0.1", PORT), timeout=3).close()


def test_fork_bomb():
    children = []
    try:
        for _ in range(100):
            pid = os.fork()
            if pid == 0:
                time.sleep(5)
                os._exit(0)
            children.append(pid)
    finally:
        print(f"spawned={{len(children)}}")
        for pid in children:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    assert len(children) == 100


def test_detached_child():
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(20)", MARKER])
        os._exit(0)
    os.wait()
'''


def _host_pids_with(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


def test_escapes_are_blocked(bench, tmp_path):
    bench, keys = bench
    task, key = bench.tasks[0], keys[0]
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    (host_dir / "secret.txt").write_text("host secret")
    bench_file = bench.root / "bench.json"
    site_packages = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    marker = f"aml-probe-detached-{uuid.uuid4().hex[:8]}"
    # a platform process whose command line names the bench and whose environment holds keys
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(bench_file)],
                              env={**os.environ, "ANSWER_API_KEY": SECRET, "MEMORY_KEY": SECRET})
    probes = PROBES.format(host_file=str(host_dir / "secret.txt"), host_dir=str(host_dir),
                           package_dir=str(Path(aml_ray.__file__).parent), site_packages=site_packages,
                           bench_file=str(bench_file), clue=key.clue, secret=SECRET,
                           port=listener.getsockname()[1], marker=marker)
    names = [line[4:].split("(")[0] for line in probes.splitlines() if line.startswith("def test_")]
    nodes = tuple(f"tests/test_probes.py::{n}" for n in names)
    job = SandboxJob(instance_id=task.instance_id, snapshot=task.snapshot, diff=key.fix_diff,
                     test_patch=task.test_patch + _new_file("tests/test_probes.py", probes),
                     fail_to_pass=nodes, pass_to_pass=task.fail_to_pass)
    try:
        report = SubprocessSandbox(SandboxConfig(wall_clock_s=60, pids_limit=40)).run(job)
        time.sleep(0.3)
        survivors = _host_pids_with(marker)
    finally:
        helper.kill()
        listener.close()
        for pid in _host_pids_with(marker):
            os.kill(pid, signal.SIGKILL)
    assert report.status == "ok" and report.isolation == "namespaces;proc=fresh", report.output_tail
    blocked = {n.split("::")[1]: report.tests[n] for n in nodes if n != "tests/test_probes.py::test_detached_child"}
    assert blocked == {n: "failed" for n in names if n != "test_detached_child"}, report.output_tail
    assert all(report.tests[t] == "passed" for t in task.fail_to_pass)  # the fix itself still works inside
    spawned = int(report.output_tail.split("spawned=")[1].split()[0])
    assert 0 < spawned < 40  # bounded by pids_limit
    assert survivors == []  # the setsid double fork died with the run
    assert (host_dir / "secret.txt").read_text() == "host secret" and os.listdir(host_dir) == ["secret.txt"]
    assert not report_resolved(report, job.fail_to_pass, job.pass_to_pass)


def test_a_host_without_user_namespaces_is_refused(bench, tmp_path):
    """No silent fallback: where the namespaces cannot be made, the check names the step and the way out."""
    code = ("from aml_ray.coding.sandbox import SubprocessSandbox\n"
            "try:\n    SubprocessSandbox().check()\nexcept Exception as exc:\n"
            "    print(type(exc).__name__, exc)\nelse:\n    print('RAN')\n")
    # a user namespace whose own limit forbids nested user namespaces stands for such a host
    proc = subprocess.run(["unshare", "-Ur", "sh", "-c", 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"',
                           "sh", sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(aml_ray.__file__).parents[1])})
    out = proc.stdout
    assert out.startswith("SandboxUnavailable"), proc.stdout + proc.stderr
    assert "unshare(user, mount, pid, net, ipc, uts namespaces)" in out and "--unsandboxed" in out


def test_a_run_refuses_to_start_and_the_opt_out_is_labelled(bench, tmp_path):
    from aml_ray.coding.sandbox import SandboxUnavailable

    bench, keys = bench
    broken = SubprocessSandbox(SandboxConfig(python=str(tmp_path / "no-python")))
    cfg = CodingRunConfig(bench=bench, participant=ParticipantSpec(add_url="http://127.0.0.1:9/add",
                                                                   search_url="http://127.0.0.1:9/search"),
                          answer=ModelEndpoint(role="answer", base_url="http://127.0.0.1:9/v1", model="m"),
                          out_dir=tmp_path / "run", sandbox=broken)
    with pytest.raises(SandboxUnavailable, match="does not run"):
        run_coding(cfg)
    assert not (tmp_path / "run" / "run.json").exists()
    task, key = bench.tasks[0], keys[0]
    unsafe = SubprocessSandbox(SandboxConfig(wall_clock_s=60, unsandboxed=True))
    report = unsafe.run(SandboxJob(instance_id=task.instance_id, snapshot=task.snapshot, diff=key.fix_diff,
                                   test_patch=task.test_patch, fail_to_pass=task.fail_to_pass,
                                   pass_to_pass=task.pass_to_pass))
    assert report.isolation == "unsandboxed" and report.status == "ok", report.output_tail
    assert "UNSAFE" in unsafe.describe()["isolation"]
    assert json.loads(report.model_dump_json())["config"]["unsandboxed"] is True


def test_harness_rule_examples():
    import doctest

    import aml_ray.coding.harness as mod

    assert doctest.testmod(mod).failed == 0
