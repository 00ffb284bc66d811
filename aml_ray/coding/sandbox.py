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
then the FAIL_TO_PASS and PASS_TO_PASS node ids run in one pytest process, started by the launcher
:mod:`aml_ray.coding.boot` (read-only, outside the repository copy), which loads pytest and its result
reporter before any repository code and sends one record per test event through a descriptor (never the
environment), so tests finished before a timeout keep their result; the test running at the timeout is
``timeout``, tests never started are ``not_run``. The host reads the records and cross-checks them
against pytest's exit status, summary line and its own observations (:mod:`aml_ray.coding.verdict`):
any disagreement is a flag, and a flagged run resolves nothing.

Bounds of the whole sandbox (:func:`SubprocessSandbox.bounds`, recorded in run.json): the task's copy
is a tmpfs of ``disk_mb`` (the disk quota; ``/tmp``, ``/dev/shm`` and home are tmpfs of ``tmp_mb``
each), the total memory of all its processes is held to ``memory_mb`` by the sandbox's pid 1, which
sums their proportional set size every 0.1 s and kills them all above it (status ``memory_limit``),
on top of ``RLIMIT_AS`` per process, and processes are counted by ``RLIMIT_NPROC`` in the sandbox's
user namespace. These bounds need no cgroup: this host's cgroup hierarchy is often not delegated to
the platform (cgroup v1, or v2 without the memory controller in a writable subtree), so the sandbox
does not depend on one. The output is read through a pipe, of which only the last
:data:`OUTPUT_KEEP` bytes are kept.

On Ray, :func:`sandbox_remote` runs :meth:`Sandbox.run` as a task with ``max_retries`` (a worker that
dies is retried; a failing test is a result, not an exception). On a multi-node cluster the snapshot
paths must be on storage every node sees.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
import zipfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from aml_ray.coding import harness, verdict
from aml_ray.coding.diffs import DiffApplyError, DiffRefused, apply_diff, check_path, diff_paths

#: Per-test outcomes in a report. ``xfail`` counts as a pass and ``skipped`` is left out of the
#: resolved rule, as in SWE-bench's grading; see :mod:`aml_ray.coding.scoring`.
TestOutcome = Literal["passed", "failed", "error", "skipped", "xfail", "timeout", "not_run"]
ReportStatus = Literal["ok", "timeout", "memory_limit", "refused", "apply_failed", "no_snapshot", "error"]

