"""Run the reference memory system: the ``python -m aml_ray.reference`` entry and :class:`ReferenceServer`.

The command prints exactly one line ``READY http://host:port`` to stdout once it is listening (with
``--port 0`` the OS picks a free port). The secret is read from an environment variable, never from argv,
so it does not show up in process listings.

Dying with the driver: a server started by :class:`ReferenceServer` must not outlive the
process that started it, even one killed with SIGKILL (no ``stop()``, no ``finally``), or it keeps holding
its port and its SQLite file. The child does it itself, two ways, both set up first thing in :func:`main`:

- ``--parent-pid PID``: a watchdog thread checks every :data:`PARENT_POLL_S` s that ``os.getppid()`` is
  still ``PID``. ``getppid()`` is the parent *process* (its thread group), which changes only when the
  whole driver is gone (the server is then re-parented to init or a subreaper); the server then sends
  itself SIGTERM (uvicorn's graceful exit) and exits hard :data:`ORPHAN_GRACE_S` s later if still up.
  Portable, and right whichever thread started the server.
- ``--pdeathsig`` (Linux): ``prctl(PR_SET_PDEATHSIG, SIGTERM)``, so the kernel signals the server at
  once. prctl(2): the signal is sent when the parent *thread* that created the child exits, not the
  parent process. :class:`ReferenceServer` therefore asks for it only when ``start()`` runs on the
  driver's main thread, which lives as long as the driver process (the interpreter's shutdown runs on
  it); a server started from another thread (a thread pool's worker) relies on the watchdog alone, so
  it is not killed when that thread ends. It is set in the child after exec rather than in a
  ``preexec_fn`` (which is unsafe in a process with threads, as a Ray driver is); the setting survives
  exec, and the ``getppid()`` check after it covers a driver that died before it was set.

Ctrl-C: the server runs in a session of its own, so a terminal's Ctrl-C (SIGINT to the driver's whole
process group) reaches the driver only. The run it serves then ends as interrupted with the server still
answering: the Adds in flight finish or are abandoned unjournalled, never recorded as failed because the
server went away first, and ``aml-ray run --resume`` sends them again to the same store. The server ends
when its driver stops it or dies (the two ways above).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType

#: Environment variable through which :class:`ReferenceServer` passes the secret to its subprocess.
SECRET_ENV = "AML_REFERENCE_SECRET"
DB_NAME = "reference.sqlite3"
#: Seconds between the watchdog's checks that the driver is still the server's parent.
PARENT_POLL_S = 0.2
#: Seconds an orphaned server has for its graceful exit (SIGTERM) before it exits hard.
ORPHAN_GRACE_S = 5.0
#: ``PR_SET_PDEATHSIG`` of ``<linux/prctl.h>``.
PR_SET_PDEATHSIG = 1
#: Seconds :class:`ReferenceServer` waits for the server to listen and answer ``GET /health``. It is a
#: second on an idle machine; the limit is generous because a loaded machine (other runs, a CI beside it)
#: can stretch the interpreter's start and imports many times over, and a run that fails to start costs
#: more than a minute of waiting. The server's own death is noticed at once, whatever the limit.
STARTUP_TIMEOUT_S = 180.0


class ReferenceStartError(RuntimeError):
    """The reference system did not start. ``str()`` is one line naming the cause and the log file.

    Attributes:
        log_path: the server's stderr log (its traceback, if it crashed).
        stderr_tail: the last few thousand characters of that log.
    """

    def __init__(self, why: str, log_path: Path, stderr_tail: str):
        super().__init__(f"the reference system did not start: {why} (its log: {log_path})")
        self.log_path, self.stderr_tail = log_path, stderr_tail


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m aml_ray.reference``.

    Returns:
        The argument parser.
    """
    p = argparse.ArgumentParser(prog="python -m aml_ray.reference",
                                description="Reference BM25 memory system speaking the AML Add/Search "
                                            "contract.")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port; 0 picks a free one (default 0)")
    p.add_argument("--db", type=Path, required=True, help="SQLite file for the memories")
    p.add_argument("--auth", default="none", choices=["none", "Token", "Bearer", "X-Api-Key"],
                   help="authentication scheme (default none)")
    p.add_argument("--secret-env", default=SECRET_ENV,
                   help=f"environment variable holding the secret (default {SECRET_ENV})")
    p.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    p.add_argument("--multimodal", action="store_true",
                   help="accept text/image_url content parts (Multimodal track; default media limits)")
    p.add_argument("--faults", default=None,
                   help="inject faults (chaos participant), e.g. '429=0.05,503=0.05,drop=0.02,seed=1'; "
                        "see aml_ray.reference.chaos")
    p.add_argument("--baseline", default=None, choices=["none", "full-context", "oracle"],
                   help="serve a reference baseline's Search instead of BM25 (aml_ray.reference.baselines)")
    p.add_argument("--dataset", default=None, help="--baseline oracle: the dataset name (e.g. locomo)")
    p.add_argument("--data", type=Path, default=None, help="--baseline oracle: the dataset file or directory")
    p.add_argument("--context-budget", type=int, default=None,
                   help="--baseline full-context: the run's context budget in tokens")
    p.add_argument("--answer-model", default=None,
                   help="--baseline full-context: the answer model whose tokenizer counts the budget")
    p.add_argument("--parent-pid", type=int, default=None,
                   help="exit once process PID is no longer this server's parent (its driver died); "
                        f"checked every {PARENT_POLL_S} s")
    p.add_argument("--pdeathsig", action="store_true",
                   help="with --parent-pid, on Linux: also PR_SET_PDEATHSIG=SIGTERM; only when the thread "
                        "that started this process lives as long as its process (prctl(2))")
    return p


