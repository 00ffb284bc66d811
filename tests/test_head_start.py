"""The head start: on a cluster of its own, the driver sends the first Adds while the pipeline's actors start,
and hands over to the Ingest stage without a duplicate (aml_ray.run.head_start).

Against real loopback participants: scripts/loopback_servers.py in its own process (it counts the
requests it served and the most it held at once), and small FastAPI apps in a thread for the failing
ones. The runs use the session's Ray as if the run had started it (:func:`own_cluster`); in the first test
the pipeline starts only once Adds have been journalled, which no Add from the Ingest actor can do.
"""

from __future__ import annotations

import json
import time

import polars as pl
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

import aml_ray.run.evaluation as evaluation
from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import model_endpoint_from_env
from aml_ray.datasets.registry import get_dataset
from aml_ray.ids import IdScheme
from aml_ray.retry import RetryPolicy
from aml_ray.run.evaluation import EvaluationConfig, evaluate
from aml_ray.run.evidence import AddJournal, RunDir, read_adds
from aml_ray.run.inputs import build_inputs
from scripts.loopback_servers import ServerProcess
from tests.servers import ThreadServer

OFFLINE = {"answer": model_endpoint_from_env("answer", {}), "judge": model_endpoint_from_env("judge", {})}
#: Only a guard against a hang (never reached when the head start works).
GUARD_S = 20


def own_cluster(monkeypatch, before_pipeline=None) -> None:
    """Let :func:`evaluate` treat the session's Ray as a cluster it started (the head start's case, as on a
    command line's own cluster) without shutting it down; ``before_pipeline()`` runs before the pipeline
    starts (a slow actor start)."""
    import aml_ray.run.pipeline as pipeline

    monkeypatch.setattr(evaluation, "init_ray", lambda **kw: True)
    monkeypatch.setattr(evaluation, "started_here", lambda: True)
    monkeypatch.setattr(evaluation, "shutdown_ray", lambda: [])
    if before_pipeline is not None:
        original = pipeline.run_pipeline

        def slow_start(*args, **kw):
            before_pipeline()
            return original(*args, **kw)

        monkeypatch.setattr(pipeline, "run_pipeline", slow_start)


def journalled(run_dir: RunDir) -> int:
    """Add journal lines written so far, over every sample."""
    return sum(len(p.read_text().splitlines()) for p in run_dir.adds.glob("*.jsonl")) if run_dir.adds.exists() else 0


@pytest.mark.usefixtures("ray_session")
def test_the_first_adds_go_while_the_pipeline_starts_and_no_add_is_sent_twice(tmp_path, locomo_file, monkeypatch):
    """Adds are journalled before the pipeline starts; then every chunk's Add reached the participant once
    (the server's count is the chunks plus the pre-flight probe) and never more than the declared 2 at once."""
    run_dir = RunDir(tmp_path / "run")
    seen: dict[str, int] = {}

    def slow_pipeline_start():
        deadline = time.monotonic() + GUARD_S
        while journalled(run_dir) < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        seen["adds journalled before the pipeline started"] = journalled(run_dir)

    own_cluster(monkeypatch, slow_pipeline_start)
    with ServerProcess("participant", "--latency-ms", "5", "--add-latency-ms", "120", "--capacity", "64") as server:
        spec = ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search",
                               max_in_flight=2, adaptive_concurrency=False)
        result = evaluate(EvaluationConfig(dataset="locomo", participant=spec, out_dir=run_dir.root,
                                           data_path=locomo_file, limit_samples=2, **OFFLINE))
        stats = server.stats()
    info = result.run_info
    assert seen["adds journalled before the pipeline started"] >= 5
    assert info["status"] == "completed", info.get("error")
    chunks = info["dataset"]["chunks"]
    assert stats["n"]["add"] == chunks + 1  # each chunk once, and the pre-flight's probe
    assert stats["max_in_flight"] <= 2  # one client at a time held the declared limit
    head = info["head_start"]
    assert head["adds"] >= 5 and head["failed"] == 0 and head["ended"] in ("handover", "done")
    adds = read_adds(run_dir)
    assert adds.height == chunks and adds.select("sample_id", "chunk_index").n_unique() == chunks
    assert (adds["status"] == "ok").all()


