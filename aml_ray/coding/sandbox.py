"""Sandboxed test execution: copy the snapshot, apply the diff, run the named tests under limits.

One :class:`Sandbox` interface, two ways to run the tests:

- :class:`SubprocessSandbox` (this machine): ``python -m pytest`` through :mod:`aml_ray.coding.jail`,
  in fresh user, mount, pid, network, IPC and UTS namespaces: a read-only root holding only the
  system's and the interpreter's files, the task's copy writable at ``/testbed``, a fresh ``/proc``
  of the sandbox's own processes, no network but loopback, a process-count limit (``RLIMIT_NPROC`` in
  the new user namespace), an address-space limit, a file-size limit, no core files, an environment
  built from scratch, and every descendant killed when the tests end or the wall-clock limit strikes
  (pid 1 of the namespace exits). When the host cannot provide one of these, :meth:`Sandbox.check`
  raises :class:`SandboxUnavailable` naming what failed and the run refuses to start; there is no
  silent fallback. ``SandboxConfig(unsandboxed=True)`` (``--unsandboxed``) is the one, explicit way to
  run without it; every report then says ``isolation="unsandboxed"``.
- :class:`ContainerSandbox` (an operator's container runtime, e.g. Docker or Podman with SWE-bench
  images): the same preparation, then ``<runtime> run --network none --memory ... <image>`` with the
  patched copy mounted where the image expects the repository.

Preparation (both): the snapshot (a directory, or a ``.tar``/``.tar.gz``/``.tgz``/``.zip`` archive,
extracted with path checks) is copied to a fresh temporary folder; the candidate diff is applied
(refused when it touches paths outside the repository, see :mod:`aml_ray.coding.diffs`); every
harness file the diff touched (conftest.py, pytest configuration, start-up hooks, test files: see
:mod:`aml_ray.coding.harness`), the scored tests' files and the files the hidden ``test_patch`` touches
are restored to the snapshot's version and the test patch is applied (as SWE-bench's harness does);
then the FAIL_TO_PASS and PASS_TO_PASS node ids run in one pytest process. A pytest plugin outside the
repository copy writes one JSON line per test event, so tests finished before a timeout keep their
result; the test running at the timeout is ``timeout``, tests never started are ``not_run``. Each line
carries a per-run token the plugin takes out of the environment before any repository code loads; lines
without it are ignored.

On Ray, :func:`sandbox_remote` runs :meth:`Sandbox.run` as a task with ``max_retries`` (a worker that
dies is retried; a failing test is a result, not an exception). On a multi-node cluster the snapshot
paths must be on storage every node sees.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
import zipfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from aml_ray.coding import harness
from aml_ray.coding.diffs import DiffApplyError, DiffRefused, apply_diff, check_path, diff_paths
from aml_ray.coding.jail import host_root

#: Per-test outcomes in a report. ``xfail`` counts as a pass and ``skipped`` is left out of the
#: resolved rule, as in SWE-bench's grading; see :mod:`aml_ray.coding.scoring`.
TestOutcome = Literal["passed", "failed", "error", "skipped", "xfail", "timeout", "not_run"]
ReportStatus = Literal["ok", "timeout", "refused", "apply_failed", "no_snapshot", "error"]

PLUGIN_MODULE = "aml_sandbox_plugin"
RESULTS_ENV = "AML_SANDBOX_RESULTS"
TOKEN_ENV = "AML_SANDBOX_TOKEN"
_PLUGIN_SOURCE = '''"""Written by aml-ray's sandbox: one JSON line per pytest event (survives a kill)."""
import json, os

_PATH = os.environ.pop("AML_SANDBOX_RESULTS")
_TOKEN = os.environ.pop("AML_SANDBOX_TOKEN", "")


