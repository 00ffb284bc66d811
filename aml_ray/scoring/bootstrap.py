"""Bootstrap confidence intervals for mean credits: one group, a paired difference, a mean of dataset means.

Source: B. Efron and R. J. Tibshirani, *An Introduction to the Bootstrap* (Chapman & Hall, 1993):
the nonparametric bootstrap (ch. 6) with the **percentile interval** (ch. 13), and their advice that
B = 1000 to 2000 resamples suffice for percentile intervals (ch. 19). DESIGN.md ("Aggregation") asks for
a standard error or bootstrap CI next to every score; this is the bootstrap, question-level.

The rule, for the ``n`` per-question credits ``x`` of one group (a category, a dataset, a run):

- draw ``B = RESAMPLES`` resamples of ``n`` questions each, uniformly **with replacement**, as one
  ``(B, n)`` index matrix from ``numpy.random.default_rng(SEED)`` (in blocks of at most
  :data:`MAX_CELLS` cells, so a large group does not hold a huge matrix at once);
- the statistic of each resample is its mean credit (accuracy);
- the 95 % interval is the 2.5th and 97.5th percentile of those ``B`` means (numpy ``quantile``,
  ``method="linear"``: the q-quantile of B sorted values sits at 0-based position ``q (B - 1)``).

The credits are sorted before resampling, so an interval depends only on the multiset of credits, never
on the order the evidence rows were read in: the same run always gets the same interval.

Variants: :func:`paired_difference_ci` resamples matched questions together (the same index drawn for
both runs), which is the bootstrap of the per-question differences; :func:`mean_of_means_ci` resamples
each dataset on its own (stratified) and averages the dataset means without weights, the suite's
Overall rule.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

RESAMPLES = 2000
"""Bootstrap resamples per interval (Efron & Tibshirani ch. 19: 1000-2000 for percentile intervals)."""

SEED = 0
"""Seed of ``numpy.random.default_rng`` for every interval: any fixed value makes intervals reproducible."""

CONFIDENCE = 0.95
"""Coverage of the intervals: the 2.5th and 97.5th percentiles of the bootstrap distribution."""

MAX_CELLS = 250_000
"""Most index-matrix cells drawn at once (2 MB of int64, and as much again for the credits they gather); more
resamples are drawn in blocks. A dataset's interval is computed in the process that scores its run and again
in a suite's driver for Overall: drawn at once, LoCoMo's 1,986 questions x 2,000 resamples hold 64 MB there
(docs/benchmarks.md). Blocks draw the very same resamples; smaller ones only cost numpy calls."""

Interval = tuple[float | None, float | None]
"""``(low, high)`` of an interval; ``(None, None)`` when there is no value to resample."""


def _as_sorted(values: Sequence[float] | np.ndarray) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).ravel()
    if np.isnan(array).any():
        raise ValueError("bootstrap values hold NaN; every question needs a credit (errors count 0)")
    return np.sort(array)


def _check(resamples: int, confidence: float) -> None:
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def bootstrap_means(values: Sequence[float] | np.ndarray, *, resamples: int = RESAMPLES,
                    rng: np.random.Generator | None = None) -> np.ndarray:
    """The mean of each of ``resamples`` bootstrap resamples of ``values`` (drawn as an index matrix).

    Examples:
        >>> bootstrap_means([1.0, 1.0, 1.0], resamples=4).tolist()
        [1.0, 1.0, 1.0, 1.0]

    Args:
        values: shape ``(n,)``, the per-question credits, ``n >= 1``, no NaN; used in the given order
            (the interval functions sort them first).
        resamples: ``B``, the number of resamples.
        rng: the generator to draw from (default ``numpy.random.default_rng(SEED)``); consumed in place.

    Returns:
        Shape ``(B,)``: float64 resample means.

    Raises:
        ValueError: ``values`` is empty or holds NaN, or ``resamples < 1``.
    """
    array = np.asarray(values, dtype=np.float64).ravel()
    if array.size == 0:
        raise ValueError("bootstrap of an empty group: give at least one value")
    if np.isnan(array).any():
        raise ValueError("bootstrap values hold NaN; every question needs a credit (errors count 0)")
    _check(resamples, CONFIDENCE)
    rng = rng if rng is not None else np.random.default_rng(SEED)
    return _shared_means([array], resamples, rng)[0]


def _shared_means(arrays: Sequence[np.ndarray], resamples: int, rng: np.random.Generator) -> list[np.ndarray]:
    """The ``resamples`` bootstrap means of each of ``arrays`` (all of one length ``n``, shape ``(n,)``), every
    array resampled with the same index matrix: each array's means are those :func:`bootstrap_means` gives
    it with a generator in ``rng``'s state (the matrix is drawn once, not once per array)."""
    n = arrays[0].size
    means = [np.empty(resamples, dtype=np.float64) for _ in arrays]
    block = max(1, MAX_CELLS // n)
    for start in range(0, resamples, block):  # blocks of resamples, each one (rows, n) matrix: no loop per resample
        rows = min(block, resamples - start)
        index = rng.integers(0, n, size=(rows, n))
        for array, out in zip(arrays, means):
            out[start:start + rows] = array[index].mean(axis=1)
    return means


def _percentiles(means: np.ndarray, confidence: float) -> Interval:
    alpha = 1.0 - confidence
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2], method="linear")
    return float(low), float(high)


