"""Honest outcomes (issue 24): a run that did not measure what it claims never says "completed".

Real loopback participants (tests/dying_participants.py, tests/bad_participants.py), real Ray, the real
LoCoMo file, evidence read back from disk.
"""

from __future__ import annotations

import json
import socket
import time

import polars as pl
import pytest
from typer.testing import CliRunner

from aml_ray.config import model_endpoint_from_env
from aml_ray.run.evaluation import EvaluationConfig, evaluate
from aml_ray.run.evidence import RunDir, read_adds
from aml_ray.run.outcome import FailureBudget, run_outcome
from aml_ray.run.pipeline import StageFailed
from aml_ray.run.preflight import PreflightFailed, preflight
from tests.bad_participants import BadParticipant
from tests.dying_participants import FailingParticipant

OFFLINE = {"answer": model_endpoint_from_env("answer", {}), "judge": model_endpoint_from_env("judge", {})}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(tmp_path, spec, locomo_file, **kw) -> EvaluationConfig:
    return EvaluationConfig(dataset="locomo", participant=spec, out_dir=tmp_path / "run", data_path=locomo_file,
                            **OFFLINE, **kw)


# --- the failure budget and the status rules (no Ray) ---------------------------------------------------------

def test_failure_budget_needs_both_the_count_and_the_share():
    budget = FailureBudget(share=0.10, min_failures=5)
    for i in range(40):
        budget.record("add", True)
    for i in range(4):
        budget.record("add", False, http_status=503, request_id=f"r{i}", error="gave up")
    assert budget.exceeded() is None  # 4 failures: under the minimum count
    budget.record("add", False, http_status=None, request_id="r4")
    assert budget.exceeded() == "add"  # 5 of 45 = 11 % > 10 %
    summary = budget.summary("add")
    assert summary.startswith("failure budget exceeded: 5 of 45 Adds failed after retries (11% > 10%")
    assert "HTTP 503 x4, transport x1" in summary and "request_id r0: gave up" in summary
    assert budget.failure("add")["kind"] == "FailureBudget"


def _adds(statuses: list[str]) -> pl.DataFrame:
    return pl.DataFrame({"sample_id": ["s"] * len(statuses), "chunk_index": list(range(len(statuses))),
                         "status": statuses})


def _questions(statuses: list[str | None], search: list[str] | None = None) -> pl.DataFrame:
    return pl.DataFrame({"question_id": [f"q{i}" for i in range(len(statuses))], "excluded": [False] * len(statuses),
                         "status": statuses, "search_status": search or ["ok"] * len(statuses)},
                        schema={"question_id": pl.String, "excluded": pl.Boolean, "status": pl.String,
                                "search_status": pl.String})


def test_run_outcome_completed_partial_failed():
    ok = run_outcome(_adds(["ok"] * 20), _questions(["scored", "judge_error", "scored"]), expected_adds=20, scorable=3)
    assert (ok.status, ok.reasons) == ("completed", [])
    one_add = run_outcome(_adds(["ok"] * 19 + ["error"]), _questions(["scored"] * 3), expected_adds=20, scorable=3)
    assert one_add.status == "partial" and one_add.reasons == ["1 of 20 Adds failed after retries"]
    missing = run_outcome(_adds(["ok"] * 20), _questions(["scored", None]), expected_adds=20, scorable=3)
    assert missing.status == "partial" and "2 of 3 scorable questions have no result" in missing.summary
    dead = run_outcome(_adds(["ok"] * 2 + ["error"] * 18), _questions(["search_error"] * 3, ["error"] * 3),
                       expected_adds=20, scorable=3)
    assert dead.status == "failed"
    assert "failure budget exceeded: 18 of 20 Adds failed after retries (90% > 10%)" in dead.summary
    assert "3 of 3 Searches failed" in dead.summary and "no question was scored (0 of 3)" in dead.summary
    assert dead.counts["adds"] == {"expected": 20, "ok": 2, "failed": 18, "missing": 0}


