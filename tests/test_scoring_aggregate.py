"""Aggregation: denominators, coverage, excluded rows, per-category and overall rows, latency."""

import math
import statistics

import polars as pl
import pytest

from aml_ray.scoring.aggregate import OVERALL, RESULT_SCHEMA, aggregate, latency_summary


def _rows(rows):
    """Build a results frame from (dataset, category, excluded, status, verdict, f1, bleu1) tuples."""
    return pl.DataFrame(
        rows,
        schema={
            "dataset": pl.String,
            "category": pl.String,
            "excluded": pl.Boolean,
            "status": pl.String,
            "verdict": pl.String,
            "f1": pl.Float64,
            "bleu1": pl.Float64,
        },
        orient="row",
    )


def _row(result, dataset, category):
    selected = result.filter((pl.col("dataset") == dataset) & (pl.col("category") == category))
    assert selected.height == 1
    return selected.row(0, named=True)


def test_answer_errors_stay_in_denominator():
    # 10 questions: 2 answer errors, 7 CORRECT of the other 8 -> accuracy 7/10, coverage 8/10
    rows = [("locomo", "4", False, "answer_error", None, None, None)] * 2
    rows += [("locomo", "4", False, "scored", "CORRECT", 1.0, 0.5)] * 7
    rows += [("locomo", "4", False, "scored", "WRONG", 0.0, 0.0)]
    result = aggregate(_rows(rows))
    for category in ("4", OVERALL):
        row = _row(result, "locomo", category)
        assert row["accuracy"] == pytest.approx(0.70)
        assert row["accuracy"] != pytest.approx(0.875)
        assert row["coverage"] == pytest.approx(0.8)
        assert row["n_total"] == 10 and row["n_scored"] == 8 and row["n_errors"] == 2
        # sample variance 0.7 * 0.3 * 10 / 9: se = sqrt(0.21 / 9) = 0.1527525...
        assert row["accuracy_se"] == pytest.approx(math.sqrt(0.21 / 9))
        assert row["accuracy_se"] == pytest.approx(0.152752523, abs=1e-9)
        # f1: 7 * 1.0 / 10; bleu1: 7 * 0.5 / 10 (errors count 0)
        assert row["f1"] == pytest.approx(0.7)
        assert row["bleu1"] == pytest.approx(0.35)


def test_every_error_status_counts_as_wrong_and_zero():
    rows = [
        ("d", "1", False, "scored", "CORRECT", 0.8, 0.6),
        ("d", "1", False, "judge_error", None, 0.9, 0.9),  # lexical scores present but not scored
        ("d", "1", False, "search_error", "CORRECT", None, None),  # stray verdict is ignored
        ("d", "1", False, "answer_error", None, None, None),
    ]
    row = _row(aggregate(_rows(rows)), "d", "1")
    assert row["n_total"] == 4 and row["n_scored"] == 1 and row["n_errors"] == 3
    assert row["accuracy"] == pytest.approx(0.25)
    assert row["coverage"] == pytest.approx(0.25)
    assert row["f1"] == pytest.approx(0.2)
    assert row["bleu1"] == pytest.approx(0.15)
    # sqrt(0.25 * 0.75 / 3) = 0.25
    assert row["accuracy_se"] == pytest.approx(0.25)


def test_excluded_rows_are_only_counted():
    rows = [
        ("locomo", "4", False, "scored", "CORRECT", 1.0, 1.0),
        ("locomo", "4", False, "scored", "WRONG", 0.0, 0.0),
        ("locomo", "4", True, "scored", "WRONG", 0.0, 0.0),
        ("locomo", "5", True, "scored", "CORRECT", 1.0, 1.0),
        ("locomo", "5", True, "answer_error", None, None, None),
    ]
    result = aggregate(_rows(rows))
    cat4 = _row(result, "locomo", "4")
    assert (cat4["n_total"], cat4["n_excluded"], cat4["accuracy"]) == (2, 1, 0.5)
    assert cat4["coverage"] == 1.0
    cat5 = _row(result, "locomo", "5")
    assert (cat5["n_total"], cat5["n_scored"], cat5["n_errors"], cat5["n_excluded"]) == (0, 0, 0, 2)
    for metric in ("coverage", "accuracy", "accuracy_se", "f1", "bleu1"):
        assert cat5[metric] is None
    overall = _row(result, "locomo", OVERALL)
    assert (overall["n_total"], overall["n_excluded"], overall["accuracy"]) == (2, 3, 0.5)
    # p = 0.5, n = 2: sqrt(0.25 / 1)
    assert overall["accuracy_se"] == pytest.approx(0.5)