def mean_ci(values: Sequence[float] | np.ndarray, *, resamples: int = RESAMPLES, seed: int = SEED,
            confidence: float = CONFIDENCE) -> Interval:
    """Percentile bootstrap interval of the mean of ``values`` (question-level resampling).

    Examples:
        >>> low, high = mean_ci([1.0] * 50 + [0.0] * 50)
        >>> low <= 0.5 <= high, round(high - low, 2)
        (True, 0.2)
        >>> mean_ci([])
        (None, None)

    Args:
        values: shape ``(n,)``, per-question credits (0/1 verdicts or partial credit in [0, 1]); sorted
            first, so their order does not matter.
        resamples: ``B`` (default :data:`RESAMPLES`).
        seed: seed of the generator (default :data:`SEED`).
        confidence: interval coverage (default :data:`CONFIDENCE`).

    Returns:
        ``(low, high)`` in the units of ``values``; ``(None, None)`` when ``values`` is empty.

    Raises:
        ValueError: NaN in ``values``, ``resamples < 1`` or ``confidence`` outside (0, 1).
    """
    _check(resamples, confidence)
    array = _as_sorted(values)
    if array.size == 0:
        return None, None
    return _percentiles(bootstrap_means(array, resamples=resamples, rng=np.random.default_rng(seed)), confidence)


def mean_cis(columns: Sequence[Sequence[float] | np.ndarray], *, resamples: int = RESAMPLES, seed: int = SEED,
             confidence: float = CONFIDENCE) -> list[Interval]:
    """:func:`mean_ci` of each of ``columns``, the same intervals, with one index matrix drawn per length.

    :func:`mean_ci` draws its ``(B, n)`` index matrix from a fresh generator seeded with ``seed``, so every
    group of ``n`` credits is resampled with the same matrix; here it is drawn once for all the columns
    of one length (e.g. one category's recall at each K) instead of once per column.

    Examples:
        >>> mean_cis([[1.0] * 50 + [0.0] * 50, [0.5] * 100, []]) == [mean_ci([1.0] * 50 + [0.0] * 50),
        ...                                                          mean_ci([0.5] * 100), (None, None)]
        True

    Args:
        columns: each of shape ``(n_i,)``: per-question credits, as for :func:`mean_ci`.
        resamples / seed / confidence: as in :func:`mean_ci`.

    Returns:
        One ``(low, high)`` per column, in order (``(None, None)`` for an empty one).

    Raises:
        ValueError: as :func:`mean_ci`.
    """
    _check(resamples, confidence)
    arrays = [_as_sorted(c) for c in columns]
    out: list[Interval] = [(None, None)] * len(arrays)
    by_length: dict[int, list[int]] = {}
    for i, array in enumerate(arrays):
        if array.size:
            by_length.setdefault(array.size, []).append(i)
    for positions in by_length.values():
        means = _shared_means([arrays[i] for i in positions], resamples, np.random.default_rng(seed))
        for i, m in zip(positions, means):
            out[i] = _percentiles(m, confidence)
    return out


