"""Ctrl-C for the ``aml-ray`` command: an ordinary ``KeyboardInterrupt``, held only through blocks that must
not stop half way, and remembered so the command's exit status says it came.

:func:`install` makes :func:`on_sigint` the SIGINT handler (``signal.signal``). Outside a :func:`deferred`
block it raises ``KeyboardInterrupt`` as Python's default handler does; ``aml-ray run`` catches it, marks
``run.json`` ``interrupted`` (:func:`aml_ray.run.evaluation.mark_interrupted`) and exits with 130.

:func:`deferred` holds Ctrl-C for a whole block, which then raises it at its end: for native code that calls
back into Python, where Python drops an exception raised in the callback and the call is left half done
(polars printed "Exception ignored in: 'DataTypeClass'" and its aggregation then failed with a
``TypeError``), and for ``ray.shutdown()`` (interrupted, it left Ray's core worker running and the
interpreter's teardown crashed).

Python also drops an interrupt raised inside a finaliser (a ``__del__`` method run by the garbage
collector); :func:`came` still says a Ctrl-C came, and :func:`aml_ray.cli.main` ends the command with 130
then, whatever its command returned.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

#: Exit status of a command a Ctrl-C reached (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130

#: Blocks of :func:`deferred` the main thread is in, and whether a Ctrl-C came during them.
_held_depth = 0
_held = False
#: Whether a Ctrl-C reached this process since :func:`install` (:func:`came`).
_came = False


def on_sigint(signum: int, frame: FrameType | None) -> None:
    """The SIGINT handler: ``KeyboardInterrupt`` now, or at the end of the :func:`deferred` block under way.

    Raises:
        KeyboardInterrupt: unless inside a :func:`deferred` block.
    """
    global _held, _came
    _came = True
    if _held_depth:
        _held = True
        return
    raise KeyboardInterrupt


def came() -> bool:
    """Whether a Ctrl-C reached this process since :func:`install`, also one Python dropped."""
    return _came


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
