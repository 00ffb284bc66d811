"""Coding track scores: resolved per attempt, resolved rate per condition, memory gain, coverage.

Resolved (source: SWE-bench's harness, ``swebench/harness/grading.py``: ``test_passed`` /
``test_failed`` and ``ResolvedStatus.FULL``): an attempt is resolved when every FAIL_TO_PASS test now
passes and every PASS_TO_PASS test still passes, where

- ``passed`` and ``xfail`` count as passing;
- ``failed``, ``error``, ``timeout`` and ``not_run`` (a test missing from the report) count as failing;
- ``skipped`` counts as neither and is left out of both lists (SWE-bench's success/failure lists);
- a report whose status is ``refused``, ``apply_failed``, ``no_snapshot`` or ``error`` resolves nothing,
  nor does a report with a cross-check flag (:mod:`aml_ray.coding.verdict`).

Rates (source: AML's CAMBench description, "150 software-engineering tasks run under relevant and noisy
memory conditions, for 300 scored attempts"; DESIGN.md: coverage next to every score, an error never
silently leaves the denominator), per condition and per repository plus ``overall``:

- ``n_attempted``: attempts of the group; ``n_scored``: attempts whose status is ``scored`` (the
  platform got a sandbox verdict); ``n_not_run``: attempts whose task has no repository snapshot
  (``no_snapshot``: the operator's gap, not the participant's); ``coverage = n_scored / n_attempted``.
- ``resolved_rate = n_resolved / (n_attempted - n_not_run)``: an attempt that errored (Add, Search,
  model, sandbox) counts as unresolved; ``resolved_se = sqrt(p (1 - p) / (n_attempted - n_not_run))``.
  A group where nothing ran (every attempt ``no_snapshot``, e.g. SWE-ContextBench Lite without the
  operator's snapshots) has a null rate and ``status = "not run"``: never a 0.000 score.
- Memory gain per repository and overall: ``gain_vs_noisy = rate(relevant) - rate(noisy)`` and
  ``gain_vs_baseline = rate(relevant) - rate(baseline)``, null when a side has no attempt or did not
  run (never a +0.000 gain from two empty sides).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from aml_ray.coding.sandbox import TestReport

OVERALL = "overall"
#: Attempt statuses. ``scored``: the sandbox ran (or refused the diff, or the agent gave no diff, which
#: are the agent's outcome); every other status is a platform or participant failure.
ATTEMPT_STATUSES = ("scored", "add_error", "search_error", "model_error", "sandbox_error", "no_snapshot")
PASSING = frozenset({"passed", "xfail"})
NEUTRAL = frozenset({"skipped"})
_NO_VERDICT = frozenset({"refused", "apply_failed", "no_snapshot", "error"})

RATE_SCHEMA = {"condition": pl.String, "repo": pl.String, "n_attempted": pl.Int64, "n_scored": pl.Int64,
               "n_not_run": pl.Int64, "n_resolved": pl.Int64, "coverage": pl.Float64,
               "resolved_rate": pl.Float64, "resolved_se": pl.Float64, "status": pl.String}
NOT_RUN = "not run"
GAIN_SCHEMA = {"repo": pl.String, "relevant": pl.Float64, "noisy": pl.Float64, "baseline": pl.Float64,
               "gain_vs_noisy": pl.Float64, "gain_vs_baseline": pl.Float64}


def is_resolved(tests: Mapping[str, str], fail_to_pass: Sequence[str], pass_to_pass: Sequence[str],
                status: str = "ok") -> bool:
    """SWE-bench's resolved rule on one test report (see the module docstring).

    Examples:
        >>> is_resolved({"t::a": "passed", "t::b": "passed"}, ["t::a"], ["t::b"])
        True
        >>> is_resolved({"t::a": "passed", "t::b": "failed"}, ["t::a"], ["t::b"])
        False
        >>> is_resolved({"t::a": "passed", "t::b": "skipped"}, ["t::a"], ["t::b"])
        True

    Args:
        tests: node id -> outcome.
        fail_to_pass: tests that must now pass.
        pass_to_pass: tests that must still pass.
        status: the report's status; ``refused``/``apply_failed``/``no_snapshot``/``error`` resolve nothing.

    Returns:
        True when every named test that is not skipped passes (a list whose tests are all skipped
        counts as passed, as SWE-bench's rate of an empty list is 1).
    """
    if status in _NO_VERDICT:
        return False
    for test in (*fail_to_pass, *pass_to_pass):
        outcome = tests.get(test, "not_run")
        if outcome in NEUTRAL:
            continue
        if outcome not in PASSING:
            return False
    return True


def report_resolved(report: TestReport, fail_to_pass: Sequence[str], pass_to_pass: Sequence[str]) -> bool:
    """:func:`is_resolved` on a :class:`TestReport`; a report whose cross-check raised a flag (pytest's exit
    status, summary line or its own observations disagree with the per-test records:
    :mod:`aml_ray.coding.verdict`) resolves nothing."""
    return not report.flags and is_resolved(report.tests, fail_to_pass, pass_to_pass, report.status)


def _rates(df: pl.DataFrame) -> pl.DataFrame:
    n = pl.len()
    return df.agg(
        n.cast(pl.Int64).alias("n_attempted"),
        (pl.col("status") == "scored").sum().cast(pl.Int64).alias("n_scored"),
        (pl.col("status") == "no_snapshot").sum().cast(pl.Int64).alias("n_not_run"),
        (pl.col("resolved") & (pl.col("status") == "scored")).sum().cast(pl.Int64).alias("n_resolved"),
    )


def resolved_rates(attempts: pl.DataFrame) -> pl.DataFrame:
    """Per (condition, repository) and per condition ``overall`` rates (see the module docstring).

    Args:
        attempts: one row per attempt with ``condition``, ``repo``, ``status`` (one of
            :data:`ATTEMPT_STATUSES`) and ``resolved`` (bool).

    Returns:
        A frame of :data:`RATE_SCHEMA`, sorted by condition then repository, ``overall`` last.

    Raises:
        ValueError: a missing column or an unknown status.
    """
    missing = [c for c in ("condition", "repo", "status", "resolved") if c not in attempts.columns]
    if missing:
        raise ValueError(f"attempts frame lacks columns {missing}")
    bad = sorted(set(attempts["status"].to_list()) - set(ATTEMPT_STATUSES))
    if bad:
        raise ValueError(f"unknown attempt statuses {bad}; allowed: {', '.join(ATTEMPT_STATUSES)}")
    if attempts.height == 0:
        return pl.DataFrame(schema=RATE_SCHEMA)
    base = attempts.select("condition", "repo", "status", pl.col("resolved").fill_null(False))
    per_repo = _rates(base.group_by("condition", "repo"))
    overall = _rates(base.group_by("condition")).with_columns(pl.lit(OVERALL).alias("repo"))
    out = pl.concat([per_repo, overall.select(per_repo.columns)])
    ran = pl.col("n_attempted") - pl.col("n_not_run")
    p = pl.when(ran > 0).then(pl.col("n_resolved") / ran)
    return (out.with_columns(
        (pl.col("n_scored") / pl.col("n_attempted")).alias("coverage"),
        p.alias("resolved_rate"),
        pl.when(ran > 0).then((p * (1 - p) / ran).sqrt()).alias("resolved_se"),
        pl.when(ran > 0).then(pl.lit("scored")).otherwise(pl.lit(NOT_RUN)).alias("status"),
        (pl.col("repo") == OVERALL).alias("_overall"))
        .sort("condition", "_overall", "repo").select(list(RATE_SCHEMA)).cast(RATE_SCHEMA))


def memory_gain(rates: pl.DataFrame) -> pl.DataFrame:
    """Relevant minus noisy and relevant minus baseline, per repository and overall.

    Args:
        rates: the output of :func:`resolved_rates`.

    Returns:
        A frame of :data:`GAIN_SCHEMA` (``overall`` last); a missing condition gives nulls.
    """
    if rates.height == 0:
        return pl.DataFrame(schema=GAIN_SCHEMA)
    wide = rates.pivot(on="condition", index="repo", values="resolved_rate")
    for c in ("relevant", "noisy", "baseline"):
        if c not in wide.columns:
            wide = wide.with_columns(pl.lit(None, dtype=pl.Float64).alias(c))
    return (wide.with_columns(
        (pl.col("relevant") - pl.col("noisy")).alias("gain_vs_noisy"),
        (pl.col("relevant") - pl.col("baseline")).alias("gain_vs_baseline"),
        (pl.col("repo") == OVERALL).alias("_overall"))
        .sort("_overall", "repo").select(list(GAIN_SCHEMA)).cast(GAIN_SCHEMA))


def summary(attempts: pl.DataFrame) -> dict[str, Any]:
    """The headline numbers for run.json: overall rate and coverage per condition, and the gains."""
    rates = resolved_rates(attempts)
    gains = memory_gain(rates)
    overall = {r["condition"]: {"resolved_rate": r["resolved_rate"], "coverage": r["coverage"],
                                "n_attempted": r["n_attempted"], "n_resolved": r["n_resolved"],
                                "n_not_run": r["n_not_run"], "status": r["status"]}
               for r in rates.filter(pl.col("repo") == OVERALL).to_dicts()}
    g = gains.filter(pl.col("repo") == OVERALL).to_dicts()
    clean = lambda v: None if v is None or (isinstance(v, float) and math.isnan(v)) else v  # noqa: E731
    return {"conditions": overall,
            "gain_vs_noisy": clean(g[0]["gain_vs_noisy"]) if g else None,
            "gain_vs_baseline": clean(g[0]["gain_vs_baseline"]) if g else None}
