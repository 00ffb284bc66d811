"""The table of a retrieval-only run (Add and Search, no Answer or Judge): what Search returned.

A retrieval-only run (``aml-ray run --retrieval-only``) calls no model, so it has no accuracy. Its table
says, per ``(dataset, category)`` and overall (the ``"overall"`` row, over all the dataset's
non-excluded questions), how many questions were searched and what came back:

- ``n_total``: non-excluded questions; ``n_excluded`` is only counted (as in :mod:`.aggregate`).
- ``n_retrieved``: questions whose Search succeeded (status ``retrieved``); ``n_errors`` the others.
- ``coverage = n_retrieved / n_total``.
- ``memories_mean``: mean number of memories returned per retrieved question; ``n_empty``: retrieved
  questions with no memory at all (a participant that finds nothing is not an error, but is worth seeing).

A group with no non-excluded rows keeps its counts; its ratios are null.
"""

from __future__ import annotations

import polars as pl

from aml_ray.run.evidence import RETRIEVED
from aml_ray.scoring.aggregate import OVERALL

REQUIRED_COLUMNS = ("dataset", "category", "excluded", "status", "n_memories")
"""Columns :func:`retrieval_table` reads."""


def _group(df: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    included = ~pl.col("excluded")
    ok = included & (pl.col("status") == RETRIEVED)
    return df.group_by(keys, maintain_order=True).agg(
        included.sum().cast(pl.Int64).alias("n_total"),
        ok.sum().cast(pl.Int64).alias("n_retrieved"),
        pl.col("excluded").sum().cast(pl.Int64).alias("n_excluded"),
        pl.col("n_memories").filter(ok).mean().alias("memories_mean"),
        (ok & (pl.col("n_memories") == 0)).sum().cast(pl.Int64).alias("n_empty"),
    )


def retrieval_table(df: pl.DataFrame) -> pl.DataFrame:
    """Per-category and overall rows of a retrieval-only run, categories sorted, overall last.

    Example:
        >>> df = pl.DataFrame({"dataset": ["d"] * 4, "category": ["1", "1", "2", "5"],
        ...                    "excluded": [False, False, False, True],
        ...                    "status": ["retrieved", "search_error", "retrieved", "excluded"],
        ...                    "n_memories": [3, None, 0, None]})
        >>> retrieval_table(df).select("category", "n_total", "n_retrieved", "coverage", "n_empty").rows()
        [('1', 2, 1, 0.5, 0), ('2', 1, 1, 1.0, 1), ('5', 0, 0, None, 0), ('overall', 3, 2, 0.6666666666666666, 1)]

    Args:
        df: question rows with :data:`REQUIRED_COLUMNS`.

    Returns:
        Columns ``dataset, category, n_total, n_retrieved, n_errors, n_excluded, coverage, memories_mean,
        n_empty``.

    Raises:
        ValueError: a required column is missing (named).
    """
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"retrieval_table needs columns {missing}; pass question evidence rows")
    by_category = _group(df, ["dataset", "category"]).sort(["dataset", "category"])
    overall = _group(df, ["dataset"]).with_columns(pl.lit(OVERALL).alias("category"))
    table = pl.concat([by_category, overall.select(by_category.columns)])
    total = pl.col("n_total")
    return table.with_columns(
        (total - pl.col("n_retrieved")).alias("n_errors"),
        pl.when(total > 0).then(pl.col("n_retrieved") / total).otherwise(None).alias("coverage"),
    ).select("dataset", "category", "n_total", "n_retrieved", "n_errors", "n_excluded", "coverage",
             "memories_mean", "n_empty")
