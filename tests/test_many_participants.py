"""Many participants at once (issue 7, item 4): fair slots, shared client actors, concurrent jobs.

- :class:`aml_ray.actors.fair.FairSlots` directly (no Ray): round-robin order, no starvation, a
  cancelled waiter frees its place or its slot; a plain semaphore, for contrast, starves.
- :mod:`aml_ray.actors.shared` on real Ray actors: one client per version / endpoint identity, the
  secret never in a name, the last lease out kills the actor, a shared participant client holds the
  version's declared capacity across two jobs.
- two jobs of two loopback participants at once through the real pipeline and one loopback model
  server (``scripts/drill_many_participants.py``'s scenario), asserting what the servers observed.
- :class:`aml_ray.serve_app.worker.JobWorker` running N jobs at once.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from pydantic import SecretStr, ValidationError

from aml_ray.actors.fair import FairQueue, FairSlots
from aml_ray.actors.participant import ParticipantClient, ParticipantSpec
from aml_ray.config import ModelEndpoint
from scripts.drill_many_participants import JobPlan, fairness, run_scenario
from scripts.loopback_servers import ServerProcess

# ------------------------------------------------------------------------------------------ fair slots


async def _grant_order(slots: FairSlots, requests: list[str]) -> list[str]:
    """Queue ``requests`` (job names, in that order) behind one held slot; return the order of grants."""
    order: list[str] = []
    await slots.acquire("holder")

    async def one(job: str) -> None:
        async with slots.slot(job):
            order.append(job)
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(one(job)) for job in requests]
    await asyncio.sleep(0)  # every request is queued now
    slots.release()
    await asyncio.gather(*tasks)
    return order


def test_slots_go_round_robin_across_jobs_fifo_within_a_job():
    order = asyncio.run(_grant_order(FairSlots(1), ["a", "a", "a", "b", "b", "c"]))
    assert order == ["a", "b", "c", "a", "b", "a"]


def test_a_small_job_is_not_starved_by_a_big_backlog_unlike_a_plain_semaphore():
    requests = ["big"] * 1000 + ["small"] * 5
    order = asyncio.run(_grant_order(FairSlots(2), requests))
    # the first big request takes the free slot at once; from then on the jobs alternate
    assert [i for i, job in enumerate(order) if job == "small"] == [2, 4, 6, 8, 10]

    async def fifo() -> list[str]:  # what ModelClient did before: one asyncio.Semaphore
        sem, out = asyncio.Semaphore(2), []
        await sem.acquire()
        await sem.acquire()

        async def one(job: str) -> None:
            async with sem:
                out.append(job)
                await asyncio.sleep(0)

        tasks = [asyncio.create_task(one(job)) for job in requests]
        await asyncio.sleep(0)
        sem.release()
        sem.release()
        await asyncio.gather(*tasks)
        return out

    assert [i for i, job in enumerate(asyncio.run(fifo())) if job == "small"] == [1000, 1001, 1002, 1003, 1004]


def test_never_more_than_n_holders_and_no_idle_slot_while_someone_waits():
    async def main() -> tuple[int, list[int]]:
        slots, peak, idle_while_waiting = FairSlots(3), [0], []

        async def one(job: str, i: int) -> None:
            async with slots.slot(job):
                peak[0] = max(peak[0], slots.in_use)
                await asyncio.sleep(0.001 * (i % 3))
            if slots.waiting() and slots.in_use < slots.n:
                idle_while_waiting.append(slots.in_use)

        await asyncio.gather(*(one(f"j{i % 4}", i) for i in range(200)))
        return peak[0], idle_while_waiting

    peak, idle = asyncio.run(main())
    assert peak == 3 and idle == []


def test_cancelling_a_waiter_frees_its_place_and_a_granted_slot():
    async def main() -> dict:
        slots = FairSlots(1)
        await slots.acquire("a")
        queued = asyncio.create_task(slots.acquire("b"))
        await asyncio.sleep(0)
        assert slots.waiting() == {"b": 1}
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        after_queued_cancel = slots.waiting()
        # granted, then cancelled before it ran: the slot must come back
        granted = asyncio.create_task(slots.acquire("c"))
        await asyncio.sleep(0)
        slots.release()  # grants c's future; c has not resumed yet
        granted.cancel()
        with pytest.raises(asyncio.CancelledError):
            await granted
        in_use_after = slots.in_use
        async with slots.slot("d"):  # the slot is usable again at once
            pass
        return {"waiting": after_queued_cancel, "in_use": in_use_after, "final": slots.in_use}

    assert asyncio.run(main()) == {"waiting": {}, "in_use": 0, "final": 0}


def test_fair_queue_takes_by_priority_then_round_robin_and_removes_a_cancelled_item():
    q: FairQueue[str] = FairQueue()
    for job, item, priority in [("a", "s1", 1), ("a", "s2", 1), ("b", "s3", 1), ("a", "add1", 0),
                                ("b", "add2", 0), ("a", "s4", 1)]:
        q.put(job, item, priority)
    assert q.waiting() == {"a": 4, "b": 2} and len(q) == 6
    assert q.remove("a", "s2", 1) and not q.remove("a", "s2", 1)
    assert [q.pop() for _ in range(len(q))] == ["add1", "add2", "s1", "s3", "s4"]
    with pytest.raises(IndexError):
        q.pop()


def test_fair_queue_get_waits_for_an_item_and_a_cancelled_getter_passes_its_wakeup_on():
    async def main() -> list[str]:
        q: FairQueue[str] = FairQueue()
        first = asyncio.create_task(q.get())
        second = asyncio.create_task(q.get())
        await asyncio.sleep(0)
        q.put("a", "x")  # wakes the first getter...
        first.cancel()  # ...which is cancelled before it runs: the second one must get the item
        got = await second
        with pytest.raises(asyncio.CancelledError):
            await first
        q.put("a", "y")
        return [got, await q.get(), str(len(q))]

    assert asyncio.run(main()) == ["x", "y", "0"]


def test_slots_grant_a_more_urgent_request_first():
    async def main() -> list[str]:
        slots, order = FairSlots(1), []
        await slots.acquire("holder")

        async def one(job: str, priority: int) -> None:
            async with slots.slot(job, priority):
                order.append(job)

        tasks = [asyncio.create_task(one(job, p)) for job, p in [("search", 1), ("search", 1), ("add", 0)]]
        await asyncio.sleep(0)
        slots.release()
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(main()) == ["add", "search", "search"]


def test_fair_slots_refuse_nonsense():
    with pytest.raises(ValueError, match="at least 1"):
        FairSlots(0)
    with pytest.raises(RuntimeError, match="without a held slot"):
        FairSlots(1).release()


# -------------------------------------------------------------------- one sample id, two jobs, one client


def test_two_jobs_streaming_the_same_sample_through_one_client_both_finish():
    """Jobs sharing a version's client run the same dataset's samples: one must not cut the other's Adds."""

    def adds(run: str) -> list[dict]:
        uid = f"eval:{run}:synthetic:s1"
        return [{"request_id": f"{uid}:chunk-{i}", "user_id": uid, "session_id": f"{uid}:session_1",
                 "messages": [{"role": "user", "content": f"turn {i}"}]} for i in range(4)]

    async def main(url: str) -> list[int]:
        client = ParticipantClient(ParticipantSpec(add_url=f"{url}/add", search_url=f"{url}/search"))
        try:
            streams = [client.add_stream(adds(run), "s1", token) for run, token in (("r1", "t1"), ("r2", "t2"))]
            got = [[], []]
            for _ in range(4):  # interleaved, as two jobs' ingest stages would be
                for i, stream in enumerate(streams):
                    got[i].append(await anext(stream, None))
            return [sum(1 for o in g if o and o["status"] == "ok") for g in got]
        finally:
            await client.aclose()

    with ServerProcess("participant", "--latency-ms", "1") as server:
        assert asyncio.run(main(server.base_url)) == [4, 4]
        assert server.stats()["n"]["add"] == 8


