"""PersonaMem's answer reading: which option label a reply gives, and whether it is the gold one.

Source: bowen-upenn/PersonaMem ``inference.py`` / ``inference_standalone_openai.py``,
``Evaluation.extract_answer`` with its ``_extract_only_options`` (the version the released evaluation and
its copies use). Rules, exactly as upstream:

1. The gold letter is ``correct_answer`` lower-cased with ``"() "`` stripped (``"(c)"`` -> ``c``).
2. The reply is stripped; when it holds ``<final_answer>``, the text after the last one is kept, and a
   trailing ``</final_answer>`` is removed.
3. The options a text names (:func:`named_options`), lower-cased: the letters a-d written ``(x)``; when
   there are none, every standalone letter a-d (``\\b[a-d]\\b``: ``"The answer is b"`` names b, and so
   does the article in ``"a reply"``, which is upstream's behaviour).
4. Correct when the options named by the text of rule 2 are exactly ``{gold}``; failing that, when the
   options named by the whole reply are exactly ``{gold}``.

PersonaMem v1 questions have four options, (a) to (d); upstream reads no other letter.
"""

from __future__ import annotations

import re

_IN_PARENS = re.compile(r"\(([a-d])\)")
_STANDALONE = re.compile(r"\b([a-d])\b")
_OPEN, _CLOSE = "<final_answer>", "</final_answer>"


def named_options(text: str) -> set[str]:
    """The option letters a text names (rule 3), lower case.

    Examples:
        >>> sorted(named_options("I pick (B), not (d)")), sorted(named_options("The answer is b"))
        (['b', 'd'], ['b'])
    """
    text = text.lower()
    return set(_IN_PARENS.findall(text)) or set(_STANDALONE.findall(text))


def final_answer(reply: str) -> str:
    """The text after the last ``<final_answer>`` without a trailing ``</final_answer>`` (rule 2).

    Examples:
        >>> final_answer("Thinking... <final_answer>(b)</final_answer>")
        '(b)'
    """
    text = reply.strip()
    if _OPEN in text:
        text = text.split(_OPEN)[-1].strip()
    if text.endswith(_CLOSE):
        text = text[: -len(_CLOSE)].strip()
    return text


def gold_label(correct_answer: str) -> str:
    """The gold letter (rule 1): ``"(c)"`` -> ``"c"``."""
    return correct_answer.lower().strip("() ")


def is_correct(reply: str | None, correct_answer: str) -> tuple[bool, str]:
    """Whether a reply gives the gold option, as upstream decides (rules 1-4).

    Examples:
        >>> is_correct("<final_answer> b", "(b)"), is_correct("(a) or (b)", "(b)")
        ((True, 'b'), (False, '(a) or (b)'))

    Args:
        reply: the answer model's reply; None counts as empty.
        correct_answer: the gold label, e.g. ``"(b)"``.

    Returns:
        ``(correct, predicted)``: the verdict and the text read (rule 2), as upstream returns them.
    """
    full = str(reply or "")
    predicted = final_answer(full)
    gold = gold_label(correct_answer)
    return (named_options(predicted) == {gold} or named_options(full) == {gold}), predicted
