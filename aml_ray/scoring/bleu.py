"""BLEU-1 between a prediction and one gold answer.

Source: the BLEU-1 reported next to LLM-judge accuracy in memory-system evaluations on LoCoMo
(mem0 ``evaluation/metrics/utils.py``, borrowed from A-Mem ``utils.py``): nltk ``sentence_bleu`` with
``weights=(1, 0, 0, 0)`` and ``SmoothingFunction().method1``, one reference.

Tokenisation differs on purpose: those scripts call ``nltk.word_tokenize``, which needs the downloaded
``punkt`` model. Here a token is a maximal run of word characters (Python regex ``\\w+``: Unicode
letters, digits, underscore) in the lowercased text, so whitespace and punctuation both separate
tokens and punctuation is never a token (``"Paris."`` -> ``["paris"]``, ``"don't"`` -> ``["don",
"t"]``). No stemming, no article removal.

BLEU-1 = BP * (clipped unigram matches / prediction tokens), where BP = 1 when the prediction has at
least as many tokens as the gold, else ``exp(1 - gold_len / pred_len)``.
"""

from __future__ import annotations

import re
from functools import cache

_WORD = re.compile(r"\w+")


@cache
def _nltk_bleu():
    """``(sentence_bleu, smoothing method1)``, imported on the first score: nltk's import takes about
    0.14 s, which a driver that only imports the scoring modules never needs."""
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    return sentence_bleu, SmoothingFunction().method1


def bleu_tokens(text: str) -> list[str]:
    """Tokenise text for BLEU-1: lowercase, then every maximal ``\\w+`` run is a token.

    Examples:
        >>> bleu_tokens("May 7, 2023.")
        ['may', '7', '2023']

    Args:
        text: any text; ``None`` counts as empty and non-strings are rendered with ``str()``.

    Returns:
        The tokens in order.
    """
    return _WORD.findall("" if text is None else str(text).lower())


def bleu1(prediction: str, gold: str | int | float) -> float:
    """Sentence BLEU-1 of a prediction against one gold answer (nltk, smoothing method1).

    Examples:
        >>> bleu1("Paris.", "paris")
        1.0
        >>> round(bleu1("the cat sat", "the cat sat on the mat"), 6)  # precision 1, BP exp(-1)
        0.367879

    Args:
        prediction: the model's answer. ``None`` counts as empty.
        gold: the gold answer; numbers are compared as text.

    Returns:
        BLEU-1 in [0, 1]; 0.0 when the prediction or the gold has no tokens.
    """
    hypothesis = bleu_tokens(prediction)
    reference = bleu_tokens(gold)
    if not hypothesis or not reference:
        return 0.0
    sentence_bleu, smoothing = _nltk_bleu()
    score = sentence_bleu([reference], hypothesis, weights=(1, 0, 0, 0), smoothing_function=smoothing)
    return float(score)
