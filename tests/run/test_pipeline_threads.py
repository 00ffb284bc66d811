"""No thread of a run is left inside a Ray call when the run ends (aml_ray.run.pipeline.run_pipeline).

A Python thread that calls into Ray after ``ray.shutdown()`` ends the whole process at once with status 1
(Ray's core worker exits): a Ctrl-C whose run shut its own cluster down while the progress poller was still
in its last call exited 1 with run.json left ``running`` (seen under two CPU hogs at load 30).
"""

from __future__ import annotations

import threading
import time

import pytest

import aml_ray.run.pipeline as pipeline
from aml_ray import interrupts
from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import model_endpoint_from_env
from aml_ray.run.evaluation import EvaluationConfig, evaluate
from scripts.loopback_servers import ServerProcess

OFFLINE = {"answer": model_endpoint_from_env("answer", {}), "judge": model_endpoint_from_env("judge", {})}
#: Longer than the wait the run used to give its progress poller (2 s) at its end.
SLOW_SNAPSHOT_S = 5.0


@pytest.mark.usefixtures("ray_session")
def test_the_progress_poller_has_ended_when_the_run_returns(tmp_path, locomo_file, monkeypatch):
    """The poller's last snapshot call is slow (an actor that is still starting, a loaded machine): the run
    waits for it to end before it returns, instead of leaving it behind in Ray."""
    original = pipeline._snapshot
    cleaning, pollers = threading.Event(), []

    def slow_snapshot(tracker):
        if threading.current_thread() is not threading.main_thread():  # the poller's call
            pollers.append(threading.current_thread())
            if cleaning.wait(timeout=120):  # the run's clean-up began: this is the last call
                time.sleep(SLOW_SNAPSHOT_S)
        return original(tracker)

    deferred = interrupts.deferred

    def deferred_marked():  # the run's clean-up is its first deferred block
        cleaning.set()
        return deferred()

    monkeypatch.setattr(pipeline, "_snapshot", slow_snapshot)
    monkeypatch.setattr(interrupts, "deferred", deferred_marked)
    with ServerProcess("participant", "--latency-ms", "5", "--add-latency-ms", "5", "--capacity", "64") as server:
        spec = ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search")
        result = evaluate(EvaluationConfig(dataset="locomo", participant=spec, out_dir=tmp_path / "run",
                                           data_path=locomo_file, limit_samples=1, retrieval_only=True, **OFFLINE),
                          on_progress=lambda kind, values: None)
    assert result.run_info["status"] == "completed"
    assert pollers, "the progress poller never called for a snapshot"
    assert not [t for t in set(pollers) if t.is_alive()], "a progress poller outlived the run"
