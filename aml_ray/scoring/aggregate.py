"""Aggregate per-question results into per-category and per-dataset scores (polars).

Source: DESIGN.md ("The pipeline": Aggregation; "Scoring contracts": a judge failure never silently
leaves the denominator) and the AML rule that coverage is reported next to every score.

Rules, per ``(dataset, category)`` group and per dataset (the ``"overall"`` row, a micro-average over
all of the dataset's non-excluded questions):

- Excluded rows (``excluded`` true, e.g. LoCoMo category 5) are only counted, in ``n_excluded``.
- Every non-excluded row is in the denominator ``n_total``, whatever its status.
- A row scores only when ``status == "scored"``; every other status (``answer_error``,
  ``judge_error``, ``search_error``) counts as WRONG for accuracy and as 0 for f1 and bleu1.
  A scored row with a null ``f1``/``bleu1`` also counts 0, and a scored row counts as correct only
  when its verdict is exactly ``"CORRECT"``.
- Credit per question: the optional ``score`` column (partial credit in [0, 1] from rubric or option
  scorers) when not null, else 1 for a CORRECT verdict; errors get 0.
- ``coverage = n_scored / n_total``; ``accuracy = sum(credit) / n_total``;
  ``accuracy_se = s / sqrt(n_total)``, the standard error of the mean with the sample variance ``s**2`` of
  the credits over the same denominator (divisor ``n_total - 1``, as ``scipy.stats.sem`` with its default
  ``ddof=1``; for 0/1 credit ``sqrt(p (1 - p) / (n_total - 1))``); null for a single question, whose
  spread is unknown; ``f1`` and ``bleu1`` are sums over scored rows divided by ``n_total``.
- A group with no non-excluded rows keeps its counts; its ratios are null.

Example: 10 questions, 2 answer errors, 7 of the other 8 judged CORRECT -> accuracy 0.70 (not 0.875)
and coverage 0.8.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from aml_ray.scoring.bootstrap import mean_ci

OVERALL = "overall"
"""Category value of the per-dataset row that aggregates all its categories."""

STATUSES = ("scored", "answer_error", "judge_error", "search_error")
"""Allowed values of the ``status`` column."""

REQUIRED_COLUMNS = ("dataset", "category", "excluded", "status", "verdict", "f1", "bleu1")
"""Columns :func:`aggregate` reads; other columns are ignored."""

RESULT_SCHEMA = {
    "dataset": pl.String,
    "category": pl.String,
    "n_total": pl.Int64,
    "n_scored": pl.Int64,
    "n_errors": pl.Int64,
    "n_excluded": pl.Int64,
    "coverage": pl.Float64,
    "accuracy": pl.Float64,
    "accuracy_se": pl.Float64,
    "accuracy_ci_low": pl.Float64,
    "accuracy_ci_high": pl.Float64,
    "f1": pl.Float64,
    "bleu1": pl.Float64,
}
"""Columns and dtypes of the frame :func:`aggregate` returns, in order."""


def _validate(df: pl.DataFrame) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(
            f"results frame lacks columns {missing}; required: {', '.join(REQUIRED_COLUMNS)}"
        )
    # Excluded rows are only counted, so their status is not checked ("excluded" is the usual value).
    bad = df.filter(~pl.col("excluded") & (~pl.col("status").is_in(STATUSES) | pl.col("status").is_null()))
    if bad.height:
        values = sorted({str(v) for v in bad["status"].to_list()})
        raise ValueError(f"unknown status values {values}; allowed: {', '.join(STATUSES)}")
    if df["excluded"].null_count():
        raise ValueError("column 'excluded' has nulls; every row must say true or false")


def credit_expr() -> pl.Expr:
    """Per-question credit in [0, 1] (module rules), null for an excluded row.

    The scorer's ``score`` when it gives one (rubric means, option match), else 1 for a CORRECT verdict;
    0 for every error status (it stays in the denominator). Reads ``excluded``, ``status``, ``verdict``
    and ``score`` (which must exist: :func:`with_credit` adds a null one when absent).
    """
    scored = pl.col("status") == "scored"
    verdict_credit = (pl.col("verdict") == "CORRECT").fill_null(False).cast(pl.Float64)
    credit = pl.when(scored).then(pl.coalesce(pl.col("score").cast(pl.Float64), verdict_credit)).otherwise(0.0)
    return pl.when(~pl.col("excluded")).then(credit).otherwise(None).alias("credit")


def with_credit(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with a Float64 ``credit`` column: each question's credit by the module rules, null when excluded.

    What :func:`aggregate` averages; :mod:`aml_ray.compare` pairs it across runs and the suite's Overall
    resamples it.

    Examples:
        >>> rows = pl.DataFrame({"excluded": [False, False, False, True],
        ...                      "status": ["scored", "scored", "judge_error", "scored"],
        ...                      "verdict": ["CORRECT", "WRONG", None, "CORRECT"]})
        >>> with_credit(rows)["credit"].to_list()
        [1.0, 0.0, 0.0, None]

    Args:
        df: rows with ``excluded`` (bool), ``status``, ``verdict`` and optionally ``score`` (float or null).

    Raises:
        ValueError: a required column is missing.
    """
    missing = [c for c in ("excluded", "status", "verdict") if c not in df.columns]
    if missing:
        raise ValueError(f"frame lacks columns {missing}; credit needs excluded, status, verdict (and score)")
    if "score" not in df.columns:
        df = df.with_columns(pl.lit(None, dtype=pl.Float64).alias("score"))
    return df.with_columns(credit_expr())


