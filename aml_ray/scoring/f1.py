"""Token F1 and LoCoMo's per-category F1 rules.

Source: snap-research/locomo, ``task_eval/evaluation.py``: ``f1_score`` (token F1), ``f1``
(multi-answer F1 for category 1) and ``eval_question_answering`` (which rule each category uses).

Category rules (LoCoMo: 1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial):

- ``"1"``: gold and prediction are split on ``','``; each gold part scores the best token F1 over the
  prediction parts; the result is the mean over gold parts.
- ``"2"``, ``"4"``: token F1.
- ``"3"``: the gold is cut at the first ``';'`` (``gold.split(';')[0].strip()``), then token F1.
- ``"5"``: 1.0 when the lowercased prediction contains ``"no information available"`` or
  ``"not mentioned"``, else 0.0; the gold is not used.

Golds that are numbers are compared as text (``str(gold)``). A gold may also be a list of acceptable
answers (LoCoMo-Refined); the score is the maximum over them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from aml_ray.scoring.normalize import stemmed_tokens

Gold = str | int | float | Sequence[str | int | float]

LOCOMO_F1_CATEGORIES = ("1", "2", "3", "4", "5")
"""Categories :func:`locomo_f1` knows (LoCoMo's official category ids, as strings)."""

_ADVERSARIAL_PHRASES = ("no information available", "not mentioned")


def token_f1(prediction: str, gold: str | int | float) -> float:
    """Token-level F1 between a prediction and one gold answer (LoCoMo's ``f1_score``).

    Both sides are normalised and Porter-stemmed (:func:`~aml_ray.scoring.normalize.stemmed_tokens`);
    the overlap is the multiset intersection (``Counter(pred) & Counter(gold)``), so a token repeated
    in the prediction counts only as often as it appears in the gold.
    ``precision = overlap / len(pred)``, ``recall = overlap / len(gold)``,
    ``F1 = 2 * precision * recall / (precision + recall)``.

    Examples:
        >>> token_f1("Paris.", "Paris")
        1.0
        >>> token_f1("The cat is running", "cats ran")
        0.4

    Args:
        prediction: the model's answer. ``None`` counts as empty.
        gold: one gold answer; numbers are compared as text (``str(gold)``).

    Returns:
        F1 in [0, 1]; 0.0 when the overlap is empty, which includes either side being empty after
        normalisation (e.g. ``"the"``).
    """
    pred_tokens = stemmed_tokens(prediction)
    gold_tokens = stemmed_tokens(gold)
    overlap = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def multi_answer_f1(prediction: str, gold: str | int | float) -> float:
    """LoCoMo's multi-answer F1 (official ``f1()``), used for category 1 (multi-hop).

    The gold and the prediction are split on ``','`` and each part stripped. Every gold part scores
    the maximum :func:`token_f1` over the prediction parts; the result is the mean over gold parts.
    Empty parts are kept, as in the official code (a trailing comma in the gold adds a part that
    scores 0).

    Examples:
        >>> multi_answer_f1("London, Paris", "Paris, London")
        1.0
        >>> multi_answer_f1("Paris", "Paris, London")
        0.5

    Args:
        prediction: the model's answer. ``None`` counts as empty.
        gold: one gold answer, possibly listing several comma-separated sub-answers.

    Returns:
        The mean, over gold parts, of the best F1 against any prediction part, in [0, 1].
    """
    pred_text = "" if prediction is None else str(prediction)
    pred_parts = [part.strip() for part in pred_text.split(",")]
    gold_parts = [part.strip() for part in str(gold).split(",")]
    best = [max(token_f1(part, gold_part) for part in pred_parts) for gold_part in gold_parts]
    return sum(best) / len(best)


def _golds(gold: Gold) -> list[str]:
    if gold is None:
        raise ValueError("gold answer is None; only category '5' can be scored without a gold")
    if isinstance(gold, (str, int, float)):
        return [str(gold)]
    golds = [str(g) for g in gold]
    if not golds:
        raise ValueError("gold answer list is empty; give at least one acceptable answer")
    return golds


def locomo_f1(prediction: str, gold: Gold | None, category: str) -> float:
    """Score a prediction with LoCoMo's official per-category F1 rule.

    See the module docstring for the rules; source: ``eval_question_answering`` in
    snap-research/locomo ``task_eval/evaluation.py``.

    Examples:
        >>> locomo_f1("May 7, 2023.", "7 May 2023", "2")
        1.0
        >>> round(locomo_f1("yes", "Likely yes; she mentions the outdoors", "3"), 4)
        0.6667
        >>> locomo_f1("3", 3, "4")
        1.0

    Args:
        prediction: the model's answer. ``None`` counts as empty.
        gold: the gold answer: a string, a number (compared as ``str(gold)``), or a list of acceptable
            answers (the maximum score over them is returned). Ignored for category ``"5"``, where it
            may be ``None``.
        category: LoCoMo category id, ``"1"`` to ``"5"``; an int or surrounding whitespace is accepted
            and converted with ``str(category).strip()``.

    Returns:
        The score in [0, 1].

    Raises:
        ValueError: if the category is not one of ``"1"``..``"5"``, or the gold is ``None`` or an
            empty list for categories ``"1"``..``"4"``.
    """
    cat = str(category).strip()
    if cat not in LOCOMO_F1_CATEGORIES:
        raise ValueError(
            f"unknown LoCoMo category {category!r}; expected one of {', '.join(LOCOMO_F1_CATEGORIES)}"
        )
    pred_text = "" if prediction is None else str(prediction)
    if cat == "5":
        lowered = pred_text.lower()
        return 1.0 if any(phrase in lowered for phrase in _ADVERSARIAL_PHRASES) else 0.0
    golds = _golds(gold)
    if cat == "1":
        return max(multi_answer_f1(pred_text, g) for g in golds)
    if cat == "3":
        golds = [g.split(";")[0].strip() for g in golds]
    return max(token_f1(pred_text, g) for g in golds)
