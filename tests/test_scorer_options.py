"""Option-letter scoring (ScriptMem): fixed cases for every rule, the letter reader, and the scorer's rows."""

from __future__ import annotations

import doctest
import json

import pytest

from aml_ray.stages import options
from aml_ray.stages.options import extract_letters, option_rows, score_letters
from aml_ray.stages.scorers import get_scorer

OPTIONS_6 = [f"{c}. option {c}" for c in "ABCDEF"]


def row(answer, gold, rule, *, answer_status="ok", n_options=6, **kw) -> dict:
    r = {"question_id": "angry:conv-0#q0000", "category": rule, "options": OPTIONS_6[:n_options],
         "gold": json.dumps(gold), "answer": answer, "search_status": "ok", "answer_status": answer_status,
         "judge_status": None, "verdict": None, "score": None, "score_detail": None, "f1": None, "bleu1": None}
    r.update(kw)
    return r


def score(answer: str, gold: list[str], rule: str, n_options: int = 6) -> float:
    return score_letters(rule, gold, extract_letters(answer, n_options))


def test_docstring_examples():
    result = doctest.testmod(options)
    assert result.failed == 0 and result.attempted >= 6


@pytest.mark.parametrize("answer, expected", [("(B)", 1.0), ("B", 1.0), ("(b).", 1.0), ("Answer: (B)", 1.0),
                                              ("(C)", 0.0), ("(B, C)", 0.0)])
def test_single_choice_is_exact(answer, expected):
    assert score(answer, ["B"], "single_choice") == expected


def test_multi_select_is_set_equality():
    assert score("(A, C, D)", ["A", "C", "D"], "multi_select") == 1.0
    assert score("(D, A, C)", ["A", "C", "D"], "multi_select") == 1.0  # order is free
    assert score("(A, C)", ["A", "C", "D"], "multi_select") == 0.0  # incomplete
    assert score("(A, C, D, E)", ["A", "C", "D"], "multi_select") == 0.0  # overreach


def test_multi_select_with_a_duplicate_letter_scores_zero():
    # The distinct letters equal the gold set, but a repeated letter is malformed (ScriptMem score_item).
    extraction = extract_letters("(A, C, C, D)", 6)
    assert extraction.malformed and extraction.reason == "duplicate letter C" and extraction.letters == ()
    assert score_letters("multi_select", ["A", "C", "D"], extraction) == 0.0


def test_ordering_is_the_exact_sequence_and_one_swap_scores_zero():
    gold = ["D", "A", "C", "B"]
    assert score("(D, A, C, B)", gold, "ordering", 4) == 1.0
    assert score("(D, C, A, B)", gold, "ordering", 4) == 0.0  # one adjacent swap
    assert score("(D, A, C)", gold, "ordering", 4) == 0.0  # one missing
    assert score("(D, A, D, B)", gold, "ordering", 4) == 0.0  # duplicate: malformed


@pytest.mark.parametrize("answer, reason", [
    ("", "empty answer"),
    (None, "empty answer"),
    ("I think it is the second one.", "no option letters found"),
    ("(AC)", "no option letters found"),
    ("(X)", "letter X is not an option"),
    ("(E)", "letter E is not an option"),
    ("(A) ... on reflection (B)", "conflicting letter groups"),
])
def test_malformed_answers_score_zero(answer, reason):
    extraction = extract_letters(answer, 4)
    assert extraction.malformed and extraction.reason.startswith(reason)
    for rule, gold in (("single_choice", ["A"]), ("multi_select", ["A", "B"]), ("ordering", ["A", "B"])):
        assert score_letters(rule, gold, extraction) == 0.0


def test_letter_reader_tolerates_reasoning_and_repeated_identical_groups():
    assert extract_letters("<think>(A) or (C)?</think>\n(C)", 4).letters == ("C",)
    assert extract_letters("The answer is (B). Final: (B)", 4).letters == ("B",)
    assert extract_letters("(see the memories) [D; A; C; B]", 4).letters == ("D", "A", "C", "B")


def test_unknown_rule_and_bad_inputs_raise():
    with pytest.raises(ValueError, match="unknown option rule"):
        score_letters("true_false", ["A"], extract_letters("(A)", 2))
    with pytest.raises(ValueError, match="n_options"):
        extract_letters("(A)", 0)


async def test_option_rows_fill_the_judge_columns_and_status():
    rows = [row("(B)", ["B"], "single_choice"), row("(A, C, C)", ["A", "C"], "multi_select"),
            row("(D, C, A, B)", ["D", "A", "C", "B"], "ordering", n_options=4),
            row(None, ["A"], "single_choice", answer_status="error"),
            row("(A)", ["A"], "true_false")]
    await option_rows(rows)
    assert [r["status"] for r in rows] == ["scored", "scored", "scored", "answer_error", "judge_error"]
    assert [r["score"] for r in rows[:3]] == [1.0, 0.0, 0.0]
    assert [r["verdict"] for r in rows[:3]] == ["CORRECT", "WRONG", "WRONG"]
    detail = json.loads(rows[1]["score_detail"])
    assert detail == {"rule": "multi_select", "gold": ["A", "C"], "letters": [], "malformed": True,
                      "reason": "duplicate letter C"}
    assert rows[0]["judge_status"] == "ok" and rows[0]["judge_attempts"] == 0 and rows[0]["judge_verdicts"] == ["CORRECT"]
    assert rows[0]["f1"] is None  # lexical metrics do not apply to letters
    assert "true_false" in rows[4]["judge_error"] and rows[4]["score"] is None


def test_registered_as_option_match():
    assert get_scorer("option_match") is option_rows