def _group_metrics() -> list[pl.Expr]:
    included = ~pl.col("excluded")
    scored = included & (pl.col("status") == "scored")
    credit = pl.col("credit").fill_null(0.0)
    return [
        included.sum().cast(pl.Int64).alias("n_total"),
        scored.sum().cast(pl.Int64).alias("n_scored"),
        pl.col("excluded").sum().cast(pl.Int64).alias("n_excluded"),
        credit.sum().alias("_n_correct"),
        (credit * credit).sum().alias("_credit_sq"),
        pl.when(scored).then(pl.col("f1").fill_null(0.0)).otherwise(0.0).sum().alias("_f1_sum"),
        pl.when(scored).then(pl.col("bleu1").fill_null(0.0)).otherwise(0.0).sum().alias("_bleu1_sum"),
    ]


def _ratio(numerator: str) -> pl.Expr:
    n = pl.col("n_total")
    return pl.when(n > 0).then(pl.col(numerator).cast(pl.Float64) / n).otherwise(None)


def _intervals(base: pl.DataFrame) -> pl.DataFrame:
    """``(dataset, category, accuracy_ci_low, accuracy_ci_high)`` for every category and dataset row."""
    included = base.filter(~pl.col("excluded"))
    groups = pl.concat([
        included.group_by("dataset", "category").agg(pl.col("credit")),
        included.group_by("dataset").agg(pl.col("credit")).with_columns(
            pl.lit(OVERALL, dtype=pl.String).alias("category")).select("dataset", "category", "credit"),
    ])
    rows = []
    for dataset, category, credits in groups.iter_rows():
        low, high = mean_ci(np.asarray(credits, dtype=np.float64))
        rows.append((dataset, category, low, high))
    return pl.DataFrame(rows, schema={"dataset": pl.String, "category": pl.String, "accuracy_ci_low": pl.Float64,
                                      "accuracy_ci_high": pl.Float64}, orient="row")


def _standard_error(accuracy: pl.Expr) -> pl.Expr:
    """The standard error of the mean credit with the sample variance (module rules); null when n < 2."""
    n = pl.col("n_total").cast(pl.Float64)
    sum_of_squares = (pl.col("_credit_sq") - n * accuracy * accuracy).clip(lower_bound=0.0)
    return pl.when(n > 1).then((sum_of_squares / (n - 1) / n).sqrt()).otherwise(None)


