"""The context-budget curve (aml_ray.explain.budget) on a real run of the planted dataset (tests.planted)."""

from __future__ import annotations

import pytest

from aml_ray.explain.budget import budget_curve, monotone_within_intervals
from tests.planted import gold_only_app, planted_run, write_dataset


@pytest.fixture(scope="module")
def gold_only_run(tmp_path_factory, ray_session):
    tmp = tmp_path_factory.mktemp("budget")
    data = write_dataset(tmp)
    return planted_run(tmp, data, gold_only_app(), "gold-only")


def test_a_budget_too_small_for_the_gold_loses_every_answer(gold_only_run):
    curve = budget_curve(gold_only_run, (3, 1_000, 16_000))
    by_budget = {p["budget"]: p for p in curve["points"]}
    assert curve["questions"] == 3 and curve["cached"] is False
    assert by_budget[3]["accuracy"] == 0.0 and by_budget[3]["questions_cut"] == 3
    assert by_budget[3]["context_tokens"] == {"mean": 0.0, "p95": 0.0}
    for budget in (1_000, 16_000):
        assert by_budget[budget]["accuracy"] == 1.0 and by_budget[budget]["questions_cut"] == 0
        assert 5 < by_budget[budget]["context_tokens"]["mean"] < 20
    assert curve["monotone_within_intervals"] is True
    assert budget_curve(gold_only_run, (16_000, 1_000, 3))["cached"] is True  # the same budgets, in any order


def test_a_budget_below_one_token_is_refused(gold_only_run):
    with pytest.raises(ValueError, match="budgets must be >= 1"):
        budget_curve(gold_only_run, (0, 1_000))


def test_a_curve_that_drops_below_a_smaller_budgets_interval_is_not_monotone():
    points = [{"budget": 1_000, "accuracy": 0.5, "ci_low": 0.45, "ci_high": 0.55},
              {"budget": 2_000, "accuracy": 0.6, "ci_low": 0.55, "ci_high": 0.65},
              {"budget": 4_000, "accuracy": 0.44, "ci_low": 0.40, "ci_high": 0.48}]
    assert monotone_within_intervals(points) is False
    assert monotone_within_intervals(points[:2]) is True
