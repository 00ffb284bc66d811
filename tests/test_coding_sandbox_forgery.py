"""Forged verdicts: a diff that leaves the bug in place and tries to make the sandbox report it resolved.

Each forge adds code the tests load (a module at the repository root, or library code run at import)
and tries to make the FAIL_TO_PASS tests count as passed without fixing the bug. Every one must be
scored unresolved; where the forgery reached the verdict, a flag names what disagreed. The runs are
in-process (``Sandbox.run``; no Ray needed).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from aml_ray.coding.fixtures import generate_bench
from aml_ray.coding.sandbox import SandboxConfig, SandboxJob, SubprocessSandbox
from aml_ray.coding.scoring import report_resolved
from tests.test_coding_sandbox_probes import _new_file


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    return generate_bench(tmp_path_factory.mktemp("forgery-bench"), n_repos=1, seed=4)


def _append(repo: Path, rel: str, source: str) -> str:
    old = (repo / rel).read_text().splitlines()
    new = textwrap.dedent(source).strip("\n").splitlines()
    return (f"--- a/{rel}\n+++ b/{rel}\n@@ -{len(old)},1 +{len(old)},{1 + len(new)} @@\n {old[-1]}\n"
            + "".join(f"+{line}\n" for line in new))


# What every forge writes: "passed" records in the format of the sandbox before the launcher (one JSON
# line per event, with the token and path from the process's initial environment, /proc/self/environ)
# and in the launcher's format, to every channel it can reach: that results file, /sandbox/out, and every
# descriptor from 3 up.
FORGE = '''
def _aml_forge(nodes):
    import glob, json, os
    try:
        env = dict(kv.split(b"=", 1) for kv in open("/proc/self/environ", "rb").read().split(b"\\0") if b"=" in kv)
    except OSError:
        env = {{}}
    token = env.get(b"AML_SANDBOX_TOKEN", b"").decode()
    old = [json.dumps({{"event": e, "nodeid": n, "when": "call", "outcome": "passed", "wasxfail": False,
                        "token": token}}) for n in nodes for e in ("start", "report")]
    new = [json.dumps(r) for n in nodes for r in ({{"e": "start", "n": n}}, {{"e": "call", "n": n, "raised": None}},
           {{"e": "report", "n": n, "when": "call", "outcome": "passed", "wasxfail": False}})]
    paths = [env.get(b"AML_SANDBOX_RESULTS", b"").decode()] + glob.glob("/sandbox/out/*.jsonl")
    for path in filter(None, paths):
        try:
            with open(path, "a") as fh:
                fh.write("\\n".join(old) + "\\n")
        except OSError:
            pass
    for fd in range(3, 64):
        try:
            os.write(fd, ("\\n".join(new) + "\\n").encode())
        except OSError:
            pass
'''


def _run(task, diff: str):
    job = SandboxJob(instance_id=task.instance_id, snapshot=task.snapshot, diff=diff, test_patch=task.test_patch,
                     fail_to_pass=task.fail_to_pass, pass_to_pass=task.pass_to_pass)
    report = SubprocessSandbox(SandboxConfig(wall_clock_s=60)).run(job)
    assert report.status == "ok", (report.detail, report.output_tail)
    return report


def _forge_at_exit(task) -> str:
    """Forge once the real results are written (the last record of a test won)."""
    return FORGE.format() + f"\nimport atexit\natexit.register(_aml_forge, {list(task.fail_to_pass)!r})\n"


def test_a_pytest_module_at_the_repository_root_does_not_replace_pytest(bench):
    bench, keys = bench
    task = bench.tasks[0]
    fake = FORGE.format() + textwrap.dedent(f'''
        import sys
        _aml_forge([a for a in sys.argv if "::" in a])
        print("{len(task.fail_to_pass)} passed in 0.01s")
        sys.exit(0)
        ''')
    report = _run(task, _new_file("pytest.py", fake))
    assert not report_resolved(report, task.fail_to_pass, task.pass_to_pass)
    assert all(report.tests[t] == "failed" for t in task.fail_to_pass), report.tests  # the real pytest ran
    assert "the diff writes pytest.py, named like the module pytest loaded before the repository" in report.flags


def test_a_json_module_at_the_repository_root_loads_after_the_reporter(bench):
    bench, keys = bench
    task = bench.tasks[0]
    real = textwrap.dedent('''
        import sys as _s
        del _s.modules["json"]
        _here = _s.path.pop(0)
        import json as _real
        _s.path.insert(0, _here)
        _s.modules["json"] = _real
        ''')
    report = _run(task, _new_file("json.py", _forge_at_exit(task) + real))
    assert not report_resolved(report, task.fail_to_pass, task.pass_to_pass)
    assert "the diff writes json.py, named like the module json loaded before the repository" in report.flags
    assert report.cross_check == "disagree"


def test_library_code_cannot_borrow_the_reporters_writer(bench):
    """The writer was a module global of the plugin; now it is nowhere to import, and a record written to the
    channel's descriptor by library code arrives out of order and is flagged."""
    bench, keys = bench
    task, key = bench.tasks[0], keys[0]
    repo = Path(task.snapshot)
    forge = FORGE.format() + textwrap.dedent(f'''
        import atexit as _atexit, sys as _sys
        try:
            _w = _sys.modules["aml_sandbox_plugin"]._write
            _atexit.register(lambda: [_w({{"event": "report", "nodeid": n, "when": "call", "outcome": "passed",
                                          "wasxfail": False}}) for n in {list(task.fail_to_pass)!r}])
        except (KeyError, AttributeError):
            _atexit.register(_aml_forge, {list(task.fail_to_pass)!r})
        ''')
    report = _run(task, _append(repo, key.module, forge))
    assert not report_resolved(report, task.fail_to_pass, task.pass_to_pass)
    assert any("comes after the session finished" in f for f in report.flags), report.flags


def test_the_token_is_not_in_the_process_environment(bench):
    """/proc/self/environ kept the token that os.environ.pop removed; now there is none (and the process is not
    dumpable, so /proc/self/environ is closed to it), and records written to every descriptor at exit come
    after the session's end."""
    bench, keys = bench
    task, key = bench.tasks[0], keys[0]
    repo = Path(task.snapshot)
    report = _run(task, _append(repo, key.module, _forge_at_exit(task)))
    assert not report_resolved(report, task.fail_to_pass, task.pass_to_pass)
    assert any("comes after the session finished" in f for f in report.flags), report.flags
    assert all(report.tests[t] == "failed" for t in task.fail_to_pass)


def test_patching_pytests_report_path_is_flagged(bench):
    bench, keys = bench
    task, key = bench.tasks[0], keys[0]
    repo = Path(task.snapshot)
    forge = '''
        import _pytest.runner as _r


        def _forged(item, when, log=True, **kw):
            hook = getattr(item.ihook, "pytest_runtest_" + when)
            call = _r.CallInfo.from_call(lambda: hook(item=item, **kw), when=when)
            report = item.ihook.pytest_runtest_makereport(item=item, call=call)
            report.outcome, report.longrepr = "passed", None
            if log:
                item.ihook.pytest_runtest_logreport(report=report)
            return report


        _r.call_and_report = _forged
        '''
    report = _run(task, _append(repo, key.module, forge))
    assert not report_resolved(report, task.fail_to_pass, task.pass_to_pass)
    assert report.summary_line.startswith(f"{len(report.tests)} passed")  # pytest itself was fooled
    assert "pytest internals replaced during the run: _pytest.runner.call_and_report" in report.flags
    assert f"{task.fail_to_pass[0]} reported passed but its test function raised AssertionError" in report.flags