BOOT = Path(__file__).with_name("boot.py")
#: The launcher's name in the read-only folder next to the repository copy.
BOOT_NAME = "aml_sandbox_boot.py"
#: Bytes of test output kept (the tail); the summary line is read from it.
OUTPUT_KEEP = 256 * 1024
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
        memory_mb: memory limit in MiB (default 4,096): the address space of each process (``RLIMIT_AS``:
            thread stacks and BLAS arenas count, so leave headroom) and, in the subprocess sandbox, the
            total proportional set size of all its processes together.
        file_size_mb: largest file the tests may write, in MiB (``RLIMIT_FSIZE``; default 512).
        pids_limit: most processes and threads the tests may have at once (``RLIMIT_NPROC`` counted in
            the sandbox's own user namespace; default 256).
        tmp_mb: size of each private tmpfs (``/tmp``, ``/dev/shm``, home) in MiB (default 512).
        disk_mb: size of the tmpfs holding the task's copy at ``/testbed`` in MiB (default 2,048): the
            repository plus everything the tests write there must fit.
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
    disk_mb: int = Field(default=2048, ge=16)
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
            ``memory_limit`` (killed when the sandbox's processes together passed ``memory_mb``),
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
        summary_line: pytest's own summary line (``2 failed, 2 passed in 0.12s``), None when absent.
        cross_check: ``agree`` when pytest's exit status, summary line and the per-test records agree,
            ``disagree`` when a flag was raised, ``not_checked`` when the tests did not run.
        flags: what disagreed (:mod:`aml_ray.coding.verdict`); a flagged report resolves nothing.
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
    summary_line: str | None = None
    cross_check: Literal["agree", "disagree", "not_checked"] = "not_checked"
    flags: list[str] = Field(default_factory=list)


@dataclass
class ExecResult:
    """The outcome of running the test command."""

    returncode: int | None
    timed_out: bool
    wall_s: float
    output: str
    isolation: str
    limit: str | None = None


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


def _limit_preexec(limits: SandboxConfig):
    memory = limits.memory_mb * 1024 * 1024
    fsize = limits.file_size_mb * 1024 * 1024

    def apply_limits() -> None:  # runs in the child between fork and exec: keep it to setrlimit calls
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply_limits


class _Tail(threading.Thread):
    """Reads a pipe to its end, keeping only the last ``keep`` bytes (a flood of output costs no disk)."""

    def __init__(self, pipe, keep: int):
        super().__init__(daemon=True)
        self.pipe, self.keep, self.data = pipe, keep, bytearray()

    def run(self) -> None:
        for chunk in iter(lambda: self.pipe.read1(65536), b""):
            self.data += chunk
            if len(self.data) > 2 * self.keep:
                del self.data[:-self.keep]

    def text(self) -> str:
        """The kept tail, decoded."""
        return bytes(self.data[-self.keep:]).decode("utf-8", errors="replace")


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str], limits: SandboxConfig, pass_fds: tuple[int, ...] = (),
         preexec=None, on_timeout=None, isolation: str) -> ExecResult:
    """Run ``cmd`` in its own process group with the wall-clock limit; the output tail is kept in memory."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=preexec, pass_fds=pass_fds)
    tail = _Tail(proc.stdout, OUTPUT_KEEP)
    tail.start()
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
    tail.join(timeout=10)  # a detached child of an unsandboxed run may hold the pipe: stop waiting
    return ExecResult(returncode=None if timed_out else proc.returncode, timed_out=timed_out,
                      wall_s=time.monotonic() - t0, output=tail.text(), isolation=isolation)


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
        """A description for run.json, with how each limit is enforced (:meth:`bounds`)."""
        return {"kind": self.kind, "config": self.config.model_dump(), "bounds": self.bounds()}

    def bounds(self) -> dict[str, str]:
        """How each limit is enforced (``memory``, ``disk``, ``processes``, ``cgroup``); none by default."""
        return {}

    @abstractmethod
    def execute(self, workdir: Path, repo: Path, job: SandboxJob, results_fd: int) -> ExecResult:
        """Run pytest on ``job.tests`` in ``repo`` through the launcher in ``workdir/plugin``, whose
        records must end in :meth:`results_path` (``results_fd`` is that file, open for appending).

        Raises:
            SandboxError: the test command cannot be started (reported as ``error``).
        """

    def results_path(self, workdir: Path) -> Path:
        """Where the launcher's records end up (default ``workdir/results.jsonl``, out of the tests' reach)."""
        return workdir / "results.jsonl"

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
            (workdir / "plugin").mkdir()
            shutil.copyfile(BOOT, workdir / "plugin" / BOOT_NAME)
            results_fd = os.open(workdir / "results.jsonl", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
            try:
                res = self.execute(workdir, repo, job, results_fd)
            except SandboxError as exc:
                return TestReport(status="error", detail=str(exc), files_changed=changed,
                                  harness_restored=restored, **base)
            finally:
                os.close(results_fd)
            return self._verdict(workdir, job, res, files_changed=changed, harness_restored=restored, **base)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _verdict(self, workdir: Path, job: SandboxJob, res: ExecResult, **fields: Any) -> TestReport:
        """The report of a run that executed: outcomes from the records, then the cross-check."""
        flags: list[str] = []
        try:
            data = verdict.read_capped(self.results_path(workdir)) or b""
        except verdict.UnsafeOutput as exc:
            data, flags = b"", [f"results refused: {exc}"]
        out_dir = workdir / "out"
        if out_dir.is_dir():
            flags += [f"output folder holds a link or special file: {p}" for p in verdict.unsafe_entries(out_dir)]
        rec = verdict.parse_records(data)
        tests = verdict.outcomes(rec, job.tests, res.timed_out)
        line, disagreements = verdict.cross_check(rec, res.returncode, res.output, res.timed_out or bool(res.limit))
        flags += disagreements + verdict.shadowing(rec, fields.get("files_changed", []))
        status: ReportStatus = "timeout" if res.timed_out else "memory_limit" if res.limit else "ok"
        detail = (f"stopped by the wall-clock limit of {self.config.wall_clock_s:g} s" if res.timed_out
                  else res.limit)
        tail = res.output[-self.config.output_tail_chars:] if self.config.output_tail_chars else ""
        return TestReport(status=status, detail=detail, tests=tests, timed_out=res.timed_out, wall_s=res.wall_s,
                          returncode=res.returncode, isolation=res.isolation, output_tail=tail, summary_line=line,
                          cross_check="disagree" if flags else "agree", flags=flags, **fields)


def _inside(repo: Path, rel: str) -> bool:
    try:
        check_path(repo, rel)
    except DiffRefused:
        return False
    return True


def pytest_args(tests: tuple[str, ...], rootdir: str, boot: str, results: str) -> list[str]:
    """The interpreter's arguments: the launcher ``boot``, its results channel (``fd:N`` or ``path:P``),
    then pytest's: no cache writes, quiet, no colour, the root folder, the node ids."""
    return [boot, results, "-p", "no:cacheprovider", "-q", "--color=no", f"--rootdir={rootdir}", *tests]


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


