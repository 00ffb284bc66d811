"""The cluster's progress hub (:mod:`aml_ray.actors.progress_hub`): every job's tracker in one actor, its
waits held by no thread, and shared through the client registry."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from aml_ray.actors.progress_hub import ProgressHub, TrackerOnHub


def test_each_jobs_counts_are_its_own_and_a_dropped_job_is_forgotten():
    async def main():
        hub = ProgressHub()
        await hub.call("a", False, "incr", "answer", 3)
        await hub.call("b", False, "incr", "answer", 5)
        await hub.call("a", False, "set_done", "add", "s1", 7)
        await hub.call("b", False, "record_failure", {"kind": "contract", "summary": "bad"})
        counts = await hub.call("a", False, "snapshot"), await hub.call("b", False, "snapshot")
        failures = await hub.call("a", False, "failure"), await hub.call("b", False, "failure")
        hub.drop("a")
        late = await hub.call("a", False, "incr", "answer", 1), await hub.call("a", False, "snapshot")
        return counts, failures, late, hub.jobs()

    counts, failures, late, jobs = asyncio.run(main())
    assert counts == ({"answer": 3, "add": 7}, {"answer": 5})
    assert failures == (None, {"kind": "contract", "summary": "bad"})
    assert late == (None, None) and jobs == ["b"]


def test_many_take_overs_wait_without_holding_a_thread():
    """Forty samples of a job with a head start ask to take over before its driver asks whether they want to;
    with one thread in the loop's executor (a blocking wait per call would hold it), the driver's
    ``wait_wanted`` still returns, and its releases let every sample go on: the kept one last."""
    async def main():
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        hub = ProgressHub()
        gone_on: list[str] = []

        async def sample(name: str) -> None:
            ended = await hub.call("job", True, "take_over", name)
            gone_on.append(f"{name} {ended}")

        samples = [asyncio.create_task(sample(f"s{i}")) for i in range(40)]
        await asyncio.sleep(0.05)
        await asyncio.wait_for(hub.call("job", True, "wait_wanted"), 5)
        assert gone_on == []
        await hub.call("job", True, "release", ["s7"])  # every sample but s7 goes on
        await asyncio.sleep(0.1)
        waiting_for_s7 = list(gone_on)
        await hub.call("job", True, "release")  # the head start ended
        await asyncio.wait_for(asyncio.gather(*samples), 5)
        return waiting_for_s7, gone_on

    before, after = asyncio.run(main())
    assert sorted(before) == sorted(f"s{i} False" for i in range(40) if i != 7)
    assert after[-1] == "s7 True" and len(after) == 40


def test_the_hub_remembers_a_bounded_number_of_dropped_jobs(monkeypatch):
    """A hub that lives as long as the cluster sees thousands of jobs end: it keeps the last DROPPED_KEPT keys."""
    from aml_ray.actors import progress_hub

    monkeypatch.setattr(progress_hub, "DROPPED_KEPT", 3)
    hub = ProgressHub()
    for i in range(5):
        asyncio.run(hub.call(f"job{i}", False, "incr", "add", 1))
        hub.drop(f"job{i}")
    assert list(hub._dropped) == ["job2", "job3", "job4"] and hub.jobs() == []
    assert asyncio.run(hub.call("job4", False, "snapshot")) is None  # still remembered: ignored


def test_a_wait_ends_when_its_job_is_dropped():
    async def main():
        hub = ProgressHub()
        waiting = asyncio.create_task(hub.call("job", True, "wait_wanted"))
        taking = asyncio.create_task(hub.call("job", True, "take_over", "s1"))
        await asyncio.sleep(0.05)
        hub.drop("job")
        return await asyncio.wait_for(asyncio.gather(waiting, taking), 5)

    assert asyncio.run(main()) == [None, None]


@pytest.mark.usefixtures("ray_session")
def test_jobs_share_one_hub_through_the_registry():
    """Two jobs' leases get the same hub actor, whose trackers keep each job's counts apart; their releases
    end their leases. (The last lease out closes it, as it does a client: the registry's own tests.)"""
    import ray

    from aml_ray.actors.shared import acquire_progress_hub, live_leases

    first, second = acquire_progress_hub("job-a"), acquire_progress_hub("job-b")
    try:
        assert first.name == second.name and first.name.startswith("aml-progress-hub-")
        a, b = TrackerOnHub(first.handle, "key-a"), TrackerOnHub(second.handle, "key-b", head_start=True)
        ray.get([a.incr.remote("judge", 8), b.update.remote({"search": 2}, {("add", "s1"): 4})])
        assert ray.get([a.snapshot.remote(), b.snapshot.remote()], timeout=30) == [{"judge": 8},
                                                                                    {"search": 2, "add": 4}]
        assert ray.get([a.ended.remote(), b.ended.remote()], timeout=30) == [True, False]  # b has a head start
        held = live_leases()[first.name]
        assert held["job-a"] == held["job-b"] == 1, held
    finally:
        first.release()
        second.release()
    left = live_leases().get(first.name, {})
    assert "job-a" not in left and "job-b" not in left, left
