"""Offline lexical judge: a CORRECT/WRONG verdict without a judge model.

Used only when no judge model is configured (demos, tests, air-gapped smoke runs). It is not an
official scorer and results produced with it must carry :data:`OFFLINE_JUDGE_NAME` as the judge name
so they are never mistaken for LLM-judge accuracy.

Rule (this project's, not from a benchmark): CORRECT when the LoCoMo token F1
(:func:`~aml_ray.scoring.f1.token_f1`) is at least :data:`F1_THRESHOLD`, or when the normalised gold
(:func:`~aml_ray.scoring.normalize.normalize_answer`) occurs in the normalised prediction as a whole
run of tokens (so gold ``"1"`` is not found in ``"10 times"``); otherwise WRONG.
"""

from __future__ import annotations

from collections.abc import Sequence

from aml_ray.scoring.f1 import token_f1
from aml_ray.scoring.normalize import normalize_answer

OFFLINE_JUDGE_NAME = "offline-lexical-judge (not an official model)"
"""Judge name recorded for verdicts from :func:`lexical_verdict`."""

F1_THRESHOLD = 0.5
"""Token F1 at or above which the offline judge says CORRECT."""


def _contains(prediction_norm: str, gold_norm: str) -> bool:
    return bool(gold_norm) and f" {gold_norm} " in f" {prediction_norm} "


def _verdict_one(prediction: str, gold: str) -> tuple[str, str]:
    f1 = token_f1(prediction, gold)
    gold_norm = normalize_answer(gold)
    if f1 >= F1_THRESHOLD:
        return "CORRECT", f"token F1 {f1:.3f} >= {F1_THRESHOLD} against gold {gold_norm!r}"
    if _contains(normalize_answer(prediction), gold_norm):
        return "CORRECT", f"normalised gold {gold_norm!r} appears in the prediction (token F1 {f1:.3f})"
    return "WRONG", f"token F1 {f1:.3f} < {F1_THRESHOLD} and normalised gold {gold_norm!r} not in the prediction"


def lexical_verdict(
    prediction: str, gold: str | int | float | Sequence[str | int | float]
) -> tuple[str, str]:
    """Judge a prediction against the gold with lexical rules only (no model).

    Examples:
        >>> lexical_verdict("Paris.", "Paris")[0]
        'CORRECT'
        >>> lexical_verdict("She went on 7 May 2023 to the lake with her family", "7 May 2023")[0]
        'CORRECT'
        >>> lexical_verdict("London", "Paris")[0]
        'WRONG'

    Args:
        prediction: the model's answer; ``None`` counts as empty (always WRONG).
        gold: the gold answer; numbers are compared as text; a list of acceptable answers is CORRECT
            when any of them is.

    Returns:
        ``(verdict, rationale)``: verdict is ``"CORRECT"`` or ``"WRONG"``; the rationale names the F1
        value and which rule decided.

    Raises:
        ValueError: if the gold is ``None`` or an empty list.
    """
    if gold is None:
        raise ValueError("gold answer is None; the offline judge needs a gold answer")
    golds = [gold] if isinstance(gold, (str, int, float)) else list(gold)
    if not golds:
        raise ValueError("gold answer list is empty; give at least one acceptable answer")
    pred_text = "" if prediction is None else str(prediction)
    results = [_verdict_one(pred_text, str(g)) for g in golds]
    for verdict, rationale in results:
        if verdict == "CORRECT":
            return verdict, rationale
    return results[0] if len(results) == 1 else ("WRONG", "; ".join(r for _, r in results))
