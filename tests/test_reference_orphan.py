"""The reference server dies with its driver (issue 24, item 10): a SIGKILLed driver leaves no server
holding the port and the SQLite file.

A real driver process (``python -c``) starts :class:`ReferenceServer` (from its main thread, or from a
thread that then exits), prints the server's pid and port, and is killed with SIGKILL.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]

DRIVER = """
import sys, threading, time
from pathlib import Path
from aml_ray.reference import ReferenceServer

srv = ReferenceServer(Path(sys.argv[1]))
if sys.argv[2] == "thread":
    starter = threading.Thread(target=srv.start)
    starter.start()
    starter.join()
else:
    srv.start()
print(srv._proc.pid, srv.base_url.rsplit(":", 1)[1], flush=True)
time.sleep(300)
"""

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's exit is reaped by init, or not, in containers)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_driver(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, int, int]:
    """The driver, and the server's pid and port once it is healthy."""
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path), mode], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    line = driver.stdout.readline()  # ReferenceServer.start gives up after its start limit; the driver then exits
    assert line, f"driver exited with {driver.wait()} before printing the server's pid"
    pid, port = map(int, line.split())
    return driver, pid, port


@pytest.mark.parametrize("mode", ["main", "thread"])
def test_sigkill_of_the_driver_takes_the_reference_server_down(tmp_path, mode):
    driver, pid, port = start_driver(tmp_path, mode)
    try:
        # started from a thread that has exited: the server must still be up (PR_SET_PDEATHSIG follows the
        # starting thread, so it must not be armed there)
        for _ in range(5):
            assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=60.0).status_code == 200
            time.sleep(0.1)
        assert alive(pid)
        driver.send_signal(signal.SIGKILL)
        assert driver.wait(timeout=60) == -signal.SIGKILL
        deadline = time.monotonic() + 60  # the kernel's parent-death signal, then the server's exit
        while (alive(pid) or listening(port)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(pid), f"reference server {pid} outlived its SIGKILLed driver"
        assert not listening(port)
        with socket.socket() as s:  # the port can be bound again
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
        db = sqlite3.connect(tmp_path / "reference.sqlite3", timeout=0)
        db.execute("BEGIN EXCLUSIVE")  # no other process holds the database
        db.rollback()
        db.close()
    finally:
        driver.kill()
        driver.wait()
        driver.stdout.close()
        if alive(pid) and b"aml_ray.reference" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)  # the orphan this test found; never leave it running


def test_a_server_whose_parent_is_already_gone_exits_before_serving(tmp_path, capsys):
    """The driver died between fork and the server's set-up: ``--parent-pid`` is not the parent any more."""
    from aml_ray.reference.server import main

    assert main(["--db", str(tmp_path / "db.sqlite3"), "--parent-pid", str(os.getpid())]) == 1
    assert capsys.readouterr().err == f"error: parent process {os.getpid()} is gone\n"
    assert not (tmp_path / "db.sqlite3").exists()
