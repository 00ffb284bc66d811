"""The run's progress tracker's handover signals (aml_ray.run.progress.ProgressTracker; issue 29).

Plain Python: the tracker's methods run in this process, as the single-stage Ingest actor runs them.
"""

from __future__ import annotations

import asyncio

from aml_ray.run.progress import ProgressTracker

#: A guard on each wait the tracker must end at once: generous, so a loaded machine never fails it.
WAIT_S = 30


async def test_each_sample_is_taken_over_once_the_head_start_has_no_add_of_it_out():
    """``release(keep)`` lets every sample but ``keep`` go on in the Ingest stage; each later call replaces the
    kept set; ``release()`` lets all go, and ``take_over`` then says no later call needs to ask."""
    tracker = ProgressTracker(head_start=True)
    a, b = (asyncio.ensure_future(tracker.take_over(s)) for s in ("A", "B"))
    await asyncio.sleep(0.05)
    assert not a.done() and not b.done()
    assert await asyncio.wait_for(tracker.wait_wanted(), WAIT_S) is None  # the driver sees it asked
    tracker.release(["A", "B"])  # both still have an Add out at the head start
    await asyncio.sleep(0.05)
    assert not a.done() and not b.done()
    tracker.release(["B"])  # A's last Add returned
    assert await asyncio.wait_for(a, WAIT_S) is False  # A goes on; the head start has not ended
    await asyncio.sleep(0.05)
    assert not b.done()
    tracker.release()  # the head start ended
    assert await asyncio.wait_for(b, WAIT_S) is True
    assert await tracker.take_over("C") is True  # at once, from now on


async def test_without_a_head_start_a_sample_is_taken_over_at_once():
    tracker = ProgressTracker()
    assert await asyncio.wait_for(tracker.take_over("A"), WAIT_S) is True