def test_a_plain_add_call_takes_a_sample_over_from_an_older_stream():
    """add_sample (Ingest's call for a one-Add segment) claims the sample as add_stream does."""

    def adds(n: int, start: int = 0) -> list[dict]:
        uid = "eval:r1:synthetic:s1"
        return [{"request_id": f"{uid}:chunk-{i}", "user_id": uid, "session_id": f"{uid}:session_1",
                 "messages": [{"role": "user", "content": f"turn {i}"}]} for i in range(start, start + n)]

    async def main(url: str) -> tuple[list, list, list]:
        client = ParticipantClient(ParticipantSpec(add_url=f"{url}/add", search_url=f"{url}/search"))
        try:
            old = client.add_stream(adds(4), "s1", "old")  # a stage whose worker died mid-sample
            first = [await anext(old)]
            # the re-executed stage sends the sample's next Add in a plain call: the old stream stops
            taken = await client.add_sample(adds(1, start=1), "s1", "new")
            rest = [o async for o in old]
            return first, taken, rest
        finally:
            await client.aclose()

    with ServerProcess("participant", "--latency-ms", "1") as server:
        first, taken, rest = asyncio.run(main(server.base_url))
        assert [o["request_id"] for o in first + taken] == ["eval:r1:synthetic:s1:chunk-0",
                                                           "eval:r1:synthetic:s1:chunk-1"]
        assert all(o["status"] == "ok" for o in first + taken) and rest == []
        assert server.stats()["n"]["add"] == 2  # chunks 2 and 3 were never sent by the old stream


