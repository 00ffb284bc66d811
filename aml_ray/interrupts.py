"""Ctrl-C that cannot leave a lock behind: SIGINT raises ``KeyboardInterrupt`` only outside ``logging``.

Python's default SIGINT handler raises ``KeyboardInterrupt`` in the main thread at whatever bytecode runs
when the signal arrives. Inside :mod:`logging` that can be between taking a lock and the ``try`` that frees
it (``_acquireLock()`` then ``try:``, or in ``_releaseLock`` itself): the main thread leaves holding
logging's module lock, and the next thread that logs (the head start's HTTP client, Ray's threads) waits on
it for ever, while the main thread waits for that thread. CI saw exactly this: ``aml-ray run`` interrupted
during its head start printed a ``KeyboardInterrupt`` raised in ``logging._releaseLock`` and hung until the
test's 90 s guard (tests/test_interrupt.py).

:func:`install` replaces the handler with one that defers the interrupt while any frame of the main thread's
stack belongs to :mod:`logging`: it sends SIGINT to the main thread again shortly, and the interrupt lands
once the logging call has returned. A logging call takes microseconds, so Ctrl-C still ends the command at
once; everywhere else (waits on events, threads, sockets, Ray) it behaves as Python's default handler.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

#: Seconds between two attempts to deliver a deferred interrupt.
RETRY_S = 0.01

_pending = threading.Event()


#: Packages inside which an interrupt is deferred: logging (a lock left held) and filelock, whose at-fork
#: hook swallowed it ("Exception ignored in ... ensure_current_process", seen in a clean-clone CI run).
DEFERRED_IN = ("logging", "filelock")


def in_logging(frame: FrameType | None) -> bool:
    """Whether ``frame`` or a frame it was called from runs code of a package of :data:`DEFERRED_IN`."""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if any(name == p or name.startswith(p + ".") for p in DEFERRED_IN):
            return True
        frame = frame.f_back
    return False


def _deliver_later() -> None:
    _pending.clear()
    # a real signal to the main thread: it also ends a blocking call there (a sleep, a wait), as Ctrl-C does
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def on_sigint(signum: int, frame: FrameType | None) -> None:
    """The SIGINT handler: ``KeyboardInterrupt`` now, or a moment later when the main thread is inside logging.

    Raises:
        KeyboardInterrupt: unless ``frame`` is inside :mod:`logging` (then retried after :data:`RETRY_S`).
    """
    if in_logging(frame):
        if not _pending.is_set():  # one retry in flight, however many Ctrl-Cs came
            _pending.set()
            timer = threading.Timer(RETRY_S, _deliver_later)
            timer.daemon = True
            timer.start()
        return
    raise KeyboardInterrupt


def install() -> Any:
    """Make :func:`on_sigint` this process's SIGINT handler; call it from the main thread.

    Returns:
        The handler it replaced (for ``signal.signal`` to restore).

    Raises:
        ValueError: called from another thread than the main one (``signal.signal``'s rule).
    """
    return signal.signal(signal.SIGINT, on_sigint)
