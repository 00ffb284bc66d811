"""Agreement statistics and the judge panel's reports, against values computed by hand."""

from __future__ import annotations

import doctest
import importlib
import json

import pytest

from aml_ray.scoring.agreement import agreement, cohen_kappa, competition_ranks, kendall_tau
from aml_ray.scoring.panel import board_report, calibration_report, offline_verdict, run_report


@pytest.mark.parametrize("module", ["aml_ray.scoring.agreement", "aml_ray.scoring.panel"])
def test_docstring_examples(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


def test_cohen_kappa_by_hand():
    # 10 questions; a: 6 C / 4 W, b: 5 C / 5 W; both C on 4, both W on 3: p_o = 0.7,
    # p_e = 0.6 * 0.5 + 0.4 * 0.5 = 0.5, kappa = (0.7 - 0.5) / 0.5 = 0.4
    a = ["C"] * 6 + ["W"] * 4
    b = ["C", "C", "C", "C", "W", "W", "C", "W", "W", "W"]
    assert agreement(a, b) == pytest.approx(0.7)
    assert cohen_kappa(a, b) == pytest.approx(0.4)
    # three labels: a = C C W E, b = C W W E: p_o = 3/4; p_e = (2*1 + 1*2 + 1*1) / 16 = 5/16;
    # kappa = (12/16 - 5/16) / (11/16) = 7/11
    assert cohen_kappa(["C", "C", "W", "E"], ["C", "W", "W", "E"]) == pytest.approx(7 / 11)
    # one judge constant, the other not: p_e = 1 * 0.5 = 0.5, p_o = 0.5 -> 0 (chance agreement)
    assert cohen_kappa(["C", "C", "C", "C"], ["C", "C", "W", "W"]) == pytest.approx(0.0)
    assert cohen_kappa(["W", "W"], ["W", "W"]) is None and cohen_kappa([], []) is None
    with pytest.raises(ValueError, match="same questions"):
        cohen_kappa(["C"], ["C", "W"])


def test_ranks_and_kendall_tau_by_hand():
    assert competition_ranks({"a": 0.2, "b": 0.9, "c": 0.2, "d": 0.5}) == {"a": 3, "b": 1, "c": 3, "d": 2}
    # (0.9, 0.5, 0.1, 0.3) vs (0.8, 0.7, 0.6, 0.1): pairs (1,2) C, (1,3) C, (1,4) C, (2,3) C, (2,4) C,
    # (3,4) D -> tau = (5 - 1) / 6
    assert kendall_tau([0.9, 0.5, 0.1, 0.3], [0.8, 0.7, 0.6, 0.1]) == pytest.approx(4 / 6)
    assert kendall_tau([0.1, 0.2], [0.2, 0.1]) == pytest.approx(-1.0)
    assert kendall_tau([0.5], [0.5]) is None


def _rows(labels: list[str | None], *, excluded: tuple[int, ...] = ()) -> list[dict]:
    rows = []
    for i, label in enumerate(labels):
        answered = label is not None
        rows.append({"question_id": f"q{i}", "excluded": i in excluded, "answer_status": "ok" if answered else "error",
                     "status": "scored" if answered and label != "judge_error" else
                               ("judge_error" if answered else "answer_error"),
                     "verdict": label if label in ("CORRECT", "WRONG") else None, "question": f"Q{i}",
                     "gold": json.dumps(["g"]), "answer": "x" * 400, "category": "1"})
    return rows


def test_run_report_by_hand():
    judged = {
        "suite": _rows(["CORRECT", "CORRECT", "WRONG", "CORRECT", None, "CORRECT"], excluded=(5,)),
        "strict": _rows(["CORRECT", "WRONG", "WRONG", "judge_error", None, "WRONG"], excluded=(5,)),
    }
    report = run_report(judged)
    suite, strict = report["protocols"]
    # 5 non-excluded questions (the answer_error one counts 0): 3/5 and 1/5
    assert (suite["accuracy"], strict["accuracy"]) == (pytest.approx(0.6), pytest.approx(0.2))
    assert suite["questions"] == 5 and suite["answered"] == 4 and strict["judge_errors"] == 1
    assert suite["ci_low"] <= 0.6 <= suite["ci_high"]
    # over the 4 answered: suite C C W C, strict C W W E: p_o = 2/4; p_e = (3/4 * 1/4) + (1/4 * 2/4) = 5/16;
    # kappa = (8/16 - 5/16) / (11/16) = 3/11
    (pair,) = report["pairs"]
    assert pair["agreement"] == pytest.approx(0.5) and pair["kappa"] == pytest.approx(3 / 11)
    assert report["spread"] == pytest.approx(0.4)
    assert [d["question_id"] for d in report["disagreements"]] == ["q1", "q3"]
    assert report["disagreements"][1]["labels"] == {"suite": "CORRECT", "strict": "judge_error"}
    assert len(report["disagreements"][0]["answer"]) == 300  # clipped
    with pytest.raises(ValueError, match="other questions"):
        run_report({"a": _rows(["CORRECT"]), "b": _rows(["CORRECT", "WRONG"])})


def test_calibration_and_board_reports_by_hand():
    human = ["CORRECT", "CORRECT", "WRONG", "WRONG", "WRONG"]
    cal = calibration_report(human, {"suite": ["CORRECT", "CORRECT", "CORRECT", "WRONG", "WRONG"],
                                     "strict": ["CORRECT", "WRONG", "WRONG", "WRONG", "WRONG"]})
    suite, strict = cal["protocols"]
    # suite: p_o = 4/5, p_e = (2/5 * 3/5) + (3/5 * 2/5) = 12/25, kappa = (20/25 - 12/25) / (13/25) = 8/13
    assert suite["agreement"] == pytest.approx(0.8) and suite["kappa"] == pytest.approx(8 / 13)
    # strict: p_o = 4/5, p_e = (2/5 * 1/5) + (3/5 * 4/5) = 14/25, kappa = (20 - 14) / (25 - 14) = 6/11
    assert strict["kappa"] == pytest.approx(6 / 11) and strict["accuracy"] == pytest.approx(0.2)
    assert cal["human_correct"] == pytest.approx(0.4) and cal["items"] == 5
    board = board_report({"bm25": {"suite": 0.6, "strict": 0.2}, "dense": {"suite": 0.5, "strict": 0.3},
                          "none": {"suite": 0.0, "strict": 0.0}})
    assert board["ranks"] == {"bm25": {"suite": 1, "strict": 2}, "dense": {"suite": 2, "strict": 1},
                              "none": {"suite": 3, "strict": 3}}
    assert board["flips"] == ["bm25", "dense"]
    assert board["taus"] == [{"a": "suite", "b": "strict", "tau": pytest.approx(1 / 3)}]
    with pytest.raises(ValueError, match="scored under"):
        board_report({"a": {"suite": 0.1}, "b": {"strict": 0.2}})


def test_offline_stand_ins_differ_in_strictness():
    golds = ["7 May 2023"]
    verbose = "Let me think: she went to the group on 7 May 2023, or maybe the week after."
    assert [offline_verdict(p, verbose, golds)[0] for p in ("suite", "longmemeval-upstream", "strict")] == [
        "CORRECT", "CORRECT", "WRONG"]
    assert [offline_verdict(p, "7 May 2023", golds)[0] for p in ("suite", "longmemeval-upstream", "strict")] == [
        "CORRECT"] * 3
    with pytest.raises(ValueError, match="unknown panel protocol"):
        offline_verdict("lenient", "x", golds)
