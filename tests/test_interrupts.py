"""The ``aml-ray`` command's Ctrl-C handler (aml_ray.interrupts): an ordinary ``KeyboardInterrupt``, held
through a :func:`deferred` block, and remembered (:func:`came`) where Python drops it."""

from __future__ import annotations

import signal
import time

import pytest

from aml_ray import interrupts


@pytest.fixture
def ctrl_c_handler():
    previous = interrupts.install()
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_interrupts_at_once_and_is_remembered(ctrl_c_handler):
    t = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
        time.sleep(30)
    assert time.monotonic() - t < 10 and interrupts.came()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped interrupt
def test_a_ctrl_c_python_drops_in_a_finaliser_is_still_remembered(ctrl_c_handler, monkeypatch):
    """Python prints "Exception ignored" and drops what a ``__del__`` raises; :func:`interrupts.came` still
    says the Ctrl-C came, so the command's exit status does (aml_ray.cli.main)."""
    monkeypatch.setattr(interrupts, "_came", False)

    class Finalised:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)

    Finalised()  # dropped at once: its __del__ runs here, and the interrupt it raised is swallowed
    assert interrupts.came()


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