def test_per_category_rows_and_micro_averaged_overall():
    rows = [
        ("locomo", "1", False, "scored", "CORRECT", 1.0, 1.0),
        ("locomo", "1", False, "scored", "WRONG", 0.0, 0.0),
        ("locomo", "2", False, "scored", "CORRECT", 0.5, 0.25),
        ("locomo", "2", False, "scored", "CORRECT", 0.5, 0.25),
        ("locomo", "2", False, "scored", "CORRECT", 0.5, 0.25),
        ("locomo", "2", False, "judge_error", None, None, None),
    ]
    result = aggregate(_rows(rows))
    assert result.select("dataset", "category").rows() == [
        ("locomo", "1"),
        ("locomo", "2"),
        ("locomo", OVERALL),
    ]
    assert _row(result, "locomo", "1")["accuracy"] == pytest.approx(0.5)
    assert _row(result, "locomo", "2")["accuracy"] == pytest.approx(0.75)
    overall = _row(result, "locomo", OVERALL)
    # micro average: 4 correct of 6, not the mean of 0.5 and 0.75
    assert overall["accuracy"] == pytest.approx(4 / 6)
    assert overall["coverage"] == pytest.approx(5 / 6)
    assert overall["f1"] == pytest.approx((1.0 + 1.5) / 6)
    assert overall["bleu1"] == pytest.approx((1.0 + 0.75) / 6)


def test_rows_sorted_by_dataset_then_category_overall_last():
    rows = [
        ("locomo", cat, False, "scored", "CORRECT", 1.0, 1.0)
        for cat in ("10", "2", "temporal", "1")
    ] + [("longmemeval", "multi-session", False, "scored", "WRONG", 0.0, 0.0)]
    # "overall" sorts last even against names after it alphabetically (e.g. "temporal")
    result = aggregate(_rows(list(reversed(rows))))
    assert result.select("dataset", "category").rows() == [
        ("locomo", "1"),
        ("locomo", "2"),
        ("locomo", "10"),
        ("locomo", "temporal"),
        ("locomo", OVERALL),
        ("longmemeval", "multi-session"),
        ("longmemeval", OVERALL),
    ]
    assert _row(result, "longmemeval", OVERALL)["accuracy"] == 0.0
    assert _row(result, "longmemeval", OVERALL)["accuracy_se"] is None  # one question: no spread to measure


def test_result_schema_and_empty_input():
    rows = [("d", "1", False, "scored", "CORRECT", 1.0, 1.0)]
    result = aggregate(_rows(rows))
    assert dict(result.schema) == RESULT_SCHEMA
    empty = aggregate(_rows([]))
    assert empty.height == 0 and dict(empty.schema) == RESULT_SCHEMA


def test_scored_row_without_verdict_is_not_correct():
    rows = [
        ("d", "1", False, "scored", None, 1.0, 1.0),
        ("d", "1", False, "scored", "CORRECT", 1.0, 1.0),
    ]
    row = _row(aggregate(_rows(rows)), "d", "1")
    assert row["accuracy"] == pytest.approx(0.5) and row["coverage"] == 1.0


def test_invalid_input_raises():
    good = _rows([("d", "1", False, "scored", "CORRECT", 1.0, 1.0)])
    with pytest.raises(ValueError, match="lacks columns"):
        aggregate(good.drop("bleu1"))
    bad_status = good.with_columns(pl.lit("timeout").alias("status"))
    with pytest.raises(ValueError, match="allowed: scored, answer_error, judge_error, search_error"):
        aggregate(bad_status)
    with pytest.raises(ValueError, match="excluded"):
        aggregate(good.with_columns(pl.lit(None, dtype=pl.Boolean).alias("excluded")))


# --- latency ---------------------------------------------------------------------------------------


def test_latency_linear_interpolation():
    # positions q*(n-1): p50 at 2 -> 30; p95 at 3.8 -> 40 + 0.8 * 10 = 48
    assert latency_summary([50, 10, 40, 30, 20]) == {"p50": 30.0, "p95": 48.0, "n": 5}


def test_latency_one_to_hundred():
    # p50 at 49.5 -> 50.5; p95 at 94.05 -> 95 + 0.05 = 95.05
    summary = latency_summary(pl.Series(range(1, 101)))
    assert summary["n"] == 100
    assert summary["p50"] == pytest.approx(50.5)
    assert summary["p95"] == pytest.approx(95.05)


def test_latency_drops_nulls_and_nans_and_handles_empty():
    assert latency_summary(pl.Series([None, 12.0, float("nan")])) == {"p50": 12.0, "p95": 12.0, "n": 1}
    assert latency_summary([]) == {"p50": None, "p95": None, "n": 0}
    assert latency_summary([None, 7.0]) == {"p50": 7.0, "p95": 7.0, "n": 1}