def test_a_plain_add_call_validates_every_request_before_sending_any():
    async def main(url: str) -> None:
        client = ParticipantClient(ParticipantSpec(add_url=f"{url}/add", search_url=f"{url}/search"))
        good = {"request_id": "r:1", "user_id": "u", "session_id": "u:1", "messages": [{"role": "user", "content": "hi"}]}
        try:
            with pytest.raises(ValidationError, match="messages"):
                await client.add_sample([good, {**good, "request_id": "r:2", "messages": []}], "s1", "t")
        finally:
            await client.aclose()

    with ServerProcess("participant", "--latency-ms", "1") as server:
        asyncio.run(main(server.base_url))
        assert server.stats()["n"].get("add", 0) == 0  # nothing sent


# ---------------------------------------------------------------------------------- shared client actors


def _spec(url: str, secret: str | None = "msk-shared-test-9f8e", **kw) -> ParticipantSpec:
    auth = {"auth": "Bearer", "secret": SecretStr(secret)} if secret else {}
    return ParticipantSpec(add_url=f"{url}/add", search_url=f"{url}/search", **auth, **kw)


def _alive(handle) -> bool:
    import ray

    try:
        ray.get(handle.aclose.remote(), timeout=60)  # a first call may wait for the actor to start
        return True
    except ray.exceptions.RayActorError:
        return False


