"""aml_ray.run.local_ingest: a single-stage job's Ingest in the calling process, with the rows, the evidence and
the failures of the Ingest actor, and nothing left running after the job."""

from __future__ import annotations

import json
import threading

import pytest

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import model_endpoint_from_env
from aml_ray.reference.server import ReferenceServer
from aml_ray.run.evaluation import EvaluationConfig, evaluate
from aml_ray.run.evidence import RunDir, read_questions
from aml_ray.run.pipeline import PipelineOptions, StageFailed
from tests.dying_participants import FailingParticipant

pytestmark = pytest.mark.usefixtures("ray_session")

OFFLINE = {"answer": model_endpoint_from_env("answer", {}), "judge": model_endpoint_from_env("judge", {})}


def _ingest_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "aml-ray-ingest"]


def test_ingest_here_gives_the_rows_of_the_ingest_actor_and_starts_none(tmp_path, locomo_file):
    """``ingest_here=True`` (asked for, in the driver): no ``IngestFromFiles`` actor starts, every question row
    (status, answer, verdict, memories' count) equals the actor's, run.json says where Ingest ran, and the
    stage's thread is gone when the run ends."""
    import ray

    columns = ["question_id", "status", "answer", "verdict", "n_memories"]
    rows, started, where = {}, {}, {}
    with ReferenceServer(tmp_path / "ref") as ref:
        for here in (True, False):
            before = set(ray._private.state.actors())
            result = evaluate(EvaluationConfig(
                dataset="locomo", participant=ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url),
                out_dir=tmp_path / f"here-{here}", data_path=locomo_file, limit_samples=1,
                options=PipelineOptions(ingest_here=here), **OFFLINE))
            rows[here] = read_questions(result.run_dir).select(columns).sort("question_id")
            started[here] = {a["ActorClassName"] for aid, a in ray._private.state.actors().items() if aid not in before}
            where[here] = result.run_info["ingest_in"]
    assert rows[True].height == 199 and rows[True].equals(rows[False])
    assert "IngestFromFiles" not in started[True] and "IngestFromFiles" in started[False], started
    assert where == {True: "job process", False: "actor"}
    assert _ingest_threads() == []


def test_a_failed_stage_in_the_process_stops_the_run_with_its_cause_and_leaves_no_thread(tmp_path, locomo_file):
    """A Search refused with HTTP 400 stops the run as it does with the actor: ``StageFailed`` with the
    participant's cause, run.json ``failed``; the Adds already made are evidence; the stage's loop and thread
    are closed."""
    with FailingParticipant(refuse_search_of="locomo") as server:
        spec = ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search")
        with pytest.raises(StageFailed) as stopped:
            evaluate(EvaluationConfig(dataset="locomo", participant=spec, out_dir=tmp_path / "run",
                                      data_path=locomo_file, limit_samples=1,
                                      options=PipelineOptions(ingest_here=True), **OFFLINE))
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["status"] == "failed" and "400" in stopped.value.summary, stopped.value.summary
    assert info["ingest_in"] == "job process"
    journalled = [json.loads(line) for path in RunDir(tmp_path / "run").adds.glob("*.jsonl")
                  for line in path.read_text().splitlines()]  # a stopped run's Add journals, kept for its resume
    assert len(journalled) == info["dataset"]["chunks"] > 0 and {a["status"] for a in journalled} == {"ok"}
    assert _ingest_threads() == []


def test_a_stage_that_cannot_be_built_releases_the_jobs_leases(tmp_path, locomo_file, monkeypatch):
    """The stage's constructor runs in the job's process, before the pipeline's loop: its error reaches the
    caller, the job holds no lease on the cluster afterwards, and no stage thread is left."""
    import aml_ray.run.local_ingest as local_ingest
    from aml_ray.actors.shared import live_leases

    class Unbuildable:
        def __init__(self, **kwargs):
            raise RuntimeError("the stage could not be built")

    monkeypatch.setattr(local_ingest, "IngestFromFiles", Unbuildable)
    with ReferenceServer(tmp_path / "ref") as ref:
        with pytest.raises(RuntimeError, match="the stage could not be built"):
            evaluate(EvaluationConfig(
                dataset="locomo", participant=ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url),
                out_dir=tmp_path / "run", data_path=locomo_file, limit_samples=1, run_id="unbuildable",
                options=PipelineOptions(ingest_here=True), **OFFLINE))
    assert {name: jobs for name, jobs in live_leases().items() if any(j.startswith("unbuildable/") for j in jobs)} == {}
    assert _ingest_threads() == []