def _head_start(**kw):
    from aml_ray.run.head_start import HeadStart  # here: the first test also runs on a tree without it

    return HeadStart(**kw)


def _inputs(tmp_path, locomo_file, **kw):
    spec = get_dataset("locomo")
    samples = spec.load(locomo_file)[:2]
    return build_inputs(samples, IdScheme("headstart", "locomo"), out_dir=tmp_path / "run" / "inputs", **kw)


def _wait_for(predicate, guard_s: float = GUARD_S) -> None:
    deadline = time.monotonic() + guard_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_stop_waits_for_the_adds_in_flight_and_journals_each_once_in_order(tmp_path, locomo_file):
    """Stopped mid-way: every Add the participant received is journalled (none in flight is lost or left to
    be sent again), each sample's journal holds its first chunks in order, and nothing is sent after stop()."""
    run_dir = RunDir(tmp_path / "run")
    inputs = _inputs(tmp_path, locomo_file)
    with ServerProcess("participant", "--latency-ms", "5", "--add-latency-ms", "150", "--capacity", "64") as server:
        spec = ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search",
                               max_in_flight=4, adaptive_concurrency=False)
        head = _head_start(samples_at_once=2).start(spec, inputs, run_dir)
        _wait_for(lambda: journalled(run_dir) >= 3)
        head.stop()
        received = server.stats()["n"]["add"]
        time.sleep(0.5)  # longer than an Add: one sent after stop() would have arrived
        assert server.stats()["n"]["add"] == received
    rows = {sid: AddJournal(run_dir, sid).rows() for sid in (p.stem for p in run_dir.adds.glob("*.jsonl"))}
    assert sum(len(r) for r in rows.values()) == received == head.sent
    for sid, sample_rows in rows.items():
        assert [r["chunk_index"] for r in sample_rows] == list(range(len(sample_rows))), sid
        assert all(r["status"] == "ok" and r["attempts"] == 1 for r in sample_rows)
    assert head.describe()["ended"] == "handover" and head.describe()["stop_wait_s"] is not None
    assert received < inputs.n_chunks  # stopped mid-way, not after everything


def test_streaming_a_sample_is_added_only_up_to_its_first_step(tmp_path, locomo_file):
    """A Streaming step's Searches must see exactly the sessions before it: the head start sends no Add
    past a sample's first step, and ends by itself (``done``)."""
    run_dir = RunDir(tmp_path / "run")
    inputs = _inputs(tmp_path, locomo_file, stream_checkpoints=[0.5])
    with ServerProcess("participant", "--latency-ms", "1", "--add-latency-ms", "1", "--capacity", "64") as server:
        spec = ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search")
        head = _head_start().start(spec, inputs, run_dir)
        _wait_for(lambda: head.ran_s is not None)
        head.stop()
    assert head.ended == "done"
    expected = 0
    for i in range(inputs.n_samples):
        row = inputs.sample_row(i)
        meta = json.loads(row["add_meta_json"])
        first_step = min(q["step"] for q in row["questions"] if q["step"] is not None)
        before = [m["chunk_index"] for m in meta if m["session_index"] <= first_step]
        assert 0 < len(before) < len(meta)
        assert [r["chunk_index"] for r in AddJournal(run_dir, row["sample_id"]).rows()] == before
        expected += len(before)
    assert head.sent == expected


def _failing_participant(add_reply) -> FastAPI:
    app = FastAPI()
    calls: list[str] = []
    app.state.calls = calls

    @app.post("/add")
    async def add(request: Request):
        body = await request.json()
        calls.append(body["request_id"])
        return add_reply(body)

    return app