def test_a_resent_add_counts_by_its_last_row():
    adds = pl.DataFrame({"sample_id": ["s", "s", "s"], "chunk_index": [0, 1, 1], "status": ["ok", "error", "ok"]})
    assert run_outcome(adds, _questions(["scored"]), expected_adds=2, scorable=1).status == "completed"


# --- pre-flight (no Ray) -----------------------------------------------------------------------------------------

def test_preflight_fails_in_seconds_on_a_dead_endpoint_naming_the_url():
    """A refused connection ends the pre-flight after its few attempts, not after the evaluation's per-request
    timeout (1,800 s) or its retries: the bound separates the two, with room for a loaded machine."""
    from aml_ray.actors.participant import ParticipantSpec

    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(PreflightFailed) as info:
        preflight(ParticipantSpec(add_url=f"{url}/add", search_url=f"{url}/search"), run_id="r1", dataset="locomo")
    assert time.monotonic() - t0 < 60
    assert info.value.step == "add" and info.value.url == f"{url}/add"
    assert str(info.value).startswith(f"pre-flight add failed at {url}/add: gave up after 3 attempts")


def test_preflight_names_a_contract_field_and_passes_a_good_participant():
    with BadParticipant("success_string") as bad:
        with pytest.raises(PreflightFailed) as info:
            preflight(bad.spec(), run_id="r2", dataset="locomo")
    assert info.value.step == "add" and "field 'success'" in info.value.cause
    with BadParticipant() as good:
        report = preflight(good.spec(), run_id="r3", dataset="locomo")
    assert list(report.steps) == ["health", "add", "search"]
    assert all(s["ok"] for s in report.steps.values()) and report.user_id == "eval:r3:locomo:preflight"
    # each probe step went alone: its latency seeds the head start's client (issue 29); health is no Add/Search
    spec = good.spec()
    assert report.lone_latencies() == {spec.add_url: report.steps["add"]["latency_ms"],
                                       spec.search_url: report.steps["search"]["latency_ms"]}
    assert all(v > 0 for v in report.lone_latencies().values())


# --- runs through Ray ---------------------------------------------------------------------------------------------

@pytest.mark.usefixtures("ray_session")
def test_dead_endpoint_fails_the_cli_run_in_seconds_without_a_traceback(tmp_path, locomo_file):
    from aml_ray.cli import app

    url = f"http://127.0.0.1:{free_port()}"
    out = tmp_path / "dead"
    t0 = time.monotonic()
    res = CliRunner().invoke(app, ["run", "--data", str(locomo_file), "--participant", url, "--out", str(out)])
    elapsed = time.monotonic() - t0
    assert res.exit_code == 1, res.output
    assert elapsed < 120, elapsed  # the pre-flight stopped it: every Add retried to its timeout would take hours
    assert f"{url}/add" in res.output and "Traceback" not in res.output and res.exception is None or \
        isinstance(res.exception, SystemExit)
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "failed" and run["failure"]["kind"] == "Preflight"
    assert not (out / "results.json").exists()


@pytest.mark.usefixtures("ray_session")
def test_a_participant_that_dies_mid_run_fails_it_by_the_budget(tmp_path, locomo_file):
    with FailingParticipant(die_after_adds=3) as dying:
        with pytest.raises(StageFailed) as info:
            evaluate(config(tmp_path, dying.spec(), locomo_file, limit_samples=1, retrieval_only=True))
    failure = info.value.failure
    assert failure["kind"] == "FailureBudget" and failure["stage"] == "add"
    assert failure["failed"] == 5 and failure["statuses"] == {"transport": 5} and failure["attempted"] == 8
    assert failure["request_id"] == f"{json.loads(RunDir(tmp_path / 'run').run_json.read_text())['preflight']['user_id'][:-len('preflight')]}conv-26:chunk-3"
    assert info.value.summary.startswith("failure budget exceeded: 5 of 8 Adds failed after retries (62% > 10%; "
                                         "transport x5); e.g. request_id ")
    run = json.loads(RunDir(tmp_path / "run").run_json.read_text())
    assert run["status"] == "failed" and run["error"] == info.value.summary


