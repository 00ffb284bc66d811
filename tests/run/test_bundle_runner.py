"""aml_ray.run.bundle_runner: a suite's bundles run at once, each in an actor of its own, with the participant's
declared in-flight limit held across them; a Ctrl-C marks every unfinished bundle ``interrupted`` and leaves no
runner behind."""

from __future__ import annotations

import json
import os
from datetime import datetime

import pytest
from typer.testing import CliRunner

from aml_ray.cli import app
from tests.bad_participants import BadParticipant
from tests.conftest import SHARED_DATASETS

PRESENT = ["locomo", "longmemeval_oracle", "beam"]


def _config(tmp_path, spec, **kw):
    from aml_ray.config import model_endpoint_from_env
    from aml_ray.run.suite_run import SuiteConfig

    return SuiteConfig(participant=spec, answer=model_endpoint_from_env("answer", {}),
                       judge=model_endpoint_from_env("judge", {}), out_dir=tmp_path / "suite",
                       datasets_dir=SHARED_DATASETS, **{"limit_samples": 2, "bundles": PRESENT, **kw})


def _span(run_dir) -> tuple[datetime, datetime]:
    info = json.loads((run_dir / "run.json").read_text())
    return datetime.fromisoformat(info["started_at"]), datetime.fromisoformat(info["finished_at"])


@pytest.mark.usefixtures("ray_session")
def test_bundles_run_at_once_within_the_participants_declared_in_flight_limit(tmp_path):
    """Three bundles' runs overlap in time, and a participant that answers 429 above 2 requests in flight, declared
    as ``max_in_flight=2``, never refuses one: the bundles share the participant version's one client."""
    from aml_ray.run.suite_run import evaluate_suite

    with BadParticipant("burst_429", capacity=2) as server:
        result = evaluate_suite(_config(tmp_path, server.spec()))
        refused = dict(server.refused)
    assert [o.status for o in result.outcomes] == ["ran"] * 3, [(o.name, o.reason) for o in result.outcomes]
    assert all(o.result.run_info["status"] == "completed" for o in result.outcomes)
    spans = {o.name: _span(tmp_path / "suite" / o.name) for o in result.outcomes}
    last_start = max(start for start, _ in spans.values())
    first_end = min(end for _, end in spans.values())
    assert last_start < first_end, spans  # every bundle was running at that moment
    assert refused == {}, refused
    assert result.overall["datasets"] == 3


@pytest.mark.usefixtures("ray_session")
def test_a_bundles_ingest_runs_in_its_runner_with_no_actor_of_its_own(tmp_path):
    """A bundle's runner is a worker process that exists for its bundle's job: the job's Ingest stage runs
    there (aml_ray.run.local_ingest), so the suite starts a ``BundleRunner`` per bundle and no
    ``IngestFromFiles`` actor; each run.json says where its Ingest ran, and every question is scored."""
    import ray

    from aml_ray.run.suite_run import evaluate_suite

    before = set(ray._private.state.actors())
    with BadParticipant(capacity=4) as server:
        result = evaluate_suite(_config(tmp_path, server.spec(), bundles=["locomo", "beam"], limit_samples=1))
    started = sorted(a["ActorClassName"] for aid, a in ray._private.state.actors().items() if aid not in before)
    assert started.count("BundleRunner") == 2 and "IngestFromFiles" not in started, started
    for outcome in result.outcomes:
        info = outcome.result.run_info
        assert (outcome.name, info["status"], info["ingest_in"]) == (outcome.name, "completed", "job process")
        counts = info["outcome"]["counts"]
        assert counts["questions"]["final"] == info["dataset"]["scorable_questions"] > 0, counts
        assert counts["adds"]["ok"] == info["dataset"]["chunks"] and counts["questions"]["missing"] == 0, counts


@pytest.mark.usefixtures("ray_session")
def test_one_bundle_at_a_time_runs_them_one_after_another(tmp_path):
    from aml_ray.run.suite_run import evaluate_suite

    with BadParticipant(capacity=8) as server:
        result = evaluate_suite(_config(tmp_path, server.spec(), bundles_at_once=1))
    spans = [_span(tmp_path / "suite" / name) for name in PRESENT]
    assert [o.status for o in result.outcomes] == ["ran"] * 3
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:])), spans


@pytest.mark.usefixtures("ray_session")
def test_a_ctrl_c_marks_every_unfinished_bundle_interrupted_and_kills_the_runners(tmp_path):
    """The Ctrl-C lands in the driver's loop once every bundle reported its totals (the pipelines run); an
    interrupted bundle's run is then resumed to its end with ``aml-ray run --resume``."""
    from aml_ray.run.suite_run import evaluate_suite

    reported: set[str] = set()

    def on_progress(bundle: str, kind: str, values: dict[str, int]) -> None:
        if kind == "totals":
            reported.add(bundle)
        if reported == set(PRESENT):
            raise KeyboardInterrupt

    with BadParticipant(capacity=1) as server:
        with pytest.raises(KeyboardInterrupt):
            evaluate_suite(_config(tmp_path, server.spec()), on_progress=on_progress)
        interrupted = {name: json.loads((tmp_path / "suite" / name / "run.json").read_text()) for name in PRESENT}
        resumed = CliRunner().invoke(app, ["run", "--resume", str(tmp_path / "suite" / "beam")],
                                     env={"ANSWER_API_BASE": "", "JUDGE_API_BASE": ""})
    assert resumed.exit_code == 0, resumed.output
    assert json.loads((tmp_path / "suite" / "beam" / "run.json").read_text())["status"] == "completed"
    from aml_ray.run.evaluation import process_alive

    for name, info in interrupted.items():
        assert info["status"] == "interrupted", (name, info["status"])
        assert "--resume" in info["error"]
        assert info["process"]["pid"] != os.getpid() and not process_alive(info["process"])  # the runner is gone
    assert not (tmp_path / "suite" / "suite.json").exists()


def test_bundles_at_once_needs_a_suite(tmp_path):
    res = CliRunner().invoke(app, ["run", "--dataset", "locomo", "--bundles-at-once", "2",
                                   "--out", str(tmp_path / "run")])
    assert res.exit_code == 2
    assert "--bundles-at-once sets how many bundles of a suite run at a time: give --suite" in res.output
    assert not (tmp_path / "run").exists()
