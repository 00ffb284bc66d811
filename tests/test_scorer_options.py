"""Option-letter scoring (ScriptMem, as its src/evaluate.py reads answers): every rule, the reader, the scorer's rows."""

from __future__ import annotations

import doctest
import json

import pytest

from aml_ray.stages import options
from aml_ray.stages.options import normalize_prediction, option_rows, read_letters, score_letters
from aml_ray.stages.scorers import get_scorer

OPTIONS_6 = [f"{c}. option {c}" for c in "ABCDEF"]


def row(answer, gold, rule, *, answer_status="ok", n_options=6, **kw) -> dict:
    r = {"question_id": "angry:conv-0#q0000", "category": rule, "options": OPTIONS_6[:n_options],
         "gold": json.dumps(gold), "answer": answer, "search_status": "ok", "answer_status": answer_status,
         "judge_status": None, "verdict": None, "score": None, "score_detail": None, "f1": None, "bleu1": None}
    r.update(kw)
    return r


def score(answer: str, gold: list[str], rule: str) -> float:
    return score_letters(rule, gold, read_letters(answer, rule))


def test_docstring_examples():
    result = doctest.testmod(options)
    assert result.failed == 0 and result.attempted >= 8


@pytest.mark.parametrize("answer, expected", [("(B)", 1.0), ("B", 1.0), ("(b).", 1.0), ("Answer: (B)", 1.0),
                                              ("(C)", 0.0), ("(B, C)", 0.0), ("\\boxed{B}", 1.0),
                                              ("(B. Juror 8)", 1.0), ("The answer is B", 0.0)])
def test_single_choice_is_exact(answer, expected):
    assert score(answer, ["B"], "single_choice") == expected


def test_multi_select_is_set_equality():
    assert score("(A, C, D)", ["A", "C", "D"], "multi_select") == 1.0
    assert score("(D, A, C)", ["A", "C", "D"], "multi_select") == 1.0  # order is free
    assert score("(A, C)", ["A", "C", "D"], "multi_select") == 0.0  # incomplete
    assert score("(A, C, D, E)", ["A", "C", "D"], "multi_select") == 0.0  # overreach


def test_multi_select_with_a_duplicate_letter_scores_zero():
    # The distinct letters equal the gold set, but a repeated letter is malformed (ScriptMem score_item).
    extraction = read_letters("(A, C, C, D)", "multi_select")
    assert extraction.malformed and extraction.reason == "duplicate letter C"
    assert extraction.letters == ("A", "C", "C", "D")
    assert score_letters("multi_select", ["A", "C", "D"], extraction) == 0.0


def test_ordering_is_the_exact_sequence_and_one_swap_scores_zero():
    gold = ["D", "A", "C", "B"]
    assert score("(D, A, C, B)", gold, "ordering") == 1.0
    assert score("D -> A -> C -> B", gold, "ordering") == 1.0  # every letter A-F, in order
    assert score("(D, C, A, B)", gold, "ordering") == 0.0  # one adjacent swap
    assert score("(D, A, C)", gold, "ordering") == 0.0  # one missing
    assert score("(D, A, D, B)", gold, "ordering") == 0.0  # duplicate: malformed


@pytest.mark.parametrize("answer", ["", None, "I think it is the second one.", "(X)", "(A)(B)",
                                    "(A) ... on reflection (B)"])
def test_unreadable_or_malformed_answers_score_zero(answer):
    for rule, gold in (("single_choice", ["A"]), ("multi_select", ["A", "B"]), ("ordering", ["A", "B"])):
        assert score_letters(rule, gold, read_letters(answer, rule)) == 0.0, (answer, rule)


@pytest.mark.parametrize("answer, reason", [("", "empty answer"), (None, "empty answer"),
                                            ("(A)(B)", "letter groups side by side"),
                                            ("I think it is the second one.", "no option letters found")])
def test_single_choice_reasons(answer, reason):
    assert read_letters(answer, "single_choice").reason == reason


def test_letter_reader_follows_upstreams_normalisation():
    assert normalize_prediction("  \\boxed{D, A, C, B} ") == "D, A, C, B"
    assert normalize_prediction("\\box{C") == "C"  # an unclosed box at the end is read
    # the text after "final answer:" first, then the text after </think> (upstream's order)
    assert normalize_prediction("<think>x</think> Final answer: (B)") == "(B)"
    assert normalize_prediction("Final answer: (B)</think> (C)") == "(C)"
    assert read_letters("<think>(A) or (C)?</think>\n(C)", "single_choice").letters == ("C",)
    assert read_letters("The answer is (B). Final: (B)", "single_choice").letters == ("B",)
    assert read_letters("(see the memories) [D; A; C; B]", "ordering").letters == ("D", "A", "C", "B")
    assert read_letters("[B: Juror 8]", "single_choice").letters == ("B",)
    assert read_letters("(AC)", "single_choice").letters == ("A",)  # a short word: its first letter (upstream)


def test_unknown_rule_and_bad_inputs_raise():
    with pytest.raises(ValueError, match="unknown option rule"):
        score_letters("true_false", ["A"], read_letters("(A)", "single_choice"))
    with pytest.raises(ValueError, match="unknown option rule"):
        read_letters("(A)", "true_false")
    with pytest.raises(ValueError, match="gold letters are empty"):
        score_letters("single_choice", [], read_letters("(A)", "single_choice"))


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
    assert detail == {"rule": "multi_select", "gold": ["A", "C"], "letters": ["A", "C", "C"], "malformed": True,
                      "reason": "duplicate letter C"}
    assert rows[0]["judge_status"] == "ok" and rows[0]["judge_attempts"] == 0 and rows[0]["judge_verdicts"] == ["CORRECT"]
    assert rows[0]["f1"] is None  # lexical metrics do not apply to letters
    assert "true_false" in rows[4]["judge_error"] and rows[4]["score"] is None


def test_registered_as_option_match():
    assert get_scorer("option_match") is option_rows