def _write(record):
    record["token"] = _TOKEN
    with open(_PATH, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\\n")


def pytest_runtest_logstart(nodeid, location):
    _write({"event": "start", "nodeid": nodeid})


def pytest_runtest_logreport(report):
    _write({"event": "report", "nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
            "wasxfail": hasattr(report, "wasxfail")})
'''
#: Environment variables copied into the tests' environment (everything else is dropped).
ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "TZ", "SYSTEMROOT")
#: Files of the host's /etc visible (read-only) inside the subprocess sandbox; passwd, group and hosts
#: are synthetic (only the sandbox's user, only localhost).
ETC_ALLOW = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime",
             "/etc/timezone", "/etc/nsswitch.conf", "/etc/mime.types", "/etc/fonts", "/etc/ssl")
JAIL = Path(__file__).with_name("jail.py")


class SandboxConfig(BaseModel):
    """Limits and settings of one test run.

    Attributes:
        wall_clock_s: seconds the whole test process may run (default 300); then SIGKILL to its group.
        memory_mb: address-space limit in MiB (``RLIMIT_AS``; default 4,096). Address space, not resident
            memory: thread stacks and BLAS arenas count, so leave headroom.
        file_size_mb: largest file the tests may write, in MiB (``RLIMIT_FSIZE``; default 512).
        pids_limit: most processes and threads the tests may have at once (``RLIMIT_NPROC`` counted in
            the sandbox's own user namespace; default 256).
        tmp_mb: size of each private tmpfs (``/tmp``, ``/dev/shm``, home) in MiB (default 512).
        readonly_paths: extra host paths made visible read-only at the same place (e.g. data the
            repository's tests need); the interpreter's prefixes are added automatically.
        unsandboxed: run without the namespaces (process group, rlimits and the clean environment
            only). Unsafe for untrusted diffs; every report says ``isolation="unsandboxed"``.
        python: the interpreter that runs pytest (default: this one); an operator points it at the
            repository's environment.
        output_tail_chars: characters of the test output kept in the report (default 8,000).
        plugin_autoload: load the pytest plugins installed in the environment (default False: on a busy
            2-core machine the platform's own plugins cost 4-6 s per run, and a fixture repository needs
            none); an operator whose repositories need installed plugins (pytest-django, ...) sets True.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    wall_clock_s: float = Field(default=300.0, gt=0)
    memory_mb: int = Field(default=4096, ge=64)
    file_size_mb: int = Field(default=512, ge=1)
    pids_limit: int = Field(default=256, ge=8)
    tmp_mb: int = Field(default=512, ge=16)
    readonly_paths: tuple[str, ...] = ()
    unsandboxed: bool = False
    python: str | None = None
    output_tail_chars: int = Field(default=8000, ge=0)
    plugin_autoload: bool = False


class SandboxJob(BaseModel):
    """What one sandbox run needs (no gold patch: the candidate diff is the agent's).

    Attributes:
        instance_id: the task (for the report).
        snapshot: the repository snapshot (directory or archive), or None when missing.
        diff: the candidate unified diff ("" means no change).
        test_patch: the hidden tests to add after the diff, or None.
        fail_to_pass / pass_to_pass: pytest node ids to run.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    instance_id: str
    snapshot: str | None
    diff: str = ""
    test_patch: str | None = None
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...] = ()

    @property
    def tests(self) -> tuple[str, ...]:
        """FAIL_TO_PASS then PASS_TO_PASS, without duplicates."""
        return tuple(dict.fromkeys((*self.fail_to_pass, *self.pass_to_pass)))


class TestReport(BaseModel):
    """The record of one sandbox run.

    Attributes:
        instance_id: the task.
        status: ``ok`` (tests ran to the end), ``timeout`` (killed at the wall-clock limit),
            ``refused`` (the diff touches paths outside the repository), ``apply_failed`` (the diff
            does not apply), ``no_snapshot`` (no repository to run) or ``error`` (the platform failed:
            a broken snapshot or test patch, a runtime missing).
        detail: why, for every status but ``ok``.
        tests: node id -> outcome, for every named test.
        timed_out: the wall-clock limit stopped the run.
        wall_s: seconds the test process ran.
        returncode: pytest's exit status (None when it did not run or was killed).
        files_changed: repository paths the diff wrote.
        isolation: ``namespaces`` (with ``proc=fresh`` or ``proc=empty``), ``container`` or
            ``unsandboxed``.
        harness_restored: harness files the diff touched that were put back before the tests ran.
        config: the limits and settings in force.
        output_tail: the end of the test output.
    """

    __test__ = False  # not a pytest test class

    instance_id: str
    status: ReportStatus
    detail: str | None = None
    tests: dict[str, TestOutcome] = Field(default_factory=dict)
    timed_out: bool = False
    wall_s: float | None = None
    returncode: int | None = None
    files_changed: list[str] = Field(default_factory=list)
    harness_restored: list[str] = Field(default_factory=list)
    isolation: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    output_tail: str = ""


@dataclass
class ExecResult:
    """The outcome of running the test command."""

    returncode: int | None
    timed_out: bool
    wall_s: float
    output: str
    isolation: str


class SandboxError(Exception):
    """The platform side of a sandbox run failed (not the candidate's fault)."""


class SandboxUnavailable(SandboxError):
    """This host cannot provide the isolation the sandbox promises; the message names what is missing."""


def _safe_extract(archive: Path, dest: Path) -> None:
    name = archive.name.lower()
    if name.endswith((".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")):
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter="data")  # refuses absolute paths, '..', links leading out
    elif name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                parts = Path(info.filename).parts
                if info.filename.startswith(("/", "\\")) or ".." in parts:
                    raise SandboxError(f"snapshot archive {archive} holds an unsafe path {info.filename!r}")
            zf.extractall(dest)
    else:
        raise SandboxError(f"snapshot {archive}: not a directory nor a .tar/.tar.gz/.tgz/.zip archive")


def materialize_snapshot(snapshot: str | Path, dest: Path) -> Path:
    """Copy a snapshot (directory or archive) to ``dest``; an archive with one top folder unwraps it.

    Args:
        snapshot: the directory or archive.
        dest: a folder that does not exist yet.

    Returns:
        ``dest``, holding the repository.

    Raises:
        SandboxError: the snapshot is missing, unreadable or an archive with unsafe paths.
    """
    src = Path(snapshot)
    if src.is_dir():
        shutil.copytree(src, dest, symlinks=True)
        return dest
    if not src.is_file():
        raise SandboxError(f"snapshot {src} does not exist")
    staging = dest.with_name(dest.name + ".extract")
    staging.mkdir(parents=True)
    try:
        _safe_extract(src, staging)
    except (tarfile.TarError, zipfile.BadZipFile, OSError) as exc:
        raise SandboxError(f"snapshot {src} cannot be extracted: {exc}") from exc
    entries = list(staging.iterdir())
    root = entries[0] if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink() else staging
    root.rename(dest)
    shutil.rmtree(staging, ignore_errors=True)
    return dest


def _outcomes(results_file: Path, tests: tuple[str, ...], timed_out: bool, token: str) -> dict[str, TestOutcome]:
    """Per-test outcomes from the plugin's JSON lines carrying ``token`` (rules in the module docstring)."""
    started: set[str] = set()
    final: dict[str, TestOutcome] = {}
    if results_file.is_file():
        for line in results_file.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut by the kill
            if not isinstance(rec, dict) or rec.get("token") != token:
                continue  # not written by the plugin
            node = rec.get("nodeid", "")
            if rec.get("event") == "start":
                started.add(node)
                continue
            when, outcome = rec.get("when"), rec.get("outcome")
            if outcome == "skipped":
                final[node] = "xfail" if rec.get("wasxfail") else "skipped"
            elif when == "setup" and outcome == "failed":
                final[node] = "error"
            elif when == "call":
                final[node] = "passed" if outcome == "passed" else "failed"  # an xpass reports "passed"
            elif when == "teardown" and outcome == "failed" and final.get(node) in (None, "passed"):
                final[node] = "error"  # a passing test whose teardown fails is an error, as pytest reports it
    out: dict[str, TestOutcome] = {}
    for t in tests:
        if t in final:
            out[t] = final[t]
        elif t in started:
            out[t] = "timeout" if timed_out else "error"  # started, never finished: killed or crashed
        else:
            out[t] = "not_run"
    return out


def _limit_preexec(limits: SandboxConfig):
    memory = limits.memory_mb * 1024 * 1024
    fsize = limits.file_size_mb * 1024 * 1024

    def apply_limits() -> None:  # runs in the child between fork and exec: keep it to setrlimit calls
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply_limits


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str], limits: SandboxConfig, log: Path,
         preexec=None, on_timeout=None, isolation: str) -> ExecResult:
    """Run ``cmd`` in its own process group with the wall-clock limit; output goes to ``log``."""
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=preexec)
        timed_out = False
        try:
            proc.wait(timeout=limits.wall_clock_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            if on_timeout is not None:
                on_timeout()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    text = log.read_text(encoding="utf-8", errors="replace")
    tail = text[-limits.output_tail_chars:] if limits.output_tail_chars else ""
    return ExecResult(returncode=None if timed_out else proc.returncode, timed_out=timed_out,
                      wall_s=time.monotonic() - t0, output=tail, isolation=isolation)


class Sandbox(ABC):
    """Prepare a repository copy, apply a diff and run the named tests (see the module docstring).

    Args:
        config: limits and settings (default :class:`SandboxConfig`).

    Subclasses implement :meth:`execute` (how the test command runs); :meth:`run` never raises for a
    candidate's fault: refusals, apply failures and timeouts are statuses of the report.
    """

    kind = "abstract"

    def __init__(self, config: SandboxConfig | None = None):
        self.config = config or SandboxConfig()

    def describe(self) -> dict[str, Any]:
        """A description for run.json."""
        return {"kind": self.kind, "config": self.config.model_dump()}

    @abstractmethod
    def execute(self, workdir: Path, repo: Path, job: SandboxJob, token: str) -> ExecResult:
        """Run pytest on ``job.tests`` in ``repo``; the plugin is in ``workdir/plugin``, gets ``token`` in
        :data:`TOKEN_ENV` and must leave its lines in ``workdir/out/results.jsonl``.

        Raises:
            SandboxError: the test command cannot be started (reported as ``error``).
        """

    def check(self) -> None:
        """Raise :class:`SandboxUnavailable` when this host cannot run the sandbox as promised.

        The default checks nothing; :class:`SubprocessSandbox` and :class:`ContainerSandbox` override it.
        """

    def run(self, job: SandboxJob) -> TestReport:
        """Prepare, apply, restore the harness, test and report.

        Args:
            job: the snapshot, the candidate diff, the hidden test patch and the node ids.

        Returns:
            The :class:`TestReport` (never raises for the candidate's fault).
        """
        base = {"instance_id": job.instance_id, "config": self.config.model_dump()}
        if job.snapshot is None:
            return TestReport(status="no_snapshot", detail="no repository snapshot was provided for this task",
                              tests={t: "not_run" for t in job.tests}, **base)
        workdir = Path(tempfile.mkdtemp(prefix="aml-sandbox-"))
        try:
            repo = workdir / "repo"
            try:
                materialize_snapshot(job.snapshot, repo)
            except SandboxError as exc:
                return TestReport(status="error", detail=str(exc), **base)
            hidden = diff_paths(job.test_patch) if job.test_patch else []
            touched: list[str] = []
            if job.diff.strip():
                try:
                    touched = [p for p in diff_paths(job.diff) if _inside(repo, p)]
                except (DiffRefused, DiffApplyError):
                    pass  # apply_diff below reports it
            originals = harness.snapshot_bytes(repo, [p for p in harness.protected_paths(touched, job.tests, hidden)
                                                      if _inside(repo, p)])
            changed: list[str] = []
            if job.diff.strip():
                try:
                    changed = apply_diff(repo, job.diff)
                except DiffRefused as exc:
                    return TestReport(status="refused", detail=str(exc),
                                      tests={t: "not_run" for t in job.tests}, **base)
                except DiffApplyError as exc:
                    return TestReport(status="apply_failed", detail=str(exc),
                                      tests={t: "not_run" for t in job.tests}, **base)
            # the candidate's edits to the harness (conftest.py, pytest config, tests) do not count
            restored = harness.restore(repo, originals, changed)
            if job.test_patch:
                try:
                    apply_diff(repo, job.test_patch)
                except (DiffRefused, DiffApplyError) as exc:
                    return TestReport(status="error", detail=f"the task's test_patch does not apply: {exc}",
                                      files_changed=changed, harness_restored=restored, **base)
            plugin = workdir / "plugin"
            plugin.mkdir()
            (plugin / f"{PLUGIN_MODULE}.py").write_text(_PLUGIN_SOURCE, encoding="utf-8")
            token = secrets.token_hex(16)
            try:
                res = self.execute(workdir, repo, job, token)
            except SandboxError as exc:
                return TestReport(status="error", detail=str(exc), files_changed=changed,
                                  harness_restored=restored, **base)
            tests = _outcomes(workdir / "out" / "results.jsonl", job.tests, res.timed_out, token)
            detail = (f"stopped by the wall-clock limit of {self.config.wall_clock_s:g} s" if res.timed_out
                      else None)
            return TestReport(status="timeout" if res.timed_out else "ok", detail=detail, tests=tests,
                              timed_out=res.timed_out, wall_s=res.wall_s, returncode=res.returncode,
                              files_changed=changed, harness_restored=restored, isolation=res.isolation,
                              output_tail=res.output, **base)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


def _inside(repo: Path, rel: str) -> bool:
    try:
        check_path(repo, rel)
    except DiffRefused:
        return False
    return True


def pytest_args(tests: tuple[str, ...], rootdir: str) -> list[str]:
    """pytest's arguments: our plugin, no cache writes, quiet, no colour, then the node ids."""
    return ["-m", "pytest", "-p", PLUGIN_MODULE, "-p", "no:cacheprovider", "-q", "--color=no",
            f"--rootdir={rootdir}", *tests]


@lru_cache(maxsize=8)
def interpreter_prefixes(python: str) -> tuple[str, ...]:
    """The host folders an interpreter needs (``sys.prefix``, ``sys.base_prefix`` and the exec prefixes).

    Raises:
        SandboxUnavailable: the interpreter does not run.
    """
    code = ("import json, sys; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, "
            "sys.base_exec_prefix]))")
    try:
        out = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, timeout=60, check=True)
        paths = json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise SandboxUnavailable(f"the tests' interpreter {python!r} does not run: {exc}") from exc
    keep: list[str] = []
    for p in sorted({os.path.realpath(x) for x in paths} | {os.path.abspath(x) for x in paths}, key=len):
        if not any(p == k or p.startswith(k.rstrip("/") + "/") for k in keep):
            keep.append(p)
    return tuple(keep)


_CHECKED: dict[tuple[str, bool], str] = {}


class SubprocessSandbox(Sandbox):
    """Tests in fresh Linux namespaces through :mod:`aml_ray.coding.jail` (see the module docstring)."""

    kind = "subprocess"

    def describe(self) -> dict[str, Any]:
        iso = "unsandboxed (no namespaces: UNSAFE for untrusted diffs)" if self.config.unsandboxed else "namespaces"
        return {**super().describe(), "isolation": iso}

    @property
    def python(self) -> str:
        """The interpreter that runs pytest."""
        return self.config.python or sys.executable

    def test_env(self, workdir: Path | None = None, token: str = "") -> dict[str, str]:
        """The tests' environment, built from scratch (no proxy, no API key, no secret of the platform).

        Inside the namespaces: a fixed ``PATH`` (the interpreter's folder, ``/usr/local/bin``,
        ``/usr/bin``, ``/bin``), ``HOME=/home/sandbox``, ``TMPDIR=/tmp``; unsandboxed, ``PATH`` and
        locale variables from :data:`ENV_ALLOW` and folders under ``workdir``.
        """
        if self.config.unsandboxed:
            assert workdir is not None
            env = {k: os.environ[k] for k in ENV_ALLOW if k in os.environ}
            home, tmp = workdir / "home", workdir / "tmp"
            home.mkdir(exist_ok=True)
            tmp.mkdir(exist_ok=True)
            env.update(HOME=str(home), TMPDIR=str(tmp), PYTHONPATH=str(workdir / "plugin"),
                       **{RESULTS_ENV: str(workdir / "out" / "results.jsonl")})
        else:
            env = {"PATH": f"{os.path.dirname(self.python)}:/usr/local/bin:/usr/bin:/bin", "HOME": "/home/sandbox",
                   "TMPDIR": "/tmp", "PYTHONPATH": "/sandbox/plugin", "USER": "sandbox", "LOGNAME": "sandbox",
                   RESULTS_ENV: "/sandbox/out/results.jsonl"}
        env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0", no_proxy="*", NO_PROXY="*",
                   **{TOKEN_ENV: token})
        env.setdefault("LANG", "C.UTF-8")
        if not self.config.plugin_autoload:
            env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        return env

    def check(self) -> None:
        """Start the namespaces once with a trivial command (cached per interpreter).

        Raises:
            SandboxUnavailable: naming the step that failed (user namespaces, pivot_root, a bind mount of
                the interpreter's folders, ...) and the ways out.
        """
        if self.config.unsandboxed:
            return
        key = (self.python, tuple(self.config.readonly_paths))
        if key not in _CHECKED:
            workdir = Path(tempfile.mkdtemp(prefix="aml-sandbox-check-"))
            try:
                (workdir / "repo").mkdir()
                (workdir / "plugin").mkdir()
                res = self._launch(workdir, [self.python, "-c", "pass"], "", wall_clock_s=60)
                _CHECKED[key] = "" if res.returncode == 0 else f"the check command exited with {res.returncode}: " \
                                                                f"{res.output[-500:]}"
            except SandboxUnavailable as exc:
                _CHECKED[key] = str(exc)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
        if _CHECKED[key]:
            raise SandboxUnavailable(_CHECKED[key])

    def _launch(self, workdir: Path, argv: list[str], token: str, wall_clock_s: float | None = None) -> ExecResult:
        """Run ``argv`` through the jail; ``workdir`` holds ``repo`` and ``plugin``.

        Raises:
            SandboxUnavailable: the namespaces could not be set up (the message names the step).
        """
        out, root = workdir / "out", workdir / "root"
        out.mkdir(exist_ok=True)
        root.mkdir(exist_ok=True)
        prefixes = interpreter_prefixes(self.python)
        cfg = self.config
        spec = {"root": str(root), "repo": str(workdir / "repo"), "out": str(out), "plugin": str(workdir / "plugin"),
                "status_file": str(workdir / "status.json"), "readonly": [*prefixes, *cfg.readonly_paths],
                "etc": list(ETC_ALLOW), "tmp_mb": cfg.tmp_mb, "memory_bytes": cfg.memory_mb * 1024 * 1024,
                "file_size_bytes": cfg.file_size_mb * 1024 * 1024, "pids": cfg.pids_limit, "argv": argv,
                "env": self.test_env(token=token)}
        (workdir / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
        if host_root():  # the tests run as nobody on the host: hand it the folders they write
            for folder in (workdir, workdir / "repo", out, root):
                os.chown(folder, 65534, 65534)
            for dirpath, dirnames, filenames in os.walk(workdir / "repo"):
                for name in (*dirnames, *filenames):
                    os.lchown(os.path.join(dirpath, name), 65534, 65534)
        limits = cfg if wall_clock_s is None else cfg.model_copy(update={"wall_clock_s": wall_clock_s})
        res = _run([sys.executable, "-I", "-S", str(JAIL), str(workdir / "spec.json")], cwd=workdir,
                   env={"PATH": "/usr/bin:/bin"}, limits=limits, log=workdir / "output.log", isolation="namespaces")
        status = _status(workdir / "status.json")
        if status.get("stage") != "ready":
            if res.timed_out and not status:
                raise SandboxUnavailable("the sandbox did not finish its set-up within the wall-clock limit")
            raise SandboxUnavailable(
                f"the sandbox cannot isolate the tests on this host: step {status.get('stage', '?')!r} failed: "
                f"{status.get('error', res.output[-300:])}. It needs unprivileged user namespaces "
                "(sysctl kernel.unprivileged_userns_clone=1; on Ubuntu also "
                "kernel.apparmor_restrict_unprivileged_userns=0), mount, pid and network namespaces and "
                "pivot_root. Use a container sandbox (--container-image), or --unsandboxed to run without "
                "isolation (recorded as unsandboxed in every report).")
        res.isolation = f"namespaces;proc={status.get('proc')}"
        return res

    def execute(self, workdir: Path, repo: Path, job: SandboxJob, token: str) -> ExecResult:
        cmd = [self.python, *pytest_args(job.tests, "/testbed" if not self.config.unsandboxed else str(repo))]
        if not self.config.unsandboxed:
            return self._launch(workdir, cmd, token)
        (workdir / "out").mkdir(exist_ok=True)
        return _run(cmd, cwd=repo, env=self.test_env(workdir, token), limits=self.config,
                    log=workdir / "output.log", preexec=_limit_preexec(self.config), isolation="unsandboxed")


def _status(path: Path) -> dict[str, Any]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        return json.loads(lines[0]) if lines else {}
    except (OSError, ValueError):
        return {}


class ContainerSandbox(Sandbox):
    """Tests in an operator's container runtime (Docker, Podman), e.g. SWE-bench's per-instance images.

    Args:
        image: the image holding the repository's environment (``{instance_id}`` is replaced, so one
            template serves SWE-bench's per-instance images).
        config: ``wall_clock_s``, ``memory_mb`` (``--memory``) and ``pids_limit`` (``--pids-limit``)
            apply; ``python`` is the interpreter inside the image (default ``python``).
        runtime: the runtime's executable (default ``docker``).
        repo_mount: where the patched copy is mounted inside the container (SWE-bench images install
            the repository in editable mode at ``/testbed``).
    """

    kind = "container"

    def __init__(self, image: str, config: SandboxConfig | None = None, *, runtime: str = "docker",
                 repo_mount: str = "/testbed"):
        super().__init__(config)
        self.image, self.runtime, self.repo_mount = image, runtime, repo_mount

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "image": self.image, "runtime": self.runtime, "repo_mount": self.repo_mount,
                "isolation": "container"}

    def check(self) -> None:
        """Raises :class:`SandboxUnavailable` when the runtime's executable is not found."""
        if not shutil.which(self.runtime):
            raise SandboxUnavailable(f"container runtime {self.runtime!r} not found on this worker")

    def command(self, workdir: Path, job: SandboxJob, name: str, token: str = "") -> list[str]:
        """The runtime command line (no network, memory and pids limits, read-only plugin)."""
        mb = self.config.memory_mb
        image = self.image.replace("{instance_id}", job.instance_id.lower())
        return [self.runtime, "run", "--rm", "--name", name, "--network", "none", "--memory", f"{mb}m",
                "--memory-swap", f"{mb}m", "--pids-limit", str(self.config.pids_limit),
                "--security-opt", "no-new-privileges", "--cap-drop", "ALL",
                "-v", f"{workdir / 'repo'}:{self.repo_mount}", "-v", f"{workdir / 'plugin'}:/aml_plugin:ro",
                "-v", f"{workdir / 'out'}:/aml_out", "-e", f"{RESULTS_ENV}=/aml_out/results.jsonl",
                "-e", f"{TOKEN_ENV}={token}",
                "-e", "PYTHONPATH=/aml_plugin", "-e", "PYTHONDONTWRITEBYTECODE=1",
                *([] if self.config.plugin_autoload else ["-e", "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1"]),
                "-w", self.repo_mount,
                image, self.config.python or "python", *pytest_args(job.tests, self.repo_mount)]

    def execute(self, workdir: Path, repo: Path, job: SandboxJob, token: str) -> ExecResult:
        self.check()
        (workdir / "out").mkdir()
        name = f"aml-sandbox-{uuid.uuid4().hex[:12]}"
        env = {k: os.environ[k] for k in ("PATH", "HOME", "DOCKER_HOST", "XDG_RUNTIME_DIR") if k in os.environ}

        def kill() -> None:
            subprocess.run([self.runtime, "kill", name], capture_output=True, timeout=30)

        return _run(self.command(workdir, job, name, token), cwd=workdir, env=env, limits=self.config,
                    log=workdir / "output.log", on_timeout=kill, isolation="container")


def _run_job(sandbox: Sandbox, job: SandboxJob) -> TestReport:
    try:
        return sandbox.run(job)
    except Exception as exc:  # noqa: BLE001 - a platform failure becomes a report, the run goes on
        return TestReport(instance_id=job.instance_id, status="error", detail=f"{type(exc).__name__}: {exc}")


_REMOTE: dict[tuple[int, float], Any] = {}


def sandbox_remote(sandbox: Sandbox, job: SandboxJob, *, max_retries: int = 2, num_cpus: float = 1.0):
    """Run :meth:`Sandbox.run` as a Ray task.

    Args:
        sandbox: the sandbox (pickled to the worker).
        job: the run.
        max_retries: retries when the worker process or its node dies (not on a failing test).
        num_cpus: CPUs reserved per run (default 1: pytest is CPU-bound), which bounds parallel runs.

    Returns:
        An ``ObjectRef`` to the :class:`TestReport`.
    """
    import ray

    key = (max_retries, num_cpus)
    if key not in _REMOTE:
        _REMOTE[key] = ray.remote(_run_job).options(max_retries=max_retries, num_cpus=num_cpus)
    return _REMOTE[key].remote(sandbox, job)