@pytest.mark.parametrize("case", ["503", "contract"])
def test_the_head_start_stops_at_the_first_add_that_did_not_succeed(tmp_path, locomo_file, case):
    """A failed Add (retries exhausted) is journalled as evidence and ends the head start; an Add whose reply
    broke the contract is not journalled (the Ingest stage sends it again and stops the run with its
    evidence), and the head start ends naming the error."""
    run_dir = RunDir(tmp_path / "run")
    inputs = _inputs(tmp_path, locomo_file)
    if case == "503":
        app = _failing_participant(lambda body: JSONResponse({"error": "busy"}, status_code=503))
    else:
        app = _failing_participant(lambda body: JSONResponse({"success": True, "request_id": "not-" + body["request_id"],
                                                              "user_id": body["user_id"], "session_id": body["session_id"]}))
    with ThreadServer(app) as server:
        spec = ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search",
                               max_in_flight=1, retry=RetryPolicy(max_attempts=1))
        head = _head_start(samples_at_once=1).start(spec, inputs, run_dir)
        _wait_for(lambda: head.ran_s is not None)
        head.stop()
    assert len(app.state.calls) == 1  # it stopped at the first
    journal = pl.DataFrame([r for p in run_dir.adds.glob("*.jsonl") for r in AddJournal(run_dir, p.stem).rows()])
    if case == "503":
        assert journal.height == 1 and journal["status"][0] == "error" and journal["http_status"][0] == 503
        assert head.failed == 1 and head.ended.startswith("an Add failed")
    else:
        assert journal.height == 0 and head.sent == 0
        assert head.ended.startswith("ContractError") and "request_id" in head.ended


@pytest.mark.usefixtures("ray_session")
def test_the_failure_budget_counts_the_adds_the_head_start_sent(tmp_path, locomo_file, monkeypatch):
    """The budget is the run's: the head start's Adds (3 ok, then the first failed one, journalled) count
    with the Ingest stage's, so the run stops at 5 failed of 8, not "5 of 5" as if the first 3 had not
    been sent; the progress counts the head start's failed Add too."""
    from aml_ray.run.pipeline import StageFailed
    from tests.dying_participants import FAST_RETRY, FailingParticipant

    own_cluster(monkeypatch)
    snapshots: list[dict] = []
    with FailingParticipant(die_after_adds=3) as dying:
        spec = ParticipantSpec(add_url=f"{dying.base_url}/add", search_url=f"{dying.base_url}/search",
                               max_in_flight=1, retry=FAST_RETRY)
        with pytest.raises(StageFailed) as stopped:
            evaluate(EvaluationConfig(dataset="locomo", participant=spec, out_dir=tmp_path / "run",
                                      data_path=locomo_file, limit_samples=1, **OFFLINE),
                     on_progress=lambda kind, values: snapshots.append(values) if kind == "done" else None)
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["head_start"]["adds"] == 4 and info["head_start"]["failed"] == 1
    assert stopped.value.summary.startswith("failure budget exceeded: 5 of 8 Adds failed after retries")
    assert snapshots[-1]["add"] == 8 and snapshots[-1]["add_failed"] == 5


def _holding_participant(hold_user: str, hold_at: int, handed_over, seen: dict, guard_s: float) -> FastAPI:
    """A participant that holds the ``hold_at``-th Add of ``hold_user``'s sample until an Add of another sample
    arrives after the head start was handed over (``handed_over``), or ``guard_s`` passed; every Add takes
    0.15 s (a steady latency: the client's adaptive limit stays above 1). ``seen`` gets the peak in flight, and
    whether another sample was added during the hold."""
    import asyncio
    import threading

    app = FastAPI()
    held, go = threading.Event(), threading.Event()
    counts = {"held user": 0, "in flight": 0}
    seen.update({"peak in flight": 0, "another sample added after the handover while one Add was held": False})
    app.state.held = held

    @app.post("/add")
    async def add(request: Request):
        body = await request.json()
        counts["in flight"] += 1
        seen["peak in flight"] = max(seen["peak in flight"], counts["in flight"])
        try:
            if body["user_id"].endswith(hold_user) and not go.is_set():
                counts["held user"] += 1
                if counts["held user"] == hold_at:
                    held.set()
                    await asyncio.to_thread(go.wait, guard_s)
                    go.set()  # the hold is over (by the guard, when no other Add came): later ones do not count
            elif not body["user_id"].endswith(":preflight") and handed_over.is_set() and held.is_set() \
                    and not go.is_set():
                seen["another sample added after the handover while one Add was held"] = True
                go.set()
            await asyncio.sleep(0.15)  # the other sample's Adds outlast the pipeline's start: it is mid-way then
            return {"success": True, "request_id": body["request_id"], "user_id": body["user_id"],
                    "session_id": body["session_id"]}
        finally:
            counts["in flight"] -= 1

    @app.post("/search")
    async def search(request: Request):
        return {"data": []}

    return app


