"""``aml-ray run --suite textual`` on the benchmark files in ../shared/datasets: every present bundle runs to the
end against an honest participant, and one bundle's failure is that bundle's alone (aml_ray.run.suite_run)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from aml_ray.cli import app
from tests.bad_participants import BadParticipant
from tests.conftest import SHARED_DATASETS

OFFLINE_ENV = {"ANSWER_API_BASE": "", "JUDGE_API_BASE": "", "AML_DATASETS_DIR": ""}
#: The bundles whose files ../shared/datasets holds (LongMemEval oracle stands in for the absent -S file).
PRESENT = ["locomo", "longmemeval_oracle", "beam"]


@pytest.mark.usefixtures("ray_session")
def test_the_whole_textual_suite_completes_against_the_reference_system(tmp_path):
    """A few samples of every present bundle, through the command line, against reference:bm25."""
    res = CliRunner().invoke(app, ["run", "--suite", "textual", "--datasets-dir", str(SHARED_DATASETS),
                                   "--limit-samples", "3", "--participant", "reference:bm25",
                                   "--out", str(tmp_path / "suite")], env=OFFLINE_ENV)
    assert res.exit_code == 0, res.output
    info = json.loads((tmp_path / "suite" / "suite.json").read_text())
    bundles = {b["name"]: b for b in info["bundles"]}
    assert [n for n, b in bundles.items() if b["status"] == "ran"] == PRESENT
    for name in PRESENT:
        run = json.loads((tmp_path / "suite" / name / "run.json").read_text())
        assert run["status"] == "completed", (name, run.get("error"))
        assert bundles[name]["n_scored"] == bundles[name]["n_total"] > 0
    others = {n: b for n, b in bundles.items() if n not in PRESENT}
    assert others and all(b["status"] == "skipped" for b in others.values()), others
    assert bundles["personamem"]["reason"].startswith("absent:")
    assert info["overall"]["datasets"] == 3 and info["overall"]["n_scored"] == info["overall"]["n_total"]
    assert info["overall"]["complete"] is False and "personamem" in info["overall"]["lacks"]
    assert "longmemeval_s" not in info["overall"]["lacks"]  # the oracle bundle stood in for it
    assert all(bundles[n]["wall_s"] > 0 for n in PRESENT) and bundles["personamem"]["wall_s"] == 0


@pytest.mark.usefixtures("ray_session")
def test_a_bundle_that_fails_is_its_own_and_the_others_run_and_score(tmp_path):
    """A participant that leaks LoCoMo users' memories fails LoCoMo (isolation); LongMemEval and BEAM still run."""
    from aml_ray.config import model_endpoint_from_env
    from aml_ray.run.suite_run import SuiteConfig, evaluate_suite

    with BadParticipant("leak_locomo", capacity=16) as leaky:
        cfg = SuiteConfig(participant=leaky.spec(), answer=model_endpoint_from_env("answer", {}),
                          judge=model_endpoint_from_env("judge", {}), out_dir=tmp_path / "suite",
                          datasets_dir=SHARED_DATASETS, limit_samples=2, bundles=PRESENT)
        result = evaluate_suite(cfg)
    status = {o.name: o for o in result.outcomes}
    assert status["locomo"].status == "failed"
    assert status["locomo"].reason.startswith("stopped: isolation: ") and "\n" not in status["locomo"].reason
    for name in ("longmemeval_oracle", "beam"):
        assert status[name].status == "ran" and status[name].result.run_info["status"] == "completed"
        assert status[name].n_scored == status[name].n_total > 0
    assert result.overall["datasets"] == 2
    assert result.overall["complete"] is False and result.overall["lacks"] == ["locomo"]
    saved = json.loads((tmp_path / "suite" / "suite.json").read_text())
    assert saved["overall"]["lacks"] == ["locomo"]


@pytest.mark.usefixtures("ray_session")
def test_a_bundle_whose_operator_input_is_the_published_placeholder_is_skipped_before_it_starts(tmp_path):
    """ScriptMem's scripts are unpublished: the datasets directory holds the placeholder. The suite skips the
    bundle while it plans, as it skips an absent one: no runner starts for it ("start" is never reported)."""
    from aml_ray.actors.participant import ParticipantSpec
    from aml_ray.config import model_endpoint_from_env
    from aml_ray.run.suite_run import SuiteConfig, evaluate_suite

    events: list[tuple[str, str, str | None]] = []

    def on_bundle(kind, what):
        name = what["name"] if isinstance(what, dict) else what.name
        events.append((kind, name, None if isinstance(what, dict) else what.status))

    nobody = ParticipantSpec(add_url="http://127.0.0.1:9/add", search_url="http://127.0.0.1:9/search")  # never called
    cfg = SuiteConfig(participant=nobody, answer=model_endpoint_from_env("answer", {}),
                      judge=model_endpoint_from_env("judge", {}), out_dir=tmp_path / "suite",
                      datasets_dir=SHARED_DATASETS, limit_samples=1, bundles=["scriptmem"])
    result = evaluate_suite(cfg, on_bundle=on_bundle)
    (outcome,) = result.outcomes
    assert events == [("done", "scriptmem", "skipped")]
    assert outcome.reason.startswith("input missing: ScriptMem: ") and "published placeholder" in outcome.reason
    assert outcome.wall_s == 0 and not (tmp_path / "suite" / "scriptmem").exists()


def test_a_suites_bundles_take_the_model_slots_in_turn(tmp_path):
    """The bundles of a suite share one run id and run at once; each bundle's run is a job of its own at the
    shared model clients, whose slots go round-robin across jobs: LoCoMo's queued calls do not hold the models
    while BEAM's wait (BEAM's rubric judging then reached the judge model last and alone)."""
    from aml_ray.actors.fair import FairQueue
    from aml_ray.actors.participant import ParticipantSpec
    from aml_ray.config import model_endpoint_from_env
    from aml_ray.run.suite_run import SuiteConfig, _bundle_config
    from aml_ray.suite import load_suite

    nobody = ParticipantSpec(add_url="http://127.0.0.1:9/add", search_url="http://127.0.0.1:9/search")
    cfg = SuiteConfig(participant=nobody, answer=model_endpoint_from_env("answer", {}),
                      judge=model_endpoint_from_env("judge", {}), out_dir=tmp_path / "suite")
    suite = load_suite("textual")
    locomo, beam = (_bundle_config(cfg, suite, suite.bundle(name), tmp_path / name, tmp_path / "suite")
                    for name in ("locomo", "beam"))
    assert locomo.run_id == beam.run_id == cfg.run_id
    assert (locomo.job_key, beam.job_key) == (f"{cfg.run_id}/locomo", f"{cfg.run_id}/beam")
    slots = FairQueue()
    for i in range(3):
        slots.put(locomo.job_key, f"locomo {i}")
    for i in range(3):
        slots.put(beam.job_key, f"beam {i}")
    assert [slots.pop() for _ in range(6)] == ["locomo 0", "beam 0", "locomo 1", "beam 1", "locomo 2", "beam 2"]


def test_docstring_examples_of_the_suite_module():
    """overall_of's Overall and its `lacks`, one_line's folding (no Ray)."""
    import doctest

    from aml_ray.run import suite_run

    result = doctest.testmod(suite_run, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted >= 6