def test_one_client_per_version_and_per_endpoint_released_by_the_last_job(ray_session):
    import ray

    from aml_ray.actors.shared import NAMESPACE, acquire_model_client, acquire_participant_client, live_leases

    a1 = acquire_participant_client(_spec("http://127.0.0.1:9"), "job-1")
    a2 = acquire_participant_client(_spec("http://127.0.0.1:9"), "job-2")
    other_secret = acquire_participant_client(_spec("http://127.0.0.1:9", "msk-another-key-1a2b"), "job-2")
    other_version = acquire_participant_client(_spec("http://127.0.0.1:9", max_in_flight=7), "job-3")
    endpoint = ModelEndpoint(role="judge", base_url="http://127.0.0.1:9/v1", model="m", api_key=SecretStr("sk-zz-77"))
    m1, m2 = acquire_model_client(endpoint, "job-1"), acquire_model_client(endpoint, "job-2")
    answer = acquire_model_client(ModelEndpoint(role="answer", base_url="http://127.0.0.1:9/v1", model="m"), "job-1")
    try:
        assert a1.name == a2.name and a1.handle._actor_id == a2.handle._actor_id
        assert len({a1.name, other_secret.name, other_version.name}) == 3
        assert a1.name.split("-")[2] == other_secret.name.split("-")[2]  # same non-secret key, another actor
        assert m1.name == m2.name and m1.name != answer.name
        names = list(live_leases())
        assert not any(s in n for n in names for s in ("msk-", "sk-zz", "another-key"))
        assert ray.get_actor(a1.name, namespace=NAMESPACE)._actor_id == a1.handle._actor_id  # named, on the cluster
        assert live_leases()[a1.name] == {"job-1": 1, "job-2": 1}
        assert a1.release() is False and _alive(a2.handle)  # job-2 still holds it
        assert a1.release() is False  # a second release is a no-op
        assert a2.release() is True
        deadline = time.monotonic() + 60  # the actor is killed asynchronously
        while _alive(a2.handle) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(a2.handle)
        again = acquire_participant_client(_spec("http://127.0.0.1:9"), "job-4")
        assert again.name != a1.name  # a fresh generation, never the dying actor's name
        again.release()
    finally:
        for lease in (a1, a2, other_secret, other_version, m1, m2, answer):
            lease.release()
    assert not set(live_leases()) & {lease.name for lease in (a1, other_secret, other_version, m1, answer)}


def test_two_jobs_of_one_version_share_its_declared_capacity(ray_session):
    """Both jobs' Searches go through one client: the server never sees more than the declared 4."""
    import ray

    from aml_ray.actors.shared import acquire_participant_client

    with ServerProcess("participant", "--latency-ms", "30", "--capacity", "4") as server:
        spec = ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search", max_in_flight=4)
        leases = [acquire_participant_client(spec, job) for job in ("job-a", "job-b")]
        try:
            batches = [[{"ref": f"{job}-{i}", "request": {"query": "q", "user_id": f"eval:{job}:d:s", "top_k": 5}}
                        for i in range(40)] for job in ("a", "b")]
            out = ray.get([lease.handle.search_batch.remote(b) for lease, b in zip(leases, batches)], timeout=60)
        finally:
            for lease in leases:
                lease.release()
        stats = server.stats()
    assert [sum(o["status"] == "ok" for o in batch) for batch in out] == [40, 40]
    assert stats["n"]["search"] == 80 and stats["max_in_flight"] == 4 and stats["over_capacity"] == 0


# ------------------------------------------------------------------------------ two jobs through the pipeline


