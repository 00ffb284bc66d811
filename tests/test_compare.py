"""``aml-ray compare``: McNemar's exact test, pairing, refusals, and two real runs on LoCoMo conv-26.

The runs (made once for the module, through Ray, with the offline answerer and judge): the reference BM25
system, and a loopback participant whose Search always returns ``{"data": []}``.
"""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.cli import app
from aml_ray.compare import (MCNEMAR, SIGN_TEST, LoadedRun, NotComparable, compare_pair, compare_runs, differences,
                             mcnemar_exact)
from aml_ray.config import model_endpoint_from_env
from aml_ray.run.evaluation import EvaluationConfig, evaluate
from aml_ray.run.evidence import read_questions
from aml_ray.reference.server import ReferenceServer
from aml_ray.scoring.bootstrap import paired_difference_ci
from tests.planted import empty_app
from tests.servers import ThreadServer

OFFLINE = {"answer": model_endpoint_from_env("answer", {}), "judge": model_endpoint_from_env("judge", {})}


# --- McNemar's exact test ---------------------------------------------------------------------------------


@pytest.mark.parametrize("gained,lost,expected", [
    (0, 0, 1.0),                      # no discordant question
    (3, 3, 1.0),                      # 2 P(X <= 3) > 1 for Binomial(6, 1/2): capped
    (1, 6, 16 / 128),                 # 2 (C(7,0) + C(7,1)) / 2^7
    (0, 5, 2 / 32),
    (5, 0, 2 / 32),                   # two-sided: symmetric
    (2, 10, 2 * (1 + 12 + 66) / 4096),
])
def test_mcnemar_exact_known_tables(gained, lost, expected):
    assert mcnemar_exact(gained, lost) == pytest.approx(expected, rel=1e-12)


def test_mcnemar_exact_matches_the_binomial_sum_for_a_large_table():
    # 10 vs 25 discordant questions: 2 * sum_{i<=10} C(35, i) / 2^35 = 0.016674 (R: binom.test(10, 35))
    expected = 2 * sum(math.comb(35, i) for i in range(11)) / 2 ** 35
    assert mcnemar_exact(10, 25) == pytest.approx(expected, rel=1e-12)
    assert round(mcnemar_exact(10, 25), 5) == 0.01667
    assert mcnemar_exact(0, 2000) < 1e-300  # exact big integers: 2^2000 never overflows a float on the way
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


# --- pairing on synthetic runs -------------------------------------------------------------------------


def _run(credits: dict[str, float], *, category="1", **info) -> LoadedRun:
    questions = pl.DataFrame({"sample_id": ["s"] * len(credits), "question_id": list(credits),
                              "category": [category] * len(credits), "credit": list(credits.values())})
    base_info = {"run_id": "r", "dataset": {"name": "locomo", "sha256": "x"}, "top_k": 100, "judge_runs": 1}
    return LoadedRun(root=__import__("pathlib").Path("/nowhere"), info=base_info | info, questions=questions)


def test_pair_matches_on_question_ids_and_lists_flips():
    base = _run({"q1": 1.0, "q2": 0.0, "q3": 1.0, "q4": 0.0, "only-a": 1.0})
    other = _run({"q4": 1.0, "q3": 0.0, "q2": 0.0, "q1": 1.0, "only-b": 0.0})  # another order
    c = compare_pair(base, other)
    assert (c["matched"], c["only_in_base"], c["only_in_other"]) == (4, 1, 1)
    overall = c["rows"][-1]
    assert overall["category"] == "overall" and overall["n"] == 4
    assert (overall["accuracy_base"], overall["accuracy_other"], overall["difference"]) == (0.5, 0.5, 0.0)
    assert (overall["gained"], overall["lost"], overall["p_value"], overall["test"]) == (1, 1, 1.0, MCNEMAR)
    assert [f["question_id"] for f in c["flipped"]["gained"]] == ["q4"]
    assert [f["question_id"] for f in c["flipped"]["lost"]] == ["q3"]
    # the interval is the paired bootstrap of the per-question differences, in (sample_id, question_id) order
    assert (overall["difference_ci_low"], overall["difference_ci_high"]) == paired_difference_ci(
        [1.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 1.0])


def test_partial_credit_uses_the_sign_test():
    c = compare_pair(_run({"a": 0.5, "b": 1.0}), _run({"a": 1.0, "b": 1.0}))
    row = c["rows"][-1]
    assert row["test"] == SIGN_TEST and (row["gained"], row["lost"]) == (1, 0) and row["difference"] == 0.25


