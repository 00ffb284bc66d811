"""``aml-ray rejudge --panel`` on two real runs (the reference BM25 system and a participant that remembers
nothing), offline and with a scripted judge model behind a local OpenAI-compatible server."""

from __future__ import annotations

import json
import re

import polars as pl
import pytest
from pydantic import SecretStr
from typer.testing import CliRunner

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import ModelEndpoint, model_endpoint_from_env
from aml_ray.reference.server import ReferenceServer
from aml_ray.run.evaluation import EvaluationConfig, evaluate
from aml_ray.run.panel import rejudge_panel
from aml_ray.scoring.calibration import EXAMPLE, load_calibration
from aml_ray.scoring.panel import offline_verdict
from tests.bad_participants import BadParticipant
from tests.fake_openai import FakeOpenAI, Reply
from tests.servers import ThreadServer

pytestmark = pytest.mark.usefixtures("ray_session")
OFFLINE = {"answer": model_endpoint_from_env("answer", {}), "judge": model_endpoint_from_env("judge", {})}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, ray_session, locomo_file):
    """A LoCoMo conversation run against the reference BM25 system and against a forgetful participant."""
    root = tmp_path_factory.mktemp("board")
    with ReferenceServer(root / "ref") as ref:
        bm25 = evaluate(EvaluationConfig(dataset="locomo", participant=ParticipantSpec(
            add_url=ref.add_url, search_url=ref.search_url), out_dir=root / "bm25", data_path=locomo_file,
            limit_samples=1, **OFFLINE))
    with BadParticipant("forgetful", capacity=16) as none:
        empty = evaluate(EvaluationConfig(dataset="locomo", participant=none.spec(), out_dir=root / "none",
                                          data_path=locomo_file, limit_samples=1, **OFFLINE))
    return bm25, empty


def test_offline_panel_reports_each_protocol_and_ranks_the_board(two_runs):
    bm25, empty = two_runs
    result = rejudge_panel([bm25.run_dir.root, empty.run_dir.root], OFFLINE["judge"], label="offline",
                           calibration=load_calibration(EXAMPLE))
    assert result.offline and [p["name"] for p in result.protocols] == ["suite", "longmemeval-upstream", "strict"]
    report = result.runs[0].report
    by = {p["name"]: p for p in report["protocols"]}
    # the suite protocol offline is the run's own judge: the same overall accuracy as its score table
    overall = bm25.table.filter(pl.col("category") == "overall").to_dicts()[0]
    assert by["suite"]["accuracy"] == pytest.approx(overall["accuracy"]) and by["suite"]["questions"] == 152
    # each protocol's accuracy is its offline rule over the stored answers
    q = bm25.questions.filter(~pl.col("excluded")).to_dicts()
    for name in ("longmemeval-upstream", "strict"):
        expected = sum(r["answer_status"] == "ok" and offline_verdict(name, r["answer"], json.loads(r["gold"]))[0]
                       == "CORRECT" for r in q) / len(q)
        assert by[name]["accuracy"] == pytest.approx(expected)
    assert by["suite"]["accuracy"] > by["strict"]["accuracy"] > 0 or by["strict"]["accuracy"] == 0
    assert all(p["kappa"] is None or -1 <= p["kappa"] <= 1 for p in report["pairs"])
    assert len(report["disagreements"]) > 0 and report["spread"] > 0
    # the forgetful run answers nothing right under any protocol: second everywhere, no flip, tau 1
    assert result.board["ranks"][result.runs[1].name] == {"suite": 2, "longmemeval-upstream": 2, "strict": 2}
    assert result.board["flips"] == [] and [t["tau"] for t in result.board["taus"]] == [1.0, 1.0, 1.0]
    assert result.calibration["items"] == 12 and len(result.calibration["protocols"]) == 3
    written = json.loads((bm25.run_dir.root / "rejudge" / "offline" / "panel.json").read_text())
    assert written["board"] == result.board and written["panel"][2]["prompt"] == "judge_strict"
    strict_rows = pl.read_parquet(bm25.run_dir.root / "rejudge" / "offline" / "questions-strict.parquet")
    assert strict_rows.height == bm25.questions.height
    with pytest.raises(ValueError, match="exists"):
        rejudge_panel([bm25.run_dir.root], OFFLINE["judge"], label="offline")


