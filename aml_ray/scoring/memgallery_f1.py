"""Mem-Gallery's answer metric: token F1 as Mem-Gallery's evaluator computes it.

Source: Mem-Gallery ``benchmark/memengine/evaluate/evaluation.py`` (YuanchenBei/Mem-Gallery @
``09d49b578bb1d32ac473776311e14b3d8d53faf0``; the same file in the code release ma-xueqian/Mem-Gallery @
``c0a045454850be4db8ded067105c81f998b9d457``), functions ``normalize_answer_universal`` and ``f1_score``.
The rule, reproduced here (not the upstream code):

1. lowercase;
2. a dot between two digits is kept (``8.5`` stays one token) and underscores are kept (``IMG_001`` and
   ``D1:IMG_001`` -> ``d1 img_001``);
3. the whole words ``a``, ``an``, ``the``, ``and`` are removed, *before* punctuation is touched (so the
   ``the`` of ``the-fox`` goes);
4. every other character of ``string.punctuation`` becomes a space;
5. whitespace tokens are Porter-stemmed (nltk ``PorterStemmer()``, default ``NLTK_EXTENSIONS`` mode);
6. F1 of the multisets of stems, ``2PR / (P + R)`` with ``P = overlap / |pred|``, ``R = overlap / |gold|``;
   no overlap scores 0, and so does an empty answer against an empty gold (``num_same == 0``).

Examples:
    >>> memgallery_tokens("D8:IMG_009, D8:IMG_010")
    ['d8', 'img_009', 'd8', 'img_010']
    >>> memgallery_tokens("The Brown-Fox and a dog ran 8.5 km!")
    ['brown', 'fox', 'dog', 'ran', '8.5', 'km']
    >>> memgallery_f1("", "")
    0.0
"""

from __future__ import annotations

import re
import string
from collections import Counter

from aml_ray.scoring.normalize import _stem as stem

#: A dot between two digits (step 2); it survives punctuation removal.
_DECIMAL_DOT = re.compile(r"(?<=\d)\.(?=\d)")
#: Stands for a kept dot while punctuation is removed (a private-use character: never in answers).
_KEPT_DOT = "\ue000"
#: Step 3: upstream's ``\b(a|an|the|and)\b``.
_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
#: Step 4: every punctuation character but the underscore becomes a space.
_PUNCT_TO_SPACE = str.maketrans({c: " " for c in string.punctuation if c != "_"})


def normalize_answer(text: object) -> str:
    """Mem-Gallery's ``normalize_answer_universal``: steps 1-4 of the module rule, spaces collapsed.

    Args:
        text: an answer or gold answer (anything; ``str()`` is taken first, as upstream does).

    Returns:
        The normalised text, e.g. ``"d8 img_009 8.5"``.

    Examples:
        >>> normalize_answer("D8:IMG_009 costs $8.50, and the rest.")
        'd8 img_009 costs 8.50 rest'
    """
    s = _DECIMAL_DOT.sub(_KEPT_DOT, str(text).lower())
    s = _ARTICLES.sub(" ", s).translate(_PUNCT_TO_SPACE).replace(_KEPT_DOT, ".")
    return " ".join(s.split())


def memgallery_tokens(text: object) -> list[str]:
    """Normalised, Porter-stemmed tokens of ``text`` (steps 1-5 of the module rule).

    Examples:
        >>> memgallery_tokens("Running bikes")
        ['run', 'bike']
    """
    return [stem(w) for w in normalize_answer(text).split()]


def memgallery_f1(prediction: object, gold: object) -> float:
    """Token F1 of a prediction against one gold answer (Mem-Gallery ``f1_score``).

    Args:
        prediction: the answer (``str()`` is taken; ``None`` should be passed as ``""``).
        gold: the gold answer.

    Returns:
        F1 in [0, 1]; 0.0 when no stem is shared (two empty texts included).

    Examples:
        >>> memgallery_f1("Not mentioned.", "Not mentioned.")
        1.0
        >>> round(memgallery_f1("a red bicycle", "the red bike"), 2)
        0.5
        >>> round(memgallery_f1("D8:IMG_009", "D8:IMG_009, D8:IMG_010"), 4)
        0.6667
    """
    p, g = memgallery_tokens(prediction), memgallery_tokens(gold)
    overlap = sum((Counter(p) & Counter(g)).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(p), overlap / len(g)
    return 2 * precision * recall / (precision + recall)