def aggregate(df: pl.DataFrame) -> pl.DataFrame:
    """Aggregate per-question rows into one row per (dataset, category) plus a per-dataset overall.

    Examples:
        >>> rows = pl.DataFrame({
        ...     "dataset": ["locomo"] * 10, "category": ["1"] * 10, "excluded": [False] * 10,
        ...     "status": ["answer_error"] * 2 + ["scored"] * 8,
        ...     "verdict": [None] * 2 + ["CORRECT"] * 7 + ["WRONG"],
        ...     "f1": [None] * 2 + [1.0] * 8, "bleu1": [None] * 2 + [1.0] * 8,
        ... })
        >>> overall = aggregate(rows).filter(pl.col("category") == "overall")
        >>> overall["accuracy"].round(4).item()
        0.7
        >>> overall["accuracy_ci_low"].item() <= 0.7 <= overall["accuracy_ci_high"].item()
        True

    Args:
        df: one row per question with columns ``dataset`` (str), ``category`` (str), ``excluded``
            (bool, no nulls), ``status`` (one of :data:`STATUSES`), ``verdict`` (``"CORRECT"``,
            ``"WRONG"`` or null), ``f1`` and ``bleu1`` (float or null). Extra columns are ignored.

    Returns:
        A frame with the columns of :data:`RESULT_SCHEMA`: ``n_total`` (non-excluded questions, the
        denominator), ``n_scored``, ``n_errors`` (``n_total - n_scored``), ``n_excluded``, then
        ``coverage``, ``accuracy``, ``accuracy_se``, ``accuracy_ci_low``, ``accuracy_ci_high`` (the
        95 % bootstrap interval), ``f1`` and ``bleu1`` (null when ``n_total`` is 0).
        Rows are sorted by dataset, then category: categories that are integers in numeric order
        (``"2"`` before ``"10"``), then other names alphabetically, then ``"overall"`` last.
        An empty input gives an empty frame with that schema.

    Raises:
        ValueError: if a required column is missing, a status is not one of :data:`STATUSES`, or
            ``excluded`` has nulls.
    """
    _validate(df)
    if df.height == 0:
        return pl.DataFrame(schema=RESULT_SCHEMA)
    base = df.select(
        pl.col("dataset").cast(pl.String),
        pl.col("category").cast(pl.String),
        pl.col("excluded").cast(pl.Boolean),
        pl.col("status").cast(pl.String),
        pl.col("verdict").cast(pl.String),
        (pl.col("score") if "score" in df.columns else pl.lit(None)).cast(pl.Float64).alias("score"),
        pl.col("f1").cast(pl.Float64),
        pl.col("bleu1").cast(pl.Float64),
    ).with_columns(credit_expr())
    per_category = base.group_by("dataset", "category").agg(_group_metrics())
    per_dataset = base.group_by("dataset").agg(_group_metrics()).with_columns(
        pl.lit(OVERALL, dtype=pl.String).alias("category")
    )
    counts = pl.concat([per_category, per_dataset.select(per_category.columns)], how="vertical")
    accuracy = _ratio("_n_correct")
    result = (
        counts.with_columns(
            (pl.col("n_total") - pl.col("n_scored")).alias("n_errors"),
            _ratio("n_scored").alias("coverage"),
            accuracy.alias("accuracy"),
            _standard_error(accuracy).alias("accuracy_se"),
            _ratio("_f1_sum").alias("f1"),
            _ratio("_bleu1_sum").alias("bleu1"),
            (pl.col("category") == OVERALL).alias("_is_overall"),
            pl.col("category").cast(pl.Int64, strict=False).alias("_category_number"),
        )
        .join(_intervals(base), on=["dataset", "category"], how="left")
        .sort(
            ["dataset", "_is_overall", "_category_number", "category"],
            nulls_last=True,
        )
        .select(list(RESULT_SCHEMA))
    )
    return result.cast(RESULT_SCHEMA)


def latency_summary(latencies_ms: Sequence[float] | pl.Series) -> dict[str, float | int | None]:
    """Summarise call latencies (Add or Search) as p50 / p95 in milliseconds.

    Quantiles use linear interpolation between the two nearest ranks (numpy ``method="linear"``,
    Hyndman & Fan type 7, the numpy and polars default): the q-quantile of n sorted values sits at
    0-based position ``q * (n - 1)``. Nulls and NaNs are dropped first.

    Examples:
        >>> latency_summary([10, 20, 30, 40, 50])
        {'p50': 30.0, 'p95': 48.0, 'n': 5}

    Args:
        latencies_ms: per-call latencies in milliseconds, a sequence or a polars Series.

    Returns:
        ``{"p50": float | None, "p95": float | None, "n": int}``, where ``n`` counts the values used;
        both quantiles are None when there is no value.
    """
    series = latencies_ms if isinstance(latencies_ms, pl.Series) else pl.Series(
        "latency_ms", list(latencies_ms), dtype=pl.Float64, strict=False
    )
    values = series.cast(pl.Float64).drop_nulls().drop_nans().to_numpy()
    if values.size == 0:
        return {"p50": None, "p95": None, "n": 0}
    p50, p95 = np.quantile(values, [0.5, 0.95], method="linear")
    return {"p50": float(p50), "p95": float(p95), "n": int(values.size)}
