"""Resolved rule (SWE-bench) and the Coding rates: per condition and repository, coverage, memory gain."""

from __future__ import annotations

import polars as pl
import pytest

from aml_ray.coding.scoring import is_resolved, memory_gain, resolved_rates, summary

F2P, P2P = ("t.py::fix",), ("t.py::keep1", "t.py::keep2")


@pytest.mark.parametrize("tests,status,expected", [
    ({"t.py::fix": "passed", "t.py::keep1": "passed", "t.py::keep2": "passed"}, "ok", True),
    ({"t.py::fix": "xfail", "t.py::keep1": "passed", "t.py::keep2": "skipped"}, "ok", True),
    ({"t.py::fix": "passed", "t.py::keep1": "failed", "t.py::keep2": "passed"}, "ok", False),
    ({"t.py::fix": "failed", "t.py::keep1": "passed", "t.py::keep2": "passed"}, "ok", False),
    ({"t.py::fix": "passed", "t.py::keep1": "passed"}, "ok", False),  # a missing test is not a pass
    ({"t.py::fix": "timeout", "t.py::keep1": "not_run", "t.py::keep2": "not_run"}, "timeout", False),
    ({"t.py::fix": "passed", "t.py::keep1": "passed", "t.py::keep2": "passed"}, "refused", False),
    ({"t.py::fix": "error", "t.py::keep1": "passed", "t.py::keep2": "passed"}, "ok", False),
])
def test_resolved_rule(tests, status, expected):
    assert is_resolved(tests, F2P, P2P, status) is expected


def _attempts() -> pl.DataFrame:
    rows = []
    # repo a: relevant resolves 2/2, noisy 1/2, baseline 0/2
    for cond, res in (("relevant", [True, True]), ("noisy", [True, False]), ("baseline", [False, False])):
        rows += [{"condition": cond, "repo": "a", "status": "scored", "resolved": r} for r in res]
    # repo b: relevant 1 of 2 with a search error (unresolved, out of coverage), noisy 0/2
    rows += [{"condition": "relevant", "repo": "b", "status": "scored", "resolved": True},
             {"condition": "relevant", "repo": "b", "status": "search_error", "resolved": False},
             {"condition": "noisy", "repo": "b", "status": "scored", "resolved": False},
             {"condition": "noisy", "repo": "b", "status": "scored", "resolved": False}]
    return pl.DataFrame(rows)


def test_rates_keep_errors_in_the_denominator():
    rates = resolved_rates(_attempts())
    rel_b = rates.filter((pl.col("condition") == "relevant") & (pl.col("repo") == "b")).to_dicts()[0]
    assert rel_b["n_attempted"] == 2 and rel_b["n_scored"] == 1 and rel_b["coverage"] == 0.5
    assert rel_b["resolved_rate"] == 0.5
    rel = rates.filter((pl.col("condition") == "relevant") & (pl.col("repo") == "overall")).to_dicts()[0]
    assert rel["n_attempted"] == 4 and rel["n_resolved"] == 3 and rel["resolved_rate"] == 0.75
    assert rel["coverage"] == 0.75 and rel["resolved_se"] == pytest.approx((0.75 * 0.25 / 4) ** 0.5)
    assert rates["repo"].to_list()[-1] == "overall"


def test_memory_gain_per_repository_and_overall():
    gains = memory_gain(resolved_rates(_attempts()))
    by_repo = {r["repo"]: r for r in gains.to_dicts()}
    assert by_repo["a"]["gain_vs_noisy"] == 0.5 and by_repo["a"]["gain_vs_baseline"] == 1.0
    assert by_repo["b"]["baseline"] is None and by_repo["b"]["gain_vs_baseline"] is None
    assert by_repo["overall"]["gain_vs_noisy"] == pytest.approx(0.75 - 0.25)
    head = summary(_attempts())
    assert head["gain_vs_noisy"] == pytest.approx(0.5) and head["conditions"]["baseline"]["n_attempted"] == 2


def test_unknown_status_is_refused():
    with pytest.raises(ValueError, match="unknown attempt statuses"):
        resolved_rates(pl.DataFrame([{"condition": "relevant", "repo": "a", "status": "oops", "resolved": True}]))
    assert resolved_rates(pl.DataFrame(schema={"condition": pl.String, "repo": pl.String, "status": pl.String,
                                               "resolved": pl.Boolean})).height == 0


def test_docstring_examples():
    import doctest

    import aml_ray.coding.scoring as mod

    assert doctest.testmod(mod).failed == 0