def test_partial_credit_from_score_column():
    # a rubric scorer gives 1, 0.5 and 0; one question failed to answer: mean credit over all 4
    rows = pl.DataFrame({
        "dataset": ["beam"] * 4, "category": ["summarization"] * 4, "excluded": [False] * 4,
        "status": ["scored", "scored", "scored", "answer_error"],
        "verdict": [None] * 4, "score": [1.0, 0.5, 0.0, None],
        "f1": [None] * 4, "bleu1": [None] * 4,
    })
    overall = aggregate(rows).filter(pl.col("category") == "overall").to_dicts()[0]
    assert overall["accuracy"] == pytest.approx(1.5 / 4)
    # sample variance of [1, .5, 0, 0] is 0.6875 / 3 -> se = sqrt(0.6875 / 3 / 4)
    assert overall["accuracy_se"] == pytest.approx((0.6875 / 3 / 4) ** 0.5)
    assert overall["coverage"] == 0.75


def test_partial_credit_standard_error_uses_the_sample_variance():
    # rubric credits of five questions; the standard error of their mean is stdev (divisor n - 1) / sqrt(n),
    # 0.1871 here, where the population variance gave 0.1673
    credits = [1.0, 0.5, 0.5, 0.0, 0.0]
    rows = pl.DataFrame({"dataset": ["beam"] * 5, "category": ["summarization"] * 5, "excluded": [False] * 5,
                         "status": ["scored"] * 5, "verdict": [None] * 5, "score": credits,
                         "f1": [None] * 5, "bleu1": [None] * 5})
    overall = aggregate(rows).filter(pl.col("category") == "overall").to_dicts()[0]
    assert overall["accuracy_se"] == pytest.approx(statistics.stdev(credits) / math.sqrt(5))
    assert round(overall["accuracy_se"], 4) == 0.1871
    assert round(statistics.pstdev(credits) / math.sqrt(5), 4) == 0.1673


# --- bootstrap interval beside every accuracy ---------------------------------------------------------


def test_accuracy_interval_is_the_bootstrap_of_the_credits():
    from aml_ray.scoring.bootstrap import mean_ci

    # 100 questions: 10 answer errors, 40 CORRECT, 50 WRONG -> accuracy 0.40 (errors count 0)
    rows = [("locomo", "4", False, "answer_error", None, None, None)] * 10
    rows += [("locomo", "4", False, "scored", "CORRECT", 1.0, 1.0)] * 40
    rows += [("locomo", "4", False, "scored", "WRONG", 0.0, 0.0)] * 50
    rows += [("locomo", "5", True, "scored", "WRONG", 0.0, 0.0)] * 7  # excluded: never resampled
    result = aggregate(_rows(rows))
    for category in ("4", OVERALL):
        row = _row(result, "locomo", category)
        assert row["accuracy"] == pytest.approx(0.40)
        low, high = row["accuracy_ci_low"], row["accuracy_ci_high"]
        assert (low, high) == mean_ci([1.0] * 40 + [0.0] * 60)
        assert low < 0.40 < high
        # seed 0, 2,000 resamples: the 2.5th / 97.5th percentiles of the resample means (steps of 0.01)
        assert (round(low, 2), round(high, 2)) == (0.31, 0.49)
        # within one step of the normal approximation's width 2 * 1.96 * sqrt(0.4 * 0.6 / 100) = 0.192
        assert abs((high - low) - 0.192) <= 0.015
        assert row["accuracy_se"] == pytest.approx(math.sqrt(0.24 / 99))  # the standard error stays
    cat5 = _row(result, "locomo", "5")
    assert cat5["accuracy_ci_low"] is None and cat5["accuracy_ci_high"] is None


def test_accuracy_interval_ignores_row_order():
    rows = [("d", "1", False, "scored", "CORRECT" if i % 3 else "WRONG", 0.0, 0.0) for i in range(60)]
    forward, backward = aggregate(_rows(rows)), aggregate(_rows(list(reversed(rows))))
    assert forward.equals(backward)
    row = _row(forward, "d", "1")
    assert row["accuracy"] == pytest.approx(40 / 60)
    assert row["accuracy_ci_low"] < 40 / 60 < row["accuracy_ci_high"]


def test_accuracy_interval_of_partial_credit_and_of_a_constant_group():
    rows = pl.DataFrame({
        "dataset": ["beam"] * 4 + ["x"] * 3, "category": ["s"] * 4 + ["1"] * 3, "excluded": [False] * 7,
        "status": ["scored"] * 7, "verdict": [None] * 4 + ["CORRECT"] * 3, "score": [1.0, 0.5, 0.0, 0.5] + [None] * 3,
        "f1": [None] * 7, "bleu1": [None] * 7,
    })
    result = aggregate(rows)
    beam = _row(result, "beam", OVERALL)
    assert 0.0 <= beam["accuracy_ci_low"] <= 0.5 <= beam["accuracy_ci_high"] <= 1.0
    x = _row(result, "x", OVERALL)  # every question right: every resample has mean 1
    assert (x["accuracy_ci_low"], x["accuracy_ci_high"]) == (1.0, 1.0)
