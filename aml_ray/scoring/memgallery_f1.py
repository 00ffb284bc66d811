"""Mem-Gallery's answer metric: token F1 with its published normalisation.

Source: the Mem-Gallery benchmark's metric as the AML issue 9 states it ("token F1 with its published
normalisation: lowercase, drop a/an/the/and, punctuation to space, Porter stemming, multiset overlap").
Steps, in order:

1. lowercase;
2. every character of ``string.punctuation`` becomes a space (unlike LoCoMo, which deletes it, so
   ``"brown-fox"`` is two tokens here);
3. the whole words ``a``, ``an``, ``the``, ``and`` are dropped;
4. whitespace tokens are Porter-stemmed (nltk ``PorterStemmer``, as :mod:`aml_ray.scoring.normalize`);
5. F1 of the multisets of stems: ``2PR / (P + R)`` with ``P = overlap / |pred|``, ``R = overlap / |gold|``.

Two empty token lists score 1.0; one empty list scores 0.0.
"""

from __future__ import annotations

import string
from collections import Counter

from aml_ray.scoring.normalize import _stem as stem

_PUNCT_TO_SPACE = str.maketrans({c: " " for c in string.punctuation})
_DROP = frozenset({"a", "an", "the", "and"})


def memgallery_tokens(text: str) -> list[str]:
    """Normalised, stemmed tokens of ``text`` (see the module steps).

    Examples:
        >>> memgallery_tokens("The Brown-Fox and a dog, running!")
        ['brown', 'fox', 'dog', 'run']
    """
    words = str(text).lower().translate(_PUNCT_TO_SPACE).split()
    return [stem(w) for w in words if w not in _DROP]


def memgallery_f1(prediction: str, gold: str) -> float:
    """Token F1 of a prediction against one gold answer.

    Examples:
        >>> memgallery_f1("Not mentioned.", "Not mentioned.")
        1.0
        >>> round(memgallery_f1("a red bicycle", "the red bike"), 2)
        0.5
    """
    p, g = memgallery_tokens(prediction), memgallery_tokens(gold)
    if not p and not g:
        return 1.0
    if not p or not g:
        return 0.0
    overlap = sum((Counter(p) & Counter(g)).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(p), overlap / len(g)
    return 2 * precision * recall / (precision + recall)
