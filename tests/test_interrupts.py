"""Ctrl-C outside logging only (aml_ray.interrupts): an interrupt raised inside a logging call left logging's
lock held, and ``aml-ray run`` interrupted during its head start hung (CI, tests/test_interrupt.py)."""

from __future__ import annotations

import logging
import signal
import time

import pytest

from aml_ray import interrupts


class _CtrlCWhileEmitting(logging.Handler):
    """A handler that receives SIGINT in the middle of its ``emit``, with logging's handler lock held."""

    def __init__(self) -> None:
        super().__init__()
        self.finished = 0

    def emit(self, record: logging.LogRecord) -> None:
        signal.raise_signal(signal.SIGINT)
        for _ in range(1000):  # the interpreter checks for signals between bytecodes: here, with the lock held
            pass
        self.finished += 1


@pytest.fixture
def ctrl_c_handler():
    previous = interrupts.install()
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_inside_a_logging_call_lands_after_it(ctrl_c_handler):
    handler = _CtrlCWhileEmitting()
    log = logging.getLogger("aml_ray.test_interrupts")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("one record")  # Python's own handler raised KeyboardInterrupt inside emit
        assert handler.finished == 1
        assert not handler.lock._is_owned()  # the handler's lock was released
        t = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            time.sleep(5)
        assert time.monotonic() - t < 1.0  # delivered a moment after the logging call, not lost
    finally:
        log.removeHandler(handler)


def test_ctrl_c_inside_an_import_lands_after_it(ctrl_c_handler, tmp_path, monkeypatch):
    """An import takes and gives back its module's lock in Python code (``importlib._bootstrap``): an interrupt
    landing there can leave the lock held, and every other thread importing that module then waits for ever
    (the main thread imports during ``ray.init``, beside the head start's thread). The module's code receives
    SIGINT; the import completes, the module is in ``sys.modules``, and the interrupt comes right after."""
    import sys

    (tmp_path / "aml_ray_ctrl_c_module.py").write_text(
        "import signal\nsignal.raise_signal(signal.SIGINT)\nfor _ in range(1000):\n    pass\nFINISHED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import aml_ray_ctrl_c_module  # Python's own handler raised KeyboardInterrupt inside its code

        assert aml_ray_ctrl_c_module.FINISHED and "aml_ray_ctrl_c_module" in sys.modules
        t = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            time.sleep(5)
        assert time.monotonic() - t < 1.0
    finally:
        sys.modules.pop("aml_ray_ctrl_c_module", None)


class _CtrlCWhileFinalised:
    """An object that receives SIGINT while its ``__del__`` runs, as Ray's ``ActorHandle.__del__`` did."""

    finished = 0

    def __del__(self) -> None:
        signal.raise_signal(signal.SIGINT)
        for _ in range(1000):
            pass
        type(self).finished += 1


def test_ctrl_c_inside_a_finaliser_lands_after_it_instead_of_being_swallowed(ctrl_c_handler, capsys):
    """Python prints "Exception ignored in ... __del__" and drops an exception a finaliser raises: a Ctrl-C
    that landed in Ray's ``ActorHandle.__del__`` was lost and ``aml-ray run`` went on to complete (exit 0
    instead of 130, tests/test_interrupt.py, 1 run in 23)."""
    obj = _CtrlCWhileFinalised()
    del obj  # the finaliser runs here, with the interrupt raised inside it
    assert _CtrlCWhileFinalised.finished == 1
    t = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        time.sleep(5)
    assert time.monotonic() - t < 1.0
    assert "Exception ignored" not in capsys.readouterr().err


def test_ctrl_c_elsewhere_interrupts_at_once(ctrl_c_handler):
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
        time.sleep(5)


def test_deferred_here_looks_at_the_whole_stack():
    seen = []

    class Probe(logging.Handler):
        def emit(self, record):
            import sys
            seen.append(interrupts.deferred_here(sys._getframe()))

    log = logging.getLogger("aml_ray.test_interrupts.probe")
    log.addHandler(Probe())
    log.propagate = False
    log.warning("x")
    import sys
    assert seen == [True] and interrupts.deferred_here(sys._getframe()) is False


def test_a_deferred_block_holds_ctrl_c_to_its_end(ctrl_c_handler):
    """A Ctrl-C inside a :func:`interrupts.deferred` block lets the block finish, then raises; nested blocks
    raise at the outermost end; without a Ctrl-C nothing is raised."""
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.deferred():
            with interrupts.deferred():
                signal.raise_signal(signal.SIGINT)
                time.sleep(0.05)
                done.append("inner")
            done.append("outer")
    assert done == ["inner", "outer"]
    with interrupts.deferred():
        done.append("quiet")
    assert done[-1] == "quiet"
    with pytest.raises(KeyboardInterrupt) as caught:
        with interrupts.deferred():
            signal.raise_signal(signal.SIGINT)
            raise ValueError("the block's own error")
    assert isinstance(caught.value.__context__, ValueError)