def cgroup2_state() -> str:
    """Why this host offers the platform no cgroup v2 memory and pids controllers to delegate, in words.

    Reads ``/proc/self/cgroup`` and the cgroup2 mount of ``/proc/self/mountinfo``; the controllers a
    child cgroup could use are those listed in the own cgroup's ``cgroup.controllers``
    (``cgroups(7)``, "Cgroups version 2").
    """
    try:
        mounts = [line.split(" - ")[0].split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                  if " - cgroup2 " in line]
        own = next((line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::")),
                   None)
    except OSError as exc:
        return f"cannot read the cgroup state: {exc}"
    if not mounts or own is None:
        return "no cgroup v2 hierarchy is mounted"
    controllers = (Path(mounts[0]) / own.lstrip("/") / "cgroup.controllers")
    try:
        have = set(controllers.read_text().split())
    except OSError:
        return f"the own cgroup {own} is not visible under {mounts[0]}"
    missing = sorted({"memory", "pids"} - have)
    if missing:
        return f"cgroup v2 at {mounts[0]} lacks the {', '.join(missing)} controller(s) (a cgroup v1 or hybrid host)"
    return f"cgroup v2 at {mounts[0]} offers memory and pids; the platform does not create cgroups"


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

    def test_env(self, workdir: Path | None = None) -> dict[str, str]:
        """The tests' environment, built from scratch (no proxy, no API key, no secret of the platform,
        no ``PYTHONPATH``: the launcher puts the repository on ``sys.path`` itself).

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
            env.update(HOME=str(home), TMPDIR=str(tmp))
        else:
            env = {"PATH": f"{os.path.dirname(self.python)}:/usr/local/bin:/usr/bin:/bin", "HOME": "/home/sandbox",
                   "TMPDIR": "/tmp", "USER": "sandbox", "LOGNAME": "sandbox"}
        env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0", no_proxy="*", NO_PROXY="*")
        env.setdefault("LANG", "C.UTF-8")
        if not self.config.plugin_autoload:
            env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        return env

    def bounds(self) -> dict[str, str]:
        """How each limit is enforced, for run.json (see the module docstring)."""
        cfg = self.config
        if cfg.unsandboxed:
            return {"memory": f"RLIMIT_AS {cfg.memory_mb} MiB per process only (unsandboxed)",
                    "disk": f"RLIMIT_FSIZE {cfg.file_size_mb} MiB per file only (unsandboxed)",
                    "processes": "none (unsandboxed)", "cgroup": "not used"}
        return {"memory": f"{cfg.memory_mb} MiB: total proportional set size of the sandbox's processes, polled "
                          "every 0.1 s by its pid 1 (overshoot up to 0.1 s of allocation), and RLIMIT_AS per "
                          "process",
                "disk": f"/testbed on a tmpfs of {cfg.disk_mb} MiB; /tmp, /dev/shm, home tmpfs of {cfg.tmp_mb} MiB "
                        f"each; RLIMIT_FSIZE {cfg.file_size_mb} MiB per file",
                "processes": f"RLIMIT_NPROC {cfg.pids_limit} in the sandbox's user namespace",
                "cgroup": "not used (fallback above): " + cgroup2_state()}

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
                fd = os.open(workdir / "results.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                try:
                    res = self._launch(workdir, [self.python, "-c", "pass"], fd, wall_clock_s=60)
                finally:
                    os.close(fd)
                _CHECKED[key] = "" if res.returncode == 0 else f"the check command exited with {res.returncode}: " \
                                                                f"{res.output[-500:]}"
            except SandboxUnavailable as exc:
                _CHECKED[key] = str(exc)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
        if _CHECKED[key]:
            raise SandboxUnavailable(_CHECKED[key])

    def _launch(self, workdir: Path, argv: list[str], results_fd: int,
                wall_clock_s: float | None = None) -> ExecResult:
        """Run ``argv`` through the jail; ``workdir`` holds ``repo`` and ``plugin``; the jail's pid 1 relays
        the command's fd 3 into ``results_fd``.

        Raises:
            SandboxUnavailable: the namespaces could not be set up (the message names the step).
        """
        root = workdir / "root"
        root.mkdir(exist_ok=True)
        prefixes = interpreter_prefixes(self.python)
        cfg = self.config
        mib = 1024 * 1024
        spec = {"root": str(root), "repo": str(workdir / "repo"), "plugin": str(workdir / "plugin"),
                "status_file": str(workdir / "status.json"), "readonly": [*prefixes, *cfg.readonly_paths],
                "etc": list(ETC_ALLOW), "tmp_mb": cfg.tmp_mb, "disk_bytes": cfg.disk_mb * mib,
                "memory_bytes": cfg.memory_mb * mib, "watch_memory": True, "file_size_bytes": cfg.file_size_mb * mib,
                "pids": cfg.pids_limit, "argv": argv, "env": self.test_env(), "results_fd": results_fd,
                "results_cap": verdict.RESULTS_CAP}
        (workdir / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
        limits = cfg if wall_clock_s is None else cfg.model_copy(update={"wall_clock_s": wall_clock_s})
        res = _run([sys.executable, "-I", "-S", str(JAIL), str(workdir / "spec.json")], cwd=workdir,
                   env={"PATH": "/usr/bin:/bin"}, limits=limits, pass_fds=(results_fd,), isolation="namespaces")
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
        hit = status.get("memory_limit")
        if hit:
            res.limit = (f"stopped by the memory limit: the sandbox's processes held {hit['pss_bytes'] / mib:,.0f} MiB "
                         f"together, above memory_mb={cfg.memory_mb:,}")
        return res

    def execute(self, workdir: Path, repo: Path, job: SandboxJob, results_fd: int) -> ExecResult:
        if not self.config.unsandboxed:
            cmd = [self.python, *pytest_args(job.tests, "/testbed", f"/sandbox/plugin/{BOOT_NAME}", "fd:3")]
            return self._launch(workdir, cmd, results_fd)
        cmd = [self.python, *pytest_args(job.tests, str(repo), str(workdir / "plugin" / BOOT_NAME), f"fd:{results_fd}")]
        return _run(cmd, cwd=repo, env=self.test_env(workdir), limits=self.config, pass_fds=(results_fd,),
                    preexec=_limit_preexec(self.config), isolation="unsandboxed")


def _status(path: Path) -> dict[str, Any]:
    """The jail's status file: the first line's set-up record, with later records (limits) under their stage."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        records = [json.loads(line) for line in lines]
    except (OSError, ValueError):
        return {}
    if not records:
        return {}
    first = dict(records[0])
    for rec in records[1:]:
        first[rec.get("stage", "?")] = rec
    return first


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

    def results_path(self, workdir: Path) -> Path:
        """``workdir/out/results.jsonl``: a runtime cannot pass a descriptor, so the launcher writes a file in a
        mounted folder the tests can also write; it is read with the checks of :func:`verdict.read_capped`."""
        return workdir / "out" / "results.jsonl"

    def bounds(self) -> dict[str, str]:
        """How each limit is enforced, for run.json."""
        return {"memory": f"--memory {self.config.memory_mb}m (the runtime's cgroup, all processes together)",
                "processes": f"--pids-limit {self.config.pids_limit}",
                "disk": "not bounded by the platform: the copy is a host folder mounted into the container",
                "cgroup": "the container runtime's"}

    def command(self, workdir: Path, job: SandboxJob, name: str) -> list[str]:
        """The runtime command line (no network, memory and pids limits, read-only launcher)."""
        mb = self.config.memory_mb
        image = self.image.replace("{instance_id}", job.instance_id.lower())
        return [self.runtime, "run", "--rm", "--name", name, "--network", "none", "--memory", f"{mb}m",
                "--memory-swap", f"{mb}m", "--pids-limit", str(self.config.pids_limit),
                "--security-opt", "no-new-privileges", "--cap-drop", "ALL",
                "-v", f"{workdir / 'repo'}:{self.repo_mount}", "-v", f"{workdir / 'plugin'}:/aml_plugin:ro",
                "-v", f"{workdir / 'out'}:/aml_out", "-e", "PYTHONDONTWRITEBYTECODE=1",
                *([] if self.config.plugin_autoload else ["-e", "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1"]),
                "-w", self.repo_mount,
                image, self.config.python or "python",
                *pytest_args(job.tests, self.repo_mount, f"/aml_plugin/{BOOT_NAME}", "path:/aml_out/results.jsonl")]

    def execute(self, workdir: Path, repo: Path, job: SandboxJob, results_fd: int) -> ExecResult:
        self.check()
        (workdir / "out").mkdir()
        name = f"aml-sandbox-{uuid.uuid4().hex[:12]}"
        env = {k: os.environ[k] for k in ("PATH", "HOME", "DOCKER_HOST", "XDG_RUNTIME_DIR") if k in os.environ}

        def kill() -> None:
            subprocess.run([self.runtime, "kill", name], capture_output=True, timeout=30)

        return _run(self.command(workdir, job, name), cwd=workdir, env=env, limits=self.config, on_timeout=kill,
                    isolation="container")


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
