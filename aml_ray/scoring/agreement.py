"""Agreement between judges and stability of a ranking: pairwise agreement, Cohen's kappa, ranks, Kendall's tau.

Rules:

- **Agreement** of two judges over the same ``n`` questions: the share of questions given the same label.
- **Cohen's kappa** (J. Cohen, "A coefficient of agreement for nominal scales", Educational and
  Psychological Measurement 20 (1960) 37-46): ``kappa = (p_o - p_e) / (1 - p_e)``, ``p_o`` the observed
  agreement, ``p_e = sum over labels of p_a(label) * p_b(label)``, each judge's label shares. When
  ``p_e = 1`` (both judges gave every question one and the same label) kappa is undefined: ``None``.
  The same statistic as ``sklearn.metrics.cohen_kappa_score`` without weights.
- **Ranks** of systems by score: 1 for the highest score; tied scores share the best rank of the tie
  ("competition" ranking: scores 0.8, 0.8, 0.5 rank 1, 1, 3).
- **Kendall's tau** between two protocols' scores of the same systems: tau-b with the tie correction
  (:func:`aml_ray.stages.rubric.kendall_tau_b`); ``None`` when undefined (fewer than two systems, or
  every system tied under one protocol).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence

from aml_ray.stages.rubric import kendall_tau_b


def _paired(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    if len(a) != len(b):
        raise ValueError(f"the two judges' labels must cover the same questions: got {len(a)} and {len(b)} labels")
    return len(a)


def agreement(a: Sequence[Hashable], b: Sequence[Hashable]) -> float | None:
    """Share of questions on which two judges gave the same label.

    Examples:
        >>> agreement(["C", "C", "W", "W"], ["C", "W", "W", "W"])
        0.75
        >>> agreement([], []) is None
        True

    Args:
        a, b: one label per question, the questions in the same order in both.

    Returns:
        A share in [0, 1]; None for no questions.

    Raises:
        ValueError: ``a`` and ``b`` differ in length.
    """
    n = _paired(a, b)
    return sum(x == y for x, y in zip(a, b)) / n if n else None


def cohen_kappa(a: Sequence[Hashable], b: Sequence[Hashable]) -> float | None:
    """Cohen's kappa of two judges' labels over the same questions (module rules).

    Examples:
        Hand-computed: ``p_o = 3/4``; judge a says C twice of 4, b once, so
        ``p_e = 2/4 * 1/4 + 2/4 * 3/4 = 1/2`` and ``kappa = (3/4 - 1/2) / (1 - 1/2) = 0.5``.

        >>> cohen_kappa(["C", "C", "W", "W"], ["C", "W", "W", "W"])
        0.5
        >>> cohen_kappa(["C", "W"], ["W", "C"])
        -1.0
        >>> cohen_kappa(["C", "C"], ["C", "C"]) is None
        True

    Args:
        a, b: one label per question (any hashable labels), the questions in the same order in both.

    Returns:
        kappa in [-1, 1]; None when undefined (no questions, or ``p_e = 1``).

    Raises:
        ValueError: ``a`` and ``b`` differ in length.
    """
    n = _paired(a, b)
    if n == 0:
        return None
    p_o = sum(x == y for x, y in zip(a, b)) / n
    count_a, count_b = Counter(a), Counter(b)
    p_e = sum(count_a[label] * count_b[label] for label in count_a) / (n * n)
    if math.isclose(p_e, 1.0):
        return None
    return (p_o - p_e) / (1 - p_e)


def competition_ranks(scores: Mapping[str, float]) -> dict[str, int]:
    """Rank of each system by score, 1 the highest; ties share the best rank of the tie.

    Examples:
        >>> competition_ranks({"a": 0.5, "b": 0.8, "c": 0.8})
        {'a': 3, 'b': 1, 'c': 1}

    Args:
        scores: system name -> score (higher is better).

    Returns:
        System name -> rank (1-based), in the order of ``scores``.
    """
    values = list(scores.values())
    return {name: 1 + sum(other > value for other in values) for name, value in scores.items()}


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall's tau-b between two score vectors of the same systems; None where it is undefined.

    Examples:
        Hand-computed for scores (0.9, 0.6, 0.3) and (0.4, 0.7, 0.2): of the 3 pairs, (1, 3) and (2, 3) are
        concordant and (1, 2) discordant, no ties: ``tau = (2 - 1) / 3``.

        >>> round(kendall_tau([0.9, 0.6, 0.3], [0.4, 0.7, 0.2]), 6)
        0.333333
        >>> kendall_tau([0.9, 0.6], [0.5, 0.5]) is None
        True

    Raises:
        ValueError: ``x`` and ``y`` differ in length.
    """
    tau = kendall_tau_b(x, y)
    return None if math.isnan(tau) else tau