def test_two_participants_two_jobs_at_once_each_held_to_its_limits_and_fair_on_the_model(ray_session, tmp_path):
    big = JobPlan("big", samples=8, questions=20, latency_ms=20, max_in_flight=8)
    small = JobPlan("small", samples=1, questions=20, latency_ms=60, max_in_flight=3)
    fig = run_scenario(big, small, model_latency_ms=30, model_max_in_flight=2, big_queued=24, out_dir=tmp_path)

    # every question of both jobs scored
    assert {n: (j["scored"], j["questions"]) for n, j in fig["jobs"].items()} == {"big": (160, 160), "small": (20, 20)}
    # each participant held to its own declared capacity; the fast one reached its own (not throttled by the other)
    p = fig["participants"]
    assert p["big"]["max_in_flight"] == 8 and p["small"]["max_in_flight"] == 3
    assert p["big"]["over_capacity"] == 0 and p["small"]["over_capacity"] == 0
    assert (p["big"]["searches"], p["small"]["searches"]) == (160, 20)
    # one shared client per model endpoint (answer, judge), held by both jobs; one participant client each
    holders = {name.split("-")[1]: [] for name in fig["shared"]}
    for name, jobs in fig["shared"].items():
        holders[name.split("-")[1]].append(sorted(j.split("-")[0] for j in jobs))
    assert sorted(holders["model"]) == [["big", "small"], ["big", "small"]]
    assert sorted(holders["participant"]) == [["big"], ["small"]]
    assert fig["leases_after"] == {}
    # the model endpoint never served more than its declared in-flight, per role, across both jobs
    m = fig["model"]
    assert m["max_in_flight_by_kind"] == {"answer": 2, "judge": 2}
    assert sum(c[2] == "answer" for c in m["calls"]) == 180 and sum(c[2] == "judge" for c in m["calls"]) == 180
    # fairness: the small job's requests queued behind a backlog of the big job's...
    assert m["waiting_at_release"]["big"] >= 24 and m["waiting_at_release"]["small"] == 20
    f = fairness(m["calls"], "small", "answer", m["released_at"])
    # ...got turns at once (a first-come queue: the whole backlog first) and interleaved with the big job's
    # (a first-come queue: all 20 in one run)
    assert f["other_calls_before"] <= 2, f
    assert f["longest_small_run"] <= 3 and f["small_share_in_window"] >= 0.35, f
    # and the small job was done well before the big one: its answers while most of the big job's were to come
    assert f["other_calls_after"] >= 0.5 * 160, f
    done = {n: max(c[1] for c in m["calls"] if c[3] == n) for n in ("big", "small")}
    assert done["small"] < done["big"], done


# ------------------------------------------------------------------------------------- the service worker


def test_dispatcher_runs_n_jobs_at_once_and_claims_each_job_once(monkeypatch, tmp_path):
    """A replica's dispatcher starts at most ``max_concurrent_jobs`` job actors; the next job is claimed when one
    ends (the actors are stood in for by object refs the test finishes)."""
    import ray

    from aml_ray.serve_app.dispatch import JobDispatcher
    from aml_ray.store import make_engine, session_factory, upgrade
    from tests.test_service_jobs import _queued_jobs

    engine = make_engine(f"sqlite:///{tmp_path / 'q.sqlite3'}")
    upgrade(engine)
    sessions = session_factory(engine)
    ids = _queued_jobs(sessions, 3)
    service = SimpleNamespace(settings=SimpleNamespace(max_concurrent_jobs=2, lease_s=60.0, max_attempts=3,
                                                       purge_interval_s=None, standby_job_actor=False),
                              sessions=sessions)
    finished: set[str] = set()
    monkeypatch.setattr(JobDispatcher, "_launch", lambda self, job_id, attempt, owner: job_id)
    monkeypatch.setattr(ray, "wait", lambda refs, num_returns, timeout: ([r for r in refs if r in finished], []))
    monkeypatch.setattr("aml_ray.serve_app.dispatch._log_end", lambda job_id, ref: None)
    d = JobDispatcher(service)
    assert d.turn() == ids[:2] and d.running_jobs() == set(ids[:2])  # two at once, the third waits
    assert d.turn() == []
    finished.add(ids[0])
    assert d.turn() == [ids[2]] and d.running_jobs() == {ids[1], ids[2]}
    assert d.claimed == ids  # each job claimed once
    engine.dispose()


def test_max_concurrent_jobs_setting():
    from aml_ray.serve_app.settings import ServiceSettings

    base = {"AML_MASTER_KEYS": "x" * 43 + "=", "AML_DATABASE_URL": "sqlite:///:memory:"}
    assert ServiceSettings.from_env(base).max_concurrent_jobs == 2
    assert ServiceSettings.from_env({**base, "AML_MAX_CONCURRENT_JOBS": "5"}).max_concurrent_jobs == 5
    with pytest.raises(ValueError, match="AML_MAX_CONCURRENT_JOBS"):
        ServiceSettings.from_env({**base, "AML_MAX_CONCURRENT_JOBS": "0"})
    assert ServiceSettings.from_env(base).standby_job_actor is True
    assert ServiceSettings.from_env({**base, "AML_STANDBY_JOB_ACTOR": "0"}).standby_job_actor is False
