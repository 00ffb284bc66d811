"""The head start on a joined cluster (aml_ray.run.head_start, aml_ray.actors.shared): the run whose lease starts
the participant version's shared client is granted the head start; its driver journals the first Adds while
the pipeline's actors start, and the shared client holds all its slots until the handover, so another job
leasing that client meanwhile waits and the declared in-flight limit holds across both jobs.

The run joins the session's Ray (``evaluate`` did not start it, as ``aml-ray run`` joins ``aml-ray cluster
up``); a second job leases the same version's client from a thread of the test process. A real loopback
participant in its own process counts what it served and the most it held at once.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import ray

import aml_ray.run.pipeline as pipeline
from aml_ray.actors.participant import ParticipantSpec
from aml_ray.actors.shared import acquire_participant_client
from aml_ray.config import model_endpoint_from_env
from aml_ray.run.evaluation import EvaluationConfig, evaluate
from aml_ray.run.evidence import RunDir, read_adds
from scripts.loopback_servers import ServerProcess

OFFLINE = {"answer": model_endpoint_from_env("answer", {}), "judge": model_endpoint_from_env("judge", {})}
#: The participant version's declared in-flight limit.
LIMIT = 2
#: The other job's Searches.
SEARCHES = 6
#: Only a guard against a hang (never reached when the head start works).
GUARD_S = 120


def journalled(run_dir: RunDir) -> int:
    """Add journal lines written so far, over every sample."""
    return sum(len(p.read_text().splitlines()) for p in run_dir.adds.glob("*.jsonl")) if run_dir.adds.exists() else 0


def _wait_for(predicate) -> None:
    deadline = time.monotonic() + GUARD_S
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)


@pytest.mark.usefixtures("ray_session")
def test_a_joined_clusters_head_start_journals_the_first_adds_and_another_job_waits_for_the_handover(
        tmp_path, locomo_file, monkeypatch):
    """Once the run's lease is taken (before its Ingest actor is made), a second job leases the same client and
    sends Searches through it: they get no reply while the run's head start journals Adds, all succeed after
    the handover, the participant never holds more than the declared limit, and every chunk is added once."""
    run_dir = RunDir(tmp_path / "run")
    seen: dict = {}
    other_job: dict = {}

    def other(spec: ParticipantSpec) -> None:
        lease = acquire_participant_client(spec, "other-job")
        try:
            other_job["granted"] = lease.head_start
            ray.get(lease.handle.concurrency.remote(), timeout=GUARD_S)  # its actor is up and answering
            searches = [{"ref": f"other-{i}", "request": {"query": "q", "user_id": "eval:other:d:s", "top_k": 5}}
                        for i in range(SEARCHES)]
            ref = lease.handle.search_batch.remote(searches)
            other_job["sent at journalled"] = journalled(run_dir)
            found = ray.get(ref, timeout=GUARD_S)
            other_job["ok"] = sum(f["status"] == "ok" for f in found)
        finally:
            lease.release()

    original = pipeline._ingest_actor

    def ingest_actor_later(*args, **kw):
        # the run holds its lease now (granted or not); its Ingest actor is not made yet
        thread = seen["thread"] = threading.Thread(target=other, args=(spec,), daemon=True)
        thread.start()
        _wait_for(lambda: "sent at journalled" in other_job or not thread.is_alive())
        # two Adds journalled after its Searches went to the client (or every Add, when the head start is done)
        chunks = json.loads(run_dir.run_json.read_text())["dataset"]["chunks"]
        wanted = min(other_job.get("sent at journalled", 0) + 2, chunks)
        _wait_for(lambda: journalled(run_dir) >= wanted or not thread.is_alive())
        seen["journalled before the Ingest actor"] = journalled(run_dir)
        seen["other job answered before the Ingest actor"] = "ok" in other_job
        return original(*args, **kw)

    monkeypatch.setattr(pipeline, "_ingest_actor", ingest_actor_later)
    with ServerProcess("participant", "--latency-ms", "5", "--add-latency-ms", "150", "--capacity", "64") as server:
        spec = ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search",
                               max_in_flight=LIMIT, adaptive_concurrency=False)
        result = evaluate(EvaluationConfig(dataset="locomo", participant=spec, out_dir=run_dir.root,
                                           data_path=locomo_file, limit_samples=2, **OFFLINE))
        seen["thread"].join(timeout=GUARD_S)
        stats = server.stats()
    info = result.run_info
    assert info["status"] == "completed", info.get("error")
    assert info["ray_cluster"]["started_here"] is False  # joined
    head = info["head_start"]
    assert head["adds"] >= 2 and head["failed"] == 0 and head["ended"] in ("handover", "done"), head
    assert seen["journalled before the Ingest actor"] >= 2
    assert other_job["granted"] is False  # the client was the run's: no second head start
    assert seen["other job answered before the Ingest actor"] is False  # its slots were the head start's
    assert other_job["ok"] == SEARCHES
    assert stats["max_in_flight"] <= LIMIT  # the two jobs together within the version's declared limit
    chunks = info["dataset"]["chunks"]
    assert stats["n"]["add"] == chunks + 1  # each chunk once, and the pre-flight's probe
    adds = read_adds(run_dir)
    assert adds.height == chunks and adds.select("sample_id", "chunk_index").n_unique() == chunks