@pytest.mark.usefixtures("ray_session")
def test_the_ingest_stage_takes_a_sample_over_while_the_head_start_still_has_another_samples_add_out(
        tmp_path, locomo_file, monkeypatch):
    """The handover: each sample goes on in the Ingest stage as soon as the head start has no Add of it out
    (waiting for the head start's last Add of every sample left a one-at-a-time participant idle): with one sample's Add held at the
    participant, the other sample's next Add arrives from the Ingest stage meanwhile. The declared limit
    holds across both clients, and every chunk is added once."""
    import threading

    from aml_ray.run.head_start import HeadStart

    handed_over = threading.Event()
    for name in ("hand_over", "stop"):  # the new handover and the old one: either marks the moment
        original = getattr(HeadStart, name, None)
        if original is not None:
            def marked(self, *args, _original=original, **kw):
                handed_over.set()
                return _original(self, *args, **kw)
            monkeypatch.setattr(HeadStart, name, marked)
    seen: dict = {}
    app = _holding_participant(":conv-30", 3, handed_over, seen, guard_s=300)  # ends at once when it works

    own_cluster(monkeypatch, lambda: _wait_for(app.state.held.is_set))  # the pipeline starts once an Add is held
    with ThreadServer(app) as server:
        spec = ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search",
                               max_in_flight=3)
        result = evaluate(EvaluationConfig(dataset="locomo", participant=spec, out_dir=tmp_path / "run",
                                           data_path=locomo_file, limit_samples=2, retrieval_only=True, **OFFLINE))
    info = result.run_info
    assert seen["another sample added after the handover while one Add was held"] is True
    assert info["status"] == "completed", info.get("error")
    assert seen["peak in flight"] <= 3  # the head start's Adds out and the Ingest stage's together
    adds = read_adds(RunDir(tmp_path / "run"))
    assert adds.height == info["dataset"]["chunks"] == adds.select("sample_id", "chunk_index").n_unique()
    assert info["head_start"]["ended"] == "handover" and info["head_start"]["samples"] == 2


def test_a_prepared_head_start_reads_its_samples_and_sends_nothing_until_released(tmp_path, locomo_file):
    """Prepared while the pre-flight's probe is out: its samples are read and checked, no Add is sent; once
    released with the probe's lone latencies, its Adds go with the limit at 2 from the first (no probe of
    its own)."""
    run_dir = RunDir(tmp_path / "run")
    inputs = _inputs(tmp_path, locomo_file)
    with ServerProcess("participant", "--latency-ms", "5", "--add-latency-ms", "60", "--capacity", "64") as server:
        spec = ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search",
                               max_in_flight=8)
        head = _head_start(samples_at_once=2).prepare(spec, inputs, run_dir)
        _wait_for(lambda: head.ready == 2)
        time.sleep(0.3)  # five Adds' time: one sent before the release would have arrived
        assert (head.ready, server.stats()["n"].get("add", 0), journalled(run_dir)) == (2, 0, 0)
        head.release({spec.add_url: 60.0, spec.search_url: 5.0})
        _wait_for(lambda: journalled(run_dir) >= 4)
        head.stop()
        stats = server.stats()
    assert stats["n"]["add"] == head.sent >= 4 and head.ended == "handover"
    assert head._client.concurrency()["trajectory"][0] == [0, 2]  # seeded: two in flight from the first reply


def test_a_head_start_stopped_before_its_release_sends_nothing(tmp_path, locomo_file):
    """A failed pre-flight never releases the head start: stopped, it ends without an Add and says why."""
    run_dir = RunDir(tmp_path / "run")
    inputs = _inputs(tmp_path, locomo_file)
    with ServerProcess("participant", "--latency-ms", "1", "--add-latency-ms", "1", "--capacity", "64") as server:
        spec = ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search")
        head = _head_start().prepare(spec, inputs, run_dir)
        _wait_for(lambda: head.ready == 2)
        head.stop()
        head.release({spec.add_url: 1.0})  # too late: stopped
        time.sleep(0.2)
        assert server.stats()["n"].get("add", 0) == 0
    assert (head.sent, head.ended, head.running()) == (0, "stopped before the pre-flight passed", False)
    assert journalled(run_dir) == 0
