"""LoCoMo answer normalisation and Porter-stemmed answer tokens.

Source: snap-research/locomo, ``task_eval/evaluation.py`` (``normalize_answer`` and the token step of
``f1_score``). The official steps, in the official order:

1. delete every comma (``s.replace(',', '')``);
2. lowercase;
3. delete every character of ``string.punctuation`` (deleted, not replaced by a space, so
   ``"brown-fox"`` becomes ``"brownfox"`` and ``"May 7, 2023."`` becomes ``"may 7 2023"``);
4. replace the whole words ``a``, ``an``, ``the`` and ``and`` by a space, with the third-party ``regex``
   module as the official script uses it: its ``\b`` counts combining marks as word characters, so
   ``"a"`` + U+0301 is no article (the stdlib ``re`` would remove the ``a`` and keep the bare accent);
5. collapse runs of whitespace to one space and strip the ends.

For token F1 each whitespace token of the normalised text is then Porter-stemmed with nltk's
``PorterStemmer()`` (default ``NLTK_EXTENSIONS`` mode, as in the official script). The stemmer is
rule-based and needs no downloaded nltk corpora.
"""

from __future__ import annotations

import string
from functools import cache, lru_cache

import regex

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES_AND = regex.compile(r"\b(a|an|the|and)\b")


@cache
def _stemmer():
    """nltk's ``PorterStemmer()``, made on the first stem: nltk's import takes about 0.13 s, which a
    driver that only imports the scoring modules never needs."""
    from nltk.stem import PorterStemmer

    return PorterStemmer()


def normalize_answer(text: str) -> str:
    """Normalise an answer string the way LoCoMo's official evaluation does.

    Examples:
        >>> normalize_answer("The Quick, Brown-Fox and a dog!")
        'quick brownfox dog'
        >>> normalize_answer("May 7, 2023.")
        'may 7 2023'

    Args:
        text: a prediction or gold answer. Non-strings (e.g. an int gold ``3``) are rendered with
            ``str()``, as the official script does for gold answers; ``None`` becomes ``""``.

    Returns:
        The normalised text: lowercase, no punctuation, no articles / "and", single spaces.
    """
    s = "" if text is None else str(text)
    s = s.replace(",", "")
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES_AND.sub(" ", s)
    return " ".join(s.split())


@lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    return _stemmer().stem(word)


def stemmed_tokens(text: str) -> list[str]:
    """Return the Porter-stemmed tokens of ``normalize_answer(text)`` (official F1 tokens).

    Examples:
        >>> stemmed_tokens("The cats were running")
        ['cat', 'were', 'run']

    Args:
        text: a prediction or gold answer (see :func:`normalize_answer` for non-strings).

    Returns:
        One stemmed token per whitespace token of the normalised text, in order; ``[]`` when the
        normalised text is empty.
    """
    return [_stem(word) for word in normalize_answer(text).split()]
