"""Ctrl-C that cannot leave a lock behind or be lost: SIGINT raises ``KeyboardInterrupt`` only outside
``logging``, imports and finalisers.

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
It defers the same way during an import (:data:`DEFERRED_IN`: a module's import lock can be left held),
at most for the import's time.

It defers the same way inside a finaliser (a ``__del__`` method, a ``weakref`` callback): Python prints
"Exception ignored in ..." and drops what a finaliser raises, so an interrupt landing in Ray's
``ActorHandle.__del__`` (run by the garbage collector at any bytecode) was lost and the run went on to
complete (tests/test_interrupt.py, 1 run in 23).

:func:`deferred` holds Ctrl-C for a whole block, which then raises it at its end: for native code that calls
back into Python, where an interrupt is dropped the same way and leaves the call half done (polars printed
"Exception ignored in: 'DataTypeClass'" and its aggregation then failed with a ``TypeError``: the run ended
with a traceback and exit 1 instead of 130), and for ``ray.shutdown()`` (interrupted, it left Ray's core
worker running and the interpreter's teardown crashed with SIGSEGV).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

#: Seconds between two attempts to deliver a deferred interrupt.
RETRY_S = 0.01

_pending = threading.Event()
#: Blocks of :func:`deferred` the main thread is in, and whether a Ctrl-C came during them.
_held_depth = 0
_held = False


#: Packages inside which an interrupt is deferred: logging (a lock left held), filelock, whose at-fork
#: hook swallowed it ("Exception ignored in ... ensure_current_process", seen in a clean-clone CI run),
#: weakref (``weakref.finalize`` callbacks, whose exceptions are dropped), and importlib: a module's import
#: lock is taken and given back in Python code (``importlib._bootstrap._ModuleLock``, outside any ``try``
#: between its count and its return), so an interrupt there leaves the lock held and any other thread that
#: imports that module waits for ever; the main thread imports while ``ray.init`` runs, beside the head
#: start's thread. The interrupt lands once the import is done.
DEFERRED_IN = ("logging", "filelock", "weakref", "importlib")
#: Functions inside which an interrupt is deferred: finalisers, whose exceptions Python drops.
DEFERRED_FUNCTIONS = ("__del__",)


def deferred_here(frame: FrameType | None) -> bool:
    """Whether ``frame`` or a frame it was called from runs code of a package of :data:`DEFERRED_IN` or a
    function named in :data:`DEFERRED_FUNCTIONS`: an interrupt raised there would leave a lock held or be lost."""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if frame.f_code.co_name in DEFERRED_FUNCTIONS or any(name == p or name.startswith(p + ".")
                                                              for p in DEFERRED_IN):
            return True
        frame = frame.f_back
    return False


def _deliver_later() -> None:
    _pending.clear()
    # a real signal to the main thread: it also ends a blocking call there (a sleep, a wait), as Ctrl-C does
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def on_sigint(signum: int, frame: FrameType | None) -> None:
    """The SIGINT handler: ``KeyboardInterrupt`` now, or a moment later when the main thread is inside logging
    or a finaliser (:func:`deferred_here`).

    Raises:
        KeyboardInterrupt: unless :func:`deferred_here` (then retried after :data:`RETRY_S`).
    """
    global _held
    if _held_depth:
        _held = True
        return
    if deferred_here(frame):
        if not _pending.is_set():  # one retry in flight, however many Ctrl-Cs came
            _pending.set()
            timer = threading.Timer(RETRY_S, _deliver_later)
            timer.daemon = True
            timer.start()
        return
    raise KeyboardInterrupt


@contextmanager
def deferred() -> Iterator[None]:
    """Hold Ctrl-C while the block runs; a Ctrl-C that came during it raises ``KeyboardInterrupt`` at its end.

    For the main thread's calls that must not stop half way (native code calling back into Python, Ray's
    shutdown); blocks nest (the outermost one raises). Has effect only where :func:`install` made
    :func:`on_sigint` the handler, and only in the main thread (the only one a signal interrupts): in
    another thread, or under Python's own handler, the block runs as without it.

    Raises:
        KeyboardInterrupt: at the end of the outermost block, when a Ctrl-C came during it (an exception
            the block raised becomes its ``__context__``, as when a Ctrl-C lands while an error unwinds).
    """
    global _held_depth, _held
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _held_depth += 1
    try:
        yield
    finally:
        _held_depth -= 1
        if _held_depth == 0 and _held:  # as if the Ctrl-C came now (an error under way is its __context__)
            _held = False
            raise KeyboardInterrupt  # noqa: B012 - the held interrupt replaces it, as a Ctrl-C would


def install() -> Any:
    """Make :func:`on_sigint` this process's SIGINT handler; call it from the main thread.

    Returns:
        The handler it replaced (for ``signal.signal`` to restore).

    Raises:
        ValueError: called from another thread than the main one (``signal.signal``'s rule).
    """
    return signal.signal(signal.SIGINT, on_sigint)