def test_the_command_prints_accuracy_kappa_and_ranks(two_runs, monkeypatch):
    from aml_ray.cli import app

    monkeypatch.delenv("JUDGE_API_BASE", raising=False)
    bm25, empty = two_runs
    out = CliRunner().invoke(app, ["rejudge", str(bm25.run_dir.root), str(empty.run_dir.root), "--panel",
                                   "--label", "cli", "--calibration", str(EXAMPLE)], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    flat = " ".join(out.output.split())  # rich wraps captions at the console's width
    for text in ("judge panel", "longmemeval-upstream", "strict", "Cohen's kappa", "board: rank under each protocol",
                 "Ranks that flip: none", "calibration set: 12 items"):
        assert text in flat
    assert re.search(r"suite\s+│\s+0\.\d{3} \[0\.\d{3}, 0\.\d{3}\]", out.output)
    one = CliRunner().invoke(app, ["rejudge", str(bm25.run_dir.root), str(empty.run_dir.root)])
    assert one.exit_code == 2 and "need --panel" in one.output


def test_a_judge_model_sees_each_protocols_prompt_and_reply_rule(two_runs, tmp_path):
    bm25, _ = two_runs
    seen: dict[str, int] = {"suite": 0, "upstream": 0, "strict": 0}

    def script(prompt: str, n: int) -> Reply:
        if prompt.startswith("You are grading"):  # the suite's locomo_judge: a JSON label
            seen["suite"] += 1
            return Reply('Same thing.\n{"label": "CORRECT"}')
        if prompt.startswith("I will give you a question"):  # LongMemEval upstream: 'yes' in the reply
            seen["upstream"] += 1
            assert "contains the correct answer" in prompt  # the general variant for LoCoMo
            return Reply("I would not say yes")  # upstream's rule reads this as yes
        assert prompt.startswith("You are a strict grader"), prompt[:80]
        seen["strict"] += 1
        return Reply('Has reasoning.\n{"label": "WRONG"}')

    fake = FakeOpenAI(script)
    with ThreadServer(fake.app) as http:
        judge = ModelEndpoint(role="judge", base_url=f"{http.base_url}/v1", model="judge-model",
                              api_key=SecretStr("sk-j"))
        result = rejudge_panel([bm25.run_dir.root], judge, label="model")
    answered = bm25.questions.filter(~pl.col("excluded") & (pl.col("answer_status") == "ok")).height
    assert seen == {"suite": answered, "upstream": answered, "strict": answered}
    by = {p["name"]: p for p in result.runs[0].report["protocols"]}
    assert by["suite"]["accuracy"] == by["longmemeval-upstream"]["accuracy"] == pytest.approx(answered / 152)
    assert by["strict"]["accuracy"] == 0.0
    pairs = {(p["a"], p["b"]): p for p in result.runs[0].report["pairs"]}
    # all CORRECT against all WRONG: p_o = 0, p_e = 1 * 0 + 0 * 1 = 0, kappa = 0; the two CORRECT-only
    # protocols agree fully but p_e = 1: kappa undefined
    assert pairs[("suite", "strict")]["agreement"] == 0.0 and pairs[("suite", "strict")]["kappa"] == 0.0
    assert pairs[("suite", "longmemeval-upstream")] == {"a": "suite", "b": "longmemeval-upstream", "agreement": 1.0,
                                                        "kappa": None, "questions": answered}
    assert result.board is None and not result.offline
    assert "sk-j" not in (bm25.run_dir.root / "rejudge" / "model" / "panel.json").read_text()