def test_differences_name_every_entry():
    base = {"dataset": {"name": "locomo", "sha256": "a"}, "top_k": 100, "judge_runs": 1,
            "prompts": {"answer": {"sha256": "p1"}, "judge": {"sha256": "j1"}},
            "models": {"answer": {"model": "m", "temperature": 0}, "judge": {"model": "j", "temperature": 0}}}
    other = json.loads(json.dumps(base))
    other["dataset"]["sha256"], other["top_k"], other["judge_runs"] = "b", 10, 3
    other["prompts"]["judge"]["sha256"], other["models"]["answer"]["model"] = "j2", "m2"
    assert differences(base, other) == [
        "dataset.sha256: 'a' != 'b'", "prompts.judge.sha256: 'j1' != 'j2'", "models.answer.model: 'm' != 'm2'",
        "top_k: 100 != 10", "judge_runs: 1 != 3"]
    with pytest.raises(NotComparable, match="top_k: 100 != 10"):
        compare_pair(_run({"q": 1.0}), _run({"q": 1.0}, top_k=10))
    with pytest.raises(NotComparable, match="no question"):
        compare_pair(_run({"q": 1.0}), _run({"p": 1.0}))


def test_runs_of_different_sizes_are_refused_unless_allowed():
    """10 samples against 2: refused by default, naming both sizes; allowed, the result says so."""
    ten = {"name": "locomo", "sha256": "x", "samples": 10, "scorable_questions": 1540}
    two = {**ten, "samples": 2, "scorable_questions": 304}
    base, other = _run({"q1": 1.0, "q2": 0.0}, dataset=ten), _run({"q1": 1.0, "q2": 1.0}, dataset=two)
    with pytest.raises(NotComparable) as refused:
        compare_pair(base, other)
    assert str(refused.value) == (
        "runs run (r) and run (r) are not comparable: size: 10 sample(s), 1540 scorable question(s) != 2 sample(s), "
        "304 scorable question(s); pass --allow-different-size to compare the questions both runs hold")
    c = compare_pair(base, other, allow_different_size=True)
    assert c["different_size"] is True and c["matched"] == 2
    assert c["sizes"] == {"base": {"samples": 10, "scorable_questions": 1540},
                          "other": {"samples": 2, "scorable_questions": 304}}
    same = compare_pair(base, _run({"q1": 1.0}, dataset=dict(ten)))
    assert same["different_size"] is False


# --- two real runs ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory, locomo_file, ray_session):
    """``(bm25_dir, empty_dir)``: conv-26 (1 sample) against reference:bm25 and against the empty participant."""
    tmp = tmp_path_factory.mktemp("compare")
    with ReferenceServer(tmp / "ref") as ref:
        spec = ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url)
        evaluate(EvaluationConfig(dataset="locomo", participant=spec, out_dir=tmp / "bm25", data_path=locomo_file,
                                  limit_samples=1, run_label="bm25", participant_label="reference:bm25", **OFFLINE))
    with ThreadServer(empty_app()) as server:
        spec = ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search")
        evaluate(EvaluationConfig(dataset="locomo", participant=spec, out_dir=tmp / "empty", data_path=locomo_file,
                                  limit_samples=1, run_label="empty", participant_label="empty", **OFFLINE))
    return tmp / "bm25", tmp / "empty"


def test_a_run_compared_with_itself_differs_by_nothing(runs):
    bm25, _ = runs
    result = compare_runs([bm25, bm25])
    c = result["comparisons"][0]
    assert result["dataset"] == "locomo" and result["bootstrap"]["resamples"] == 2000
    assert c["matched"] == 152 and c["only_in_base"] == c["only_in_other"] == 0  # conv-26: 199 questions, 47 excluded
    assert [r["category"] for r in c["rows"]] == ["1", "2", "3", "4", "overall"]
    for r in c["rows"]:
        assert r["difference"] == 0.0 and (r["difference_ci_low"], r["difference_ci_high"]) == (0.0, 0.0)
        assert r["p_value"] == 1.0 and r["gained"] == r["lost"] == 0 and r["test"] == MCNEMAR
        assert r["accuracy_base"] == r["accuracy_other"]
    assert c["flipped"] == {"gained": [], "lost": []}
    # the overall accuracy is the run's own table's (every question matched)
    table = json.loads((bm25 / "results.json").read_text())["table"]
    assert c["rows"][-1]["accuracy_base"] == pytest.approx(table[-1]["accuracy"])


def test_bm25_against_a_participant_that_returns_nothing(runs):
    bm25, empty = runs
    c = compare_runs([bm25, empty])["comparisons"][0]
    overall = c["rows"][-1]
    a = read_questions(__import__("aml_ray.run.evidence", fromlist=["RunDir"]).RunDir(bm25))
    correct = int(a.filter(~pl.col("excluded") & (pl.col("verdict") == "CORRECT")).height)
    assert overall["n"] == 152 and overall["accuracy_base"] == pytest.approx(correct / 152)
    assert overall["accuracy_base"] > 0.2 and overall["accuracy_other"] < overall["accuracy_base"]
    # a significant loss: the interval is below 0 and McNemar's p is tiny
    assert overall["difference"] == pytest.approx(overall["accuracy_other"] - overall["accuracy_base"])
    assert overall["difference_ci_high"] < 0 and overall["p_value"] < 1e-6
    assert overall["lost"] > 30 and overall["lost"] > 5 * overall["gained"]
    assert overall["p_value"] == mcnemar_exact(overall["gained"], overall["lost"])
    assert len(c["flipped"]["lost"]) == overall["lost"] and len(c["flipped"]["gained"]) == overall["gained"]
    lost_ids = {f["question_id"] for f in c["flipped"]["lost"]}
    assert all(q.startswith("conv-26:q") for q in lost_ids)
    # per category: the counts add up to the overall row
    per_cat = c["rows"][:-1]
    assert sum(r["n"] for r in per_cat) == 152 and sum(r["lost"] for r in per_cat) == overall["lost"]
    assert np.isclose(sum(r["difference"] * r["n"] for r in per_cat) / 152, overall["difference"])


