"""Failure attribution (``aml-ray explain``) on real runs through Ray against planted participants.

The planted dataset and participants are in :mod:`tests.planted`: every question is answerable from
its gold turn alone, so a participant that returns the gold at rank 1 yet is answered wrongly has only
synthesis misses, and one that never returns the gold only retrieval misses.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from aml_ray.cli import app
from aml_ray.config import model_endpoint_from_env
from aml_ray.explain.attribution import CLASSES, explain_failures
from aml_ray.explain.reanswer import RunModels
from tests.planted import QUESTIONS, gold_first_app, never_gold_app, planted_run, write_dataset


@pytest.fixture(scope="module")
def planted_runs(tmp_path_factory, ray_session):
    """``(gold_first_dir, never_gold_dir)``: the planted dataset against each planted participant."""
    tmp = tmp_path_factory.mktemp("attribution")
    data = write_dataset(tmp)
    return planted_run(tmp, data, gold_first_app(), "gold-first"), planted_run(tmp, data, never_gold_app(), "never-gold")


def test_gold_at_rank_one_answered_wrong_is_all_synthesis_misses(planted_runs):
    result = explain_failures(planted_runs[0])
    assert result["questions"] == result["wrong"] == len(QUESTIONS)
    assert result["counts"] == {**{c: 0 for c in CLASSES}, "synthesis_miss": 3}
    assert result["shares"]["synthesis_miss"] == 1.0
    assert all(r["first_rank"] == 1 and r["gold_credit"] == 1.0 for r in result["rows"])
    # every question had its gold at rank 1, and none was right
    assert result["p_correct_given_gold_in_top"]["1"] == 0.0
    assert result["p_correct_given_gold_not_retrieved"] is None


def test_gold_never_returned_is_all_retrieval_misses(planted_runs):
    result = explain_failures(planted_runs[1])
    assert result["counts"] == {**{c: 0 for c in CLASSES}, "retrieval_miss": 3}
    assert result["shares"]["retrieval_miss"] == 1.0
    assert {r["gold_answer"] for r in result["rows"]} == {"My favourite colour is teal.", "My dog is called Rufus.",
                                                          "I work as a carpenter in Oslo."}
    assert result["p_correct_given_gold_not_retrieved"] == 0.0


def test_a_second_call_reads_the_cache_and_answers_nothing(planted_runs, monkeypatch):
    first = explain_failures(planted_runs[1])
    calls = []
    monkeypatch.setattr(RunModels, "reanswer", lambda self, rows, **kw: calls.append(rows) or [])
    second = explain_failures(planted_runs[1])
    assert second["cached"] is True and calls == []
    assert second["counts"] == first["counts"]
    on_disk = json.loads((planted_runs[1] / "explain" / "attribution.json").read_text())
    assert on_disk["counts"]["retrieval_miss"] == 3


def test_another_answer_model_is_refused_naming_the_variable(planted_runs):
    online = model_endpoint_from_env("answer", {"ANSWER_API_BASE": "http://127.0.0.1:9/v1", "ANSWER_MODEL": "gpt-4o"})
    with pytest.raises(ValueError, match="ANSWER_MODEL"):
        RunModels(planted_runs[0], answer=online)


def test_explain_command_prints_the_classes_and_the_curve(planted_runs):
    result = CliRunner().invoke(app, ["explain", str(planted_runs[0]), "--budgets", "1k,2k", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["attribution"]["counts"]["synthesis_miss"] == 3
    assert [p["budget"] for p in out["budget_curve"]["points"]] == [1000, 2000]
    assert all(p["accuracy"] == 0.0 for p in out["budget_curve"]["points"])


def test_explain_command_refuses_a_bad_budget(planted_runs):
    result = CliRunner().invoke(app, ["explain", str(planted_runs[0]), "--budgets", "1k,zero"])
    assert result.exit_code == 2
    assert "--budgets" in result.output