def _set_pdeathsig(sig: int) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)`` through libc; False where it is not available (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(ORPHAN_GRACE_S)
    os._exit(1)


def die_with_parent(parent_pid: int, pdeathsig: bool) -> bool:
    """Make this process exit when ``parent_pid`` dies (see the module docstring).

    Args:
        parent_pid: the driver's pid, as the driver saw it (``os.getpid()``).
        pdeathsig: also arm ``PR_SET_PDEATHSIG`` (Linux; only when the driver started this process from
            its main thread).

    Returns:
        False when ``parent_pid`` is already not the parent (the driver died before this ran); else True,
        with the watchdog thread started.
    """
    if pdeathsig:
        _set_pdeathsig(signal.SIGTERM)
    if os.getppid() != parent_pid:
        return False
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="parent-watchdog", daemon=True).start()
    return True


async def _serve(app, sock: socket.socket, log_level: str) -> None:
    import uvicorn

    config = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            await task  # re-raises the startup failure
            raise RuntimeError("uvicorn stopped before it started listening")
        await asyncio.sleep(0.02)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"READY http://{shown}:{port}", flush=True)
    await task


def serve_on(app, host: str, port: int, log_level: str = "warning") -> None:
    """Serve an ASGI app with uvicorn on ``host:port`` until it stops or the process is interrupted.

    Binds the listening socket itself (IPv6 when ``host`` contains ``:``; ``SO_REUSEADDR``, backlog 2048,
    inheritable) rather than letting uvicorn do it, because it must be made with ``proto=IPPROTO_TCP``:
    asyncio sets ``TCP_NODELAY`` on accepted sockets only when the listening socket says so, and without
    it every keep-alive response waits ~40 ms (Nagle + delayed ACK). Prints
    exactly one line ``READY http://host:port`` to stdout once uvicorn listens (with ``port`` 0 the OS
    picks the port; the line names the one bound). Used by :func:`main` (``python -m aml_ray.reference``)
    and by the recorded participant of ``scripts/bench_service_smoke.py``.

    Args:
        app: the ASGI app (the reference app, or a middleware around it).
        host: bind address, e.g. ``"127.0.0.1"`` or ``"::1"``.
        port: TCP port; 0 for a free one.
        log_level: uvicorn's log level.

    Raises:
        OSError: the address could not be bound (in use, not local).
        RuntimeError: uvicorn stopped before it listened (its startup error is raised if it had one).

    A ``KeyboardInterrupt`` (Ctrl-C, SIGINT) ends serving quietly; the socket is closed on every way out
    after the bind. What the app holds (the store) is the caller's to close.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    try:
        asyncio.run(_serve(app, sock, log_level))
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()


def baseline_search(args: argparse.Namespace):
    """The Search of ``--baseline`` (None for BM25): the oracle reads ``--dataset`` from ``--data``.

    Raises:
        ValueError: a baseline without the options it needs, or an unknown or malformed dataset.
        OSError: the dataset file cannot be read.
    """
    if args.baseline is None:
        return None
    from aml_ray.reference.baselines import searcher

    samples = None
    if args.baseline == "oracle":
        if not args.dataset or args.data is None:
            raise ValueError("the oracle needs --dataset NAME and --data FILE")
        from aml_ray.datasets.registry import get_dataset

        samples = get_dataset(args.dataset).read(args.data)
    return searcher(args.baseline, samples=samples, budget_tokens=args.context_budget, model=args.answer_model)


def main(argv: list[str] | None = None) -> int:
    """Run the server until interrupted.

    Args:
        argv: arguments (default ``sys.argv[1:]``).

    Returns:
        The process exit status.
    """
    args = build_parser().parse_args(argv)
    if args.parent_pid is not None and not die_with_parent(args.parent_pid, args.pdeathsig):
        print(f"error: parent process {args.parent_pid} is gone", file=sys.stderr)
        return 1
    auth = None if args.auth == "none" else args.auth
    secret = os.environ.get(args.secret_env) if auth else None
    if auth and not secret:
        print(f"error: --auth {auth} needs a secret in ${args.secret_env}", file=sys.stderr)
        return 2
    from aml_ray.reference.app import create_app

    media = None
    if args.multimodal:
        from aml_ray.media import MediaLimits

        media = MediaLimits()
    try:
        search = baseline_search(args)
    except (OSError, ValueError) as exc:
        print(f"error: --baseline {args.baseline}: {exc}", file=sys.stderr)
        return 2
    app = create_app(args.db, auth=auth, secret=secret, media=media, search=search)
    served = app
    if args.faults:
        from aml_ray.reference.chaos import ChaosMiddleware, FaultPlan

        try:
            served = app.state.chaos = ChaosMiddleware(app, FaultPlan.parse(args.faults))
        except ValueError as exc:
            print(f"error: --faults: {exc}", file=sys.stderr)
            return 2
    try:
        serve_on(served, args.host, args.port, args.log_level)
    finally:
        app.state.store.close()
    return 0


class ReferenceServer:
    """The reference memory system as a subprocess on a free loopback port, which dies with this process
    (even a SIGKILLed one: see the module docstring).

    Usage::

        with ReferenceServer(tmp_dir, auth="Bearer", secret="s3cret") as srv:
            httpx.post(srv.add_url, json=..., headers=srv.auth_headers())

    Args:
        directory: where the database (``reference.sqlite3``) and the subprocess logs live; reusing a
            directory reuses its memories.
        auth: ``"Token"``, ``"Bearer"``, ``"X-Api-Key"`` or None.
        secret: the secret for ``auth`` (passed through the environment, not argv).
        host: bind address (default loopback).
        startup_timeout: seconds to wait for ``READY`` and a healthy ``GET /health``
            (default :data:`STARTUP_TIMEOUT_S`).
        db_path: database file, overriding ``directory / "reference.sqlite3"``.
        faults: a fault spec (:mod:`aml_ray.reference.chaos`) to run it as the chaos participant.
        multimodal: accept content parts (``--multimodal``).
        baseline: ``{"baseline": NAME, ...}``: serve that reference baseline
            (:mod:`aml_ray.reference.baselines`) with its options (``dataset``, ``data``, ``context_budget``,
            ``answer_model``: the command line's ``--dataset``...); None for BM25.
    """

    def __init__(self, directory: Path, *, auth: str | None = None, secret: str | None = None,
                 host: str = "127.0.0.1", startup_timeout: float = STARTUP_TIMEOUT_S, db_path: Path | None = None,
                 faults: str | None = None, multimodal: bool = False, baseline: dict | None = None):
        self.baseline = dict(baseline or {})
        self.faults = faults
        self.multimodal = multimodal
        self.directory = Path(directory)
        self.db_path = Path(db_path) if db_path else self.directory / DB_NAME
        self.auth = None if auth in (None, "none") else auth
        self._secret = secret
        self.host = host
        self.startup_timeout = startup_timeout
        self.base_url: str | None = None
        self._proc: subprocess.Popen | None = None
        self._stdout_path = self.directory / "reference.stdout.log"
        self._stderr_path = self.directory / "reference.stderr.log"

    @property
    def add_url(self) -> str:
        """URL of ``POST /add``."""
        return f"{self._base()}/add"

    @property
    def search_url(self) -> str:
        """URL of ``POST /search``."""
        return f"{self._base()}/search"

    @property
    def health_url(self) -> str:
        """URL of ``GET /health``."""
        return f"{self._base()}/health"

    def _base(self) -> str:
        if self.base_url is None:
            raise RuntimeError("ReferenceServer is not running; use start() or a with-block")
        return self.base_url

    @property
    def stats_url(self) -> str:
        """URL of ``GET /stats`` (store counters and injected faults)."""
        return f"{self._base()}/stats"

    def stats(self) -> dict:
        """``GET /stats``: ``{memories, requests_applied, duplicate_adds_acknowledged, faults_injected}``."""
        import httpx  # here: a command that only names a reference system (its options, its checks) needs no client

        return httpx.get(self.stats_url, timeout=10.0).json()

    def auth_headers(self) -> dict[str, str]:
        """Headers that authenticate against this server (empty without auth).

        Returns:
            A header dict; contains the secret, so do not log it.
        """
        if self.auth is None:
            return {}
        if self.auth == "X-Api-Key":
            return {"X-Api-Key": self._secret or ""}
        return {"Authorization": f"{self.auth} {self._secret}"}

    def _stderr_tail(self, limit: int = 4000) -> str:
        try:
            return self._stderr_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def _fail(self, why: str) -> ReferenceStartError:
        self.stop()
        return ReferenceStartError(why, self._stderr_path, self._stderr_tail())

    def start(self) -> ReferenceServer:
        """Start the subprocess and wait until ``GET /health`` answers 200. The subprocess exits when this
        process does (a watchdog on its parent pid; ``PR_SET_PDEATHSIG`` too when called on the main
        thread).

        Returns:
            self.

        Raises:
            ReferenceStartError: the process exited, or did not become healthy within ``startup_timeout``;
                the message names its log file, the exception carries the log's tail.
            RuntimeError: already started.
        """
        if self._proc is not None:
            raise RuntimeError("ReferenceServer already started")
        self.directory.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "aml_ray.reference", "--host", self.host, "--port", "0",
               "--db", str(self.db_path), "--auth", self.auth or "none", "--secret-env", SECRET_ENV]
        if self.faults:
            cmd += ["--faults", self.faults]
        if self.multimodal:
            cmd.append("--multimodal")
        for key, value in self.baseline.items():
            if value is not None:
                cmd += [f"--{key.replace('_', '-')}", str(value)]
        cmd += ["--parent-pid", str(os.getpid())]
        if threading.current_thread() is threading.main_thread():
            cmd.append("--pdeathsig")  # prctl(2) follows the starting thread: see the module docstring
        env = dict(os.environ)
        env.pop(SECRET_ENV, None)
        if self.auth is not None:
            if not self._secret:
                raise ValueError(f"auth={self.auth!r} needs a secret")
            env[SECRET_ENV] = self._secret
        with open(self._stdout_path, "wb") as out, open(self._stderr_path, "wb") as err:
            self._proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                          start_new_session=True)  # a terminal's Ctrl-C is the driver's alone
        deadline = time.monotonic() + self.startup_timeout
        while self.base_url is None:
            for line in self._stdout_path.read_text(errors="replace").splitlines():
                if line.startswith("READY "):
                    self.base_url = line.split(" ", 1)[1].strip()
            if self.base_url is not None:
                break
            if self._proc.poll() is not None:
                raise self._fail(f"its process exited with status {self._proc.returncode}")
            if time.monotonic() > deadline:
                raise self._fail(f"it printed no READY line within {self.startup_timeout:.0f} s")
            time.sleep(0.05)
        import httpx

        last = "no answer"
        while True:
            try:
                r = httpx.get(self.health_url, timeout=2.0)
                if r.status_code == 200:
                    return self
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as exc:
                last = type(exc).__name__
            if self._proc.poll() is not None:
                raise self._fail(f"its process exited with status {self._proc.returncode}")
            if time.monotonic() > deadline:
                raise self._fail(f"GET /health was not 200 within {self.startup_timeout:.0f} s ({last})")
            time.sleep(0.05)

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the subprocess (SIGTERM, wait, then SIGKILL). Safe to call twice.

        Args:
            timeout: seconds to wait after SIGTERM before killing.
        """
        proc, self._proc = self._proc, None
        self.base_url = None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> ReferenceServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
