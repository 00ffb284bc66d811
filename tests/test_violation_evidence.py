"""The request that stopped a run has its evidence row (issue 24, item 9).

Real loopback participants (tests/bad_participants.py) that break one request only, real Ray, the real
LoCoMo file (its first sample), retrieval only: the run stops as before (StageFailed naming the field),
and ``evidence/stopped/`` holds the offending Add's or Search's row, with the violation and without the key.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from typer.testing import CliRunner

from aml_ray.config import model_endpoint_from_env
from aml_ray.run.evaluation import EvaluationConfig, evaluate
from aml_ray.run import evidence
from aml_ray.run.evidence import AddJournal, RunDir
from aml_ray.run.pipeline import StageFailed
from tests.bad_participants import BadParticipant

pytestmark = pytest.mark.usefixtures("ray_session")
OFFLINE = {"answer": model_endpoint_from_env("answer", {}), "judge": model_endpoint_from_env("judge", {})}
KEY = "sk-memory-key-0123456789abcdef"


@pytest.mark.parametrize("mode,kind,field,status,http", [
    ("wrong_echo_second_add", "ContractError", "request_id", "contract_error", 200),
    ("success_false_second_add", "ContractError", "success", "contract_error", 200),
    ("forbid_second_add", "ParticipantError", None, "error", 403),
])
def test_the_add_that_stopped_the_run_has_its_evidence_row(tmp_path, locomo_file, mode, kind, field, status, http):
    with BadParticipant(mode, auth="Bearer", secret=KEY, capacity=8) as bad:
        with pytest.raises(StageFailed) as info:
            evaluate(EvaluationConfig(dataset="locomo", participant=bad.spec(), out_dir=tmp_path / "run",
                                      data_path=locomo_file, limit_samples=1, retrieval_only=True, **OFFLINE))
        bodies = dict(bad._server.app.state.add_bodies)
    run_dir = RunDir(tmp_path / "run")
    run = json.loads(run_dir.run_json.read_text())
    rid = f"eval:{run['run_id']}:locomo:conv-26:chunk-1"
    failure = info.value.failure
    # the run stops exactly as before: the driver's StageFailed names the field (or the status)
    assert (failure["kind"], failure["request_id"], failure.get("field"), failure.get("status")) == (
        kind, rid, field, None if field else http)
    assert run["status"] == "failed" and run["failure"]["evidence"] == "evidence/stopped/adds.jsonl"
    [row] = evidence.read_stopped_adds(run_dir).to_dicts()
    assert {k: row[k] for k in ("sample_id", "chunk_index", "request_id", "user_id", "status", "http_status",
                                "attempts", "retried_statuses")} == {
        "sample_id": "conv-26", "chunk_index": 1, "request_id": rid, "user_id": f"eval:{run['run_id']}:locomo:conv-26",
        "status": status, "http_status": http, "attempts": 1, "retried_statuses": []}
    assert row["request_sha256"] == hashlib.sha256(bodies[rid]).hexdigest()
    assert row["elapsed_ms"] >= row["latency_ms"] > 0 and row["n_messages"] > 0 and row["n_words"] > 0
    if field:
        assert row["contract"].startswith(f"{field}: ") and f"field '{field}'" in row["error"]
    else:
        assert row["contract"] is None and "HTTP 403 is not retried" in row["error"]
    # the finished Add stays in the journal, alone: a resumed run sends the stopped one again
    assert [r["chunk_index"] for r in AddJournal(run_dir, "conv-26").rows()] == [0]
    for path in [run_dir.run_json, *sorted((run_dir.root / "evidence").rglob("*.*"))]:
        assert KEY not in path.read_text(errors="replace"), path  # the participant echoed it; it is redacted


def test_the_search_over_top_k_has_its_question_row_and_names_the_question(tmp_path, locomo_file):
    """Through the CLI (``aml-ray run``): one Search answered with top_k + 1 items stops the run."""
    from aml_ray.cli import app

    out = tmp_path / "run"
    with BadParticipant("overflow_one_search", capacity=16) as bad:
        res = CliRunner().invoke(app, ["run", "--data", str(locomo_file), "--participant", bad.base_url,
                                       "--limit-samples", "1", "--retrieval-only", "--top-k", "10", "--out", str(out)])
        sent = bad._server.app.state.overflowed
    assert res.exit_code != 0, res.output
    run = json.loads((out / "run.json").read_text())
    asked = json.loads(sent)
    user_id = f"eval:{run['run_id']}:locomo:conv-26"
    [row] = evidence.read_stopped_searches(RunDir(out)).to_dicts()
    ref = f"{user_id}:q-{row['question_id']}"
    assert (row["ref"], row["user_id"], row["sample_id"], row["question"]) == (ref, user_id, "conv-26", asked["query"])
    assert asked["user_id"] == user_id and asked["top_k"] == 10
    searched = ("search_status", "search_http_status", "search_attempts", "search_retried_statuses")
    assert {k: row[k] for k in searched} == {"search_status": "contract_error", "search_http_status": 200,
                                             "search_attempts": 1, "search_retried_statuses": []}
    assert row["search_request_sha256"] == hashlib.sha256(sent).hexdigest() and row["search_latency_ms"] > 0
    reason = f"question {ref} of user_id {user_id!r} returned 11 items for top_k=10 (11 > 10)"
    assert row["contract"].startswith(f"data: {reason}") and reason in row["search_error"]
    failure = run["failure"]
    assert (failure["kind"], failure["field"], failure["request_id"]) == ("ContractError", "data", ref)
    assert failure["evidence"] == "evidence/stopped/searches.jsonl"
    assert reason in failure["summary"] and reason in run["error"]


def test_the_stop_log_appends_rows_of_its_schema_and_reads_a_torn_last_line_as_not_recorded(tmp_path):
    run_dir = RunDir(tmp_path)
    log = evidence.StopLog(run_dir)
    row = {"sample_id": "s1", "chunk_index": 3, "request_id": "eval:r:d:s1:chunk-3", "status": "contract_error",
           "http_status": 200, "attempts": 1, "retried_statuses": [], "contract": "success: must be the boolean true"}
    assert log.append("add", row) == "evidence/stopped/adds.jsonl"
    with open(log.path("add"), "a", encoding="utf-8") as fh:
        fh.write('{"sample_id": "s1", "chunk')  # a kill mid-write
    [back] = evidence.read_stopped_adds(run_dir).to_dicts()
    assert {k: back[k] for k in row} == row and back["latency_ms"] is None
    log.append("add", {**row, "chunk_index": 4})  # a resumed run stopped again: the torn line is dropped first
    assert evidence.read_stopped_adds(run_dir)["chunk_index"].to_list() == [3, 4]
    assert evidence.read_stopped_searches(run_dir).height == 0
    with pytest.raises(ValueError, match="undeclared columns"):
        log.append("search", {"question_id": "q1", "verdict_typo": "x"})