def test_cli_compare_tables_and_json(runs):
    bm25, empty = runs
    runner = CliRunner()
    res = runner.invoke(app, ["compare", str(bm25), str(bm25), str(empty)])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "A = bm25" in text and "B = empty" in text and "McNemar" in text and "152 matched questions" in text
    assert "overall" in text and "1 multi-hop" in text
    res = runner.invoke(app, ["compare", "--json", str(bm25), str(empty)])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["comparisons"][0]["rows"][-1]["p_value"] < 1e-6
    assert data["comparisons"][0]["flipped"]["lost"][0]["question_id"].startswith("conv-26:q")


@pytest.fixture(scope="module")
def two_sample_run(tmp_path_factory, locomo_file, ray_session):
    """conv-26 and conv-30 (2 samples) against the empty participant: a run twice the size of ``runs``'."""
    out = tmp_path_factory.mktemp("compare_two") / "empty2"
    with ThreadServer(empty_app()) as server:
        spec = ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search")
        evaluate(EvaluationConfig(dataset="locomo", participant=spec, out_dir=out, data_path=locomo_file,
                                  limit_samples=2, run_label="empty2", participant_label="empty", **OFFLINE))
    return out


def test_cli_compare_refuses_runs_of_different_sizes_unless_allowed(runs, two_sample_run):
    bm25, _ = runs
    other = json.loads((two_sample_run / "run.json").read_text())["dataset"]
    assert other["samples"] == 2 and other["scorable_questions"] > 152
    sizes = (f"1 sample(s), 152 scorable question(s) != 2 sample(s), {other['scorable_questions']} scorable "
             "question(s)")
    res = CliRunner().invoke(app, ["compare", str(bm25), str(two_sample_run)])
    text = " ".join(res.output.split())
    assert res.exit_code == 2, text
    assert "not comparable" in text and sizes in text and "--allow-different-size" in text
    res = CliRunner().invoke(app, ["compare", "--allow-different-size", str(bm25), str(two_sample_run)])
    table, warning = " ".join(res.stdout.split()), " ".join(res.stderr.split())
    assert res.exit_code == 0, res.output
    marked = (f"DIFFERENT SIZES: A 1 sample(s), 152 scorable question(s); B 2 sample(s), "
              f"{other['scorable_questions']} scorable question(s): only the 152 questions both hold are compared")
    assert marked in table and "152 matched questions" in table  # in the table's title, beside the caption
    assert f"only in B {other['scorable_questions'] - 152}" in table
    assert warning.startswith("warning: empty2") and marked in warning
    res = CliRunner().invoke(app, ["compare", "--json", "--allow-different-size", str(bm25), str(two_sample_run)])
    assert res.exit_code == 0 and marked in " ".join(res.stderr.split())
    c = json.loads(res.stdout)["comparisons"][0]
    assert c["different_size"] is True and c["matched"] == 152
    assert c["sizes"]["other"] == {"samples": 2, "scorable_questions": other["scorable_questions"]}
    assert c["only_in_other"] == other["scorable_questions"] - 152


def test_cli_compare_refuses_runs_that_differ(runs, tmp_path):
    bm25, empty = runs
    changed = tmp_path / "changed"
    shutil.copytree(empty, changed)
    info = json.loads((changed / "run.json").read_text())
    info["top_k"] = 10
    info["prompts"]["judge"]["sha256"] = "0" * 64
    info["models"]["judge"]["model"] = "another-judge"
    (changed / "run.json").write_text(json.dumps(info))
    res = CliRunner().invoke(app, ["compare", str(bm25), str(changed)])
    assert res.exit_code == 2
    text = " ".join(res.output.split())
    assert "not comparable" in text and "top_k: 100 != 10" in text and "prompts.judge.sha256" in text
    assert "models.judge.model" in text and "another-judge" in text
    res = CliRunner().invoke(app, ["compare", str(bm25)])
    assert res.exit_code == 2 and "at least two" in res.output
    res = CliRunner().invoke(app, ["compare", str(bm25), str(tmp_path / "nothing")])
    assert res.exit_code == 2 and "no run.json" in res.output
