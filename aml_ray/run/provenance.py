"""What run.json records of the code that ran a run: package version, git commit, pipeline code hash, Python.

The git commit (a ``git rev-parse`` child process) and the pipeline code hash (every source file of the
package read and hashed) took 0.08-0.13 s of a run's preparation in traced runs of ``aml-ray run`` on 2
cores while Ray started beside it (2-7 ms and 5-6 ms on an idle machine), on the path to the first Add.
The command line starts them in a thread right after the pre-flight
(:func:`start_code_provenance`); the run's preparation takes that result (:func:`code_provenance`), or
computes its own when nothing was started (service jobs, suites, library calls: one each, never shared
between runs). Standard library only: it is imported before the evaluation's heavy modules.
"""

from __future__ import annotations

import hashlib
import platform
import subprocess
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import aml_ray

_lock = threading.Lock()
_started: Future | None = None


def git_commit() -> str | None:
    """The commit of the git checkout the package runs from (``git rev-parse HEAD``); None outside one."""
    root = Path(aml_ray.__file__).resolve().parents[1]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=True)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def pipeline_code_hash() -> str:
    """sha256 over the package's Python sources (path + bytes, sorted): the "pipeline code hash"."""
    root = Path(aml_ray.__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _compute() -> dict[str, Any]:
    return {"package_version": aml_ray.__version__, "git_commit": git_commit(),
            "pipeline_code_sha256": pipeline_code_hash(), "python": platform.python_version()}


def start_code_provenance() -> None:
    """Start computing :func:`code_provenance`'s fields in a daemon thread, for the next run of this process."""
    global _started
    future: Future = Future()

    def work() -> None:
        try:
            future.set_result(_compute())
        except BaseException as exc:  # noqa: BLE001 - raised by code_provenance() in the run's thread
            future.set_exception(exc)

    with _lock:
        _started = future
    threading.Thread(target=work, name="aml-ray-provenance", daemon=True).start()


def code_provenance() -> dict[str, Any]:
    """run.json's ``package_version``, ``git_commit``, ``pipeline_code_sha256`` and ``python``.

    The result of :func:`start_code_provenance` when one was started and not yet taken (it is taken once:
    the next call computes anew), else computed now.

    Raises:
        OSError: a source file of the package could not be read.
    """
    global _started
    with _lock:
        started, _started = _started, None
    return started.result() if started is not None else _compute()
