"""Python's cyclic garbage collector, paused while ``aml-ray run`` starts (issue 29, the fixed cost).

Before the pre-flight's first request the command imports about 430 modules and reads the dataset file
(LoCoMo: about 110,000 objects); the collector ran 184 times meanwhile, one full collection of 17-19 ms
among them: 41-44 ms of the 0.40 s before the probe (3 runs, ``gc.callbacks``). None of those objects is
garbage: modules, classes and the samples live for the whole run. So the command's entry
(:mod:`aml_ray.__main__`) pauses the collector for ``run`` (:func:`pause`), and the evaluation resumes it
just before the pipeline starts, once Ray is up (:func:`resume`), freezing what the start made
(``gc.freeze``: those objects leave the collected generations, so the run's own collections do not walk
them again). A process that never paused it (the service, tests, ``evaluate()`` called from Python) is
not touched. The pattern is the one CPython documents for ``gc.freeze``.
"""

from __future__ import annotations

import gc

_paused = False


def pause() -> None:
    """Stop automatic collection until :func:`resume`; nothing when it is off already (someone else's
    choice, which :func:`resume` then leaves alone)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume() -> bool:
    """Freeze every object made so far (``gc.freeze``) and start automatic collection again, if
    :func:`pause` stopped it; else nothing.

    Returns:
        True when it restarted the collector.
    """
    global _paused
    if not _paused:
        return False
    _paused = False
    gc.freeze()
    gc.enable()
    return True