@pytest.mark.usefixtures("ray_session")
def test_one_failed_add_makes_the_run_partial_not_completed(tmp_path, locomo_file):
    from aml_ray.cli import app

    with FailingParticipant(fail_chunk=3) as flaky:
        result = evaluate(config(tmp_path, flaky.spec(), locomo_file, limit_samples=1, retrieval_only=True))
    info = result.run_info
    assert info["status"] == "partial"
    assert info["outcome"]["reasons"] == [f"1 of {info['dataset']['chunks']} Adds failed after retries"]
    adds = read_adds(result.run_dir)
    failed = adds.filter(pl.col("status") != "ok")
    assert failed["request_id"].to_list() == [f"eval:{info['run_id']}:locomo:{failed['sample_id'][0]}:chunk-3"]
    assert json.loads((tmp_path / "run" / "results.json").read_text())["status"] == "partial"
    with FailingParticipant(fail_chunk=3) as flaky:  # the CLI says so and exits 1
        res = CliRunner().invoke(app, ["run", "--data", str(locomo_file), "--participant", flaky.base_url,
                                       "--limit-samples", "1", "--retrieval-only", "--out", str(tmp_path / "cli")])
    assert res.exit_code == 1 and "run partial:" in res.output and "Adds failed after retries" in res.output


@pytest.mark.usefixtures("ray_session")
def test_a_participant_that_returns_other_users_memories_fails_the_run(tmp_path, locomo_file):
    with BadParticipant("leak_all", capacity=16) as leaky:
        with pytest.raises(StageFailed) as info:
            evaluate(config(tmp_path, leaky.spec(), locomo_file, limit_samples=2, retrieval_only=True))
    assert info.value.failure["kind"] == "isolation"
    run = json.loads(RunDir(tmp_path / "run").run_json.read_text())
    assert run["status"] == "failed" and run["isolation"]["leaking_questions"] > 0
    first = run["isolation"]["examples"][0]
    assert first["user_id"] != first["owner_user_id"]
    assert {first["user_id"], first["owner_user_id"]} <= {f"eval:{run['run_id']}:locomo:conv-26",
                                                         f"eval:{run['run_id']}:locomo:conv-30"}
    assert f"question {first['question_id']} of {first['user_id']}" in info.value.summary
    assert first["owner_user_id"] in info.value.summary


@pytest.mark.usefixtures("ray_session")
def test_an_internal_stage_error_reaches_the_summary_in_full(tmp_path, locomo_file):
    """A damaged sample input file: the cause (pyarrow's error) is the summary, without Ray's header."""
    from aml_ray.actors.participant import ParticipantSpec
    from aml_ray.datasets.registry import get_dataset
    from aml_ray.ids import IdScheme
    from aml_ray.run.inputs import build_inputs
    from aml_ray.run.pipeline import run_pipeline

    spec = get_dataset("locomo")
    samples = spec.load(locomo_file)[:1]
    run_dir = RunDir(tmp_path / "run")
    inputs = build_inputs(samples, IdScheme("r-internal", "locomo"), out_dir=run_dir.inputs)
    inputs.sample_path(0).write_bytes(b"not an arrow file " + b"x" * 2000)
    with pytest.raises(StageFailed) as info:
        run_pipeline(inputs, run_dir=run_dir, participant=ParticipantSpec(add_url="http://127.0.0.1:9/add",
                                                                          search_url="http://127.0.0.1:9/search"),
                     answer=OFFLINE["answer"], judge=OFFLINE["judge"], answer_prompt="locomo_answer",
                     judge_prompt="locomo_judge", top_k=10, retrieval_only=True)
    summary = info.value.summary
    assert summary == "pipeline failed: pyarrow.lib.ArrowInvalid: Not an Arrow file", summary[:300]
    assert "\x1b[" not in summary and "ray::" not in summary and "File \"" not in summary
