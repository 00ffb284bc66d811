"""When the current command started: ``wall_s`` in run.json measures from here.

The ``aml-ray`` entry marks its start (:func:`mark_start`) before it imports anything else; a library call of
:func:`aml_ray.run.evaluation.evaluate` that no command marked measures from its own call. The start is kept
as a monotonic reading, so a clock step during the run does not change ``wall_s``, and a process that began
as something else (``bash -c 'sleep 30 && aml-ray run ...'`` execs the command into the shell's process,
whose start was 30 s earlier) is not counted from that earlier start.
"""

from __future__ import annotations

import time

_started: float | None = None  # time.monotonic() at the command's start


def mark_start() -> None:
    """Mark now as the command's start (the entry point calls it first)."""
    global _started
    _started = time.monotonic()


def started_at() -> float:
    """The command's start as a ``time.time()`` value (now when no command marked one), derived from the
    monotonic clock: ``time.time() - started_at()`` is the command's elapsed time."""
    if _started is None:
        return time.time()
    return time.time() - (time.monotonic() - _started)