def paired_difference_ci(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, *,
                         resamples: int = RESAMPLES, seed: int = SEED, confidence: float = CONFIDENCE) -> Interval:
    """Paired bootstrap interval of ``mean(b) - mean(a)`` over matched questions.

    Each resample draws question indices once and takes both runs' credits of those questions, so the
    statistic is the mean of the per-question differences ``b - a`` (the pairing is kept).

    Examples:
        >>> paired_difference_ci([1, 0, 1], [1, 0, 1])
        (0.0, 0.0)

    Args:
        a: shape ``(n,)``, run A's credit per matched question.
        b: shape ``(n,)``, run B's credit for the same questions, in the same order.
        resamples / seed / confidence: as in :func:`mean_ci`.

    Returns:
        ``(low, high)`` of B minus A; ``(None, None)`` when there is no matched question.

    Raises:
        ValueError: ``a`` and ``b`` differ in length, or as :func:`mean_ci`.
    """
    a_arr, b_arr = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if a_arr.shape != b_arr.shape:
        raise ValueError(f"paired credits differ in length: {a_arr.size} vs {b_arr.size}")
    return mean_ci(b_arr - a_arr, resamples=resamples, seed=seed, confidence=confidence)


def mean_of_means_ci(groups: Sequence[Sequence[float] | np.ndarray], *, resamples: int = RESAMPLES, seed: int = SEED,
                     confidence: float = CONFIDENCE) -> Interval:
    """Stratified bootstrap interval of the unweighted mean of group means (the suite's Overall).

    Each group (a dataset) is resampled on its own, question-level, with its own ``(B, n_g)`` index
    matrix drawn from one generator in the order given; resample ``i``'s statistic is the plain mean of
    the groups' resample-``i`` means. With one group this equals :func:`mean_ci`.

    Examples:
        >>> mean_of_means_ci([[1.0] * 10, [0.0] * 30])
        (0.5, 0.5)
        >>> mean_of_means_ci([[1.0] * 50 + [0.0] * 50]) == mean_ci([1.0] * 50 + [0.0] * 50)
        True

    Args:
        groups: one sequence of per-question credits per dataset (shape ``(n_g,)`` each, ``n_g >= 1``).
        resamples / seed / confidence: as in :func:`mean_ci`.

    Returns:
        ``(low, high)``; ``(None, None)`` when ``groups`` is empty.

    Raises:
        ValueError: an empty group, NaN in a group, or as :func:`mean_ci`.
    """
    _check(resamples, confidence)
    if not groups:
        return None, None
    rng = np.random.default_rng(seed)
    sorted_groups = [_as_sorted(g) for g in groups]
    if any(g.size == 0 for g in sorted_groups):
        raise ValueError("a group of the stratified bootstrap is empty; leave out datasets with no question")
    means = np.stack([bootstrap_means(g, resamples=resamples, rng=rng) for g in sorted_groups]).mean(axis=0)
    return _percentiles(means, confidence)


def describe() -> dict[str, object]:
    """The method, for results files and captions: ``{"method", "resamples", "seed", "confidence"}``.

    Examples:
        >>> describe()["method"]
        'percentile bootstrap, question-level resampling (Efron & Tibshirani 1993, ch. 13)'
    """
    return {"method": "percentile bootstrap, question-level resampling (Efron & Tibshirani 1993, ch. 13)",
            "resamples": RESAMPLES, "seed": SEED, "confidence": CONFIDENCE}
