"""Parse the binary LLM judge's reply into ``"CORRECT"`` or ``"WRONG"``.

Source: the LoCoMo / LongMemEval judge contract in DESIGN.md ("Scoring contracts"): the judge is asked
to answer with JSON ``{"label": "CORRECT"|"WRONG"}`` (as in mem0's ``evaluation/metrics/llm_judge.py``,
which reads ``json.loads(reply)["label"]``). Real judge replies drift from that, so these label forms are
accepted, all case-insensitive in the key and the value:

- a JSON object with a ``label`` key, alone, inside a fenced ```` ```json ```` block, or embedded in
  prose (for example after a one-line rationale); nested objects are searched too;
- the same object written as a Python literal with single quotes, ``{'label': 'WRONG'}``;
- a line that holds only ``label: CORRECT`` (``=`` instead of ``:``, quotes, and markdown bold or
  bullets around it are tolerated);
- a reply that is exactly one verdict (``"CORRECT"``, ``"wrong."``, ``"Incorrect"``, ``"NOT CORRECT"``).

A label's value is ``CORRECT``, or a negative: ``WRONG``, ``INCORRECT`` or ``NOT CORRECT`` (all read as
``WRONG``). Issue 24 (a run where 21 of 152 questions whose first reply was a negative such as "The
answer is INCORRECT." were re-asked until a reply said CORRECT) adds the rule that **a negative verdict
in any form is WRONG at once**, so the caller never re-asks it. Besides the label forms, a negative
counts in prose when it is asserted:

- after ``is``/``was``/``are``/``'s`` (``not`` and an intensifier such as ``clearly`` or ``entirely``
  may come between): "The answer is INCORRECT.", "it's wrong", "is not entirely correct", "isn't
  correct"; a conditional ("would be wrong", "is wrong if ...") or a hedge ("might be wrong", "is
  probably wrong") asserts nothing;
- at the start of a line, alone or before punctuation, optionally after ``verdict``/``judgment``/
  ``grade``/``result``/``assessment``/``evaluation``/``final answer`` and a colon: "Incorrect. The
  gold says May.", "**WRONG** - different city", "Verdict: incorrect".

The same prose forms with ``correct`` are read as positive assertions too, but only to detect a
conflict: a positive verdict is accepted only as a label, so "The answer is correct." alone still raises
(the parser never guesses in the answer's favour). Words that are no verdict on the answer ("the correct
answer is Paris", "nothing wrong with the format") count for nothing.

Anything else raises :class:`JudgeParseError`: no verdict at all; a label value that is none of the
above (``"PARTIAL"``); a double negative (``"not incorrect"``, ``"is not wrong"``, ``{"label": "NOT
WRONG"}``), which asserts neither; or verdicts that disagree anywhere in the reply (a ``label: WRONG``
line beside ``{"label": "CORRECT"}``, "The answer is CORRECT. ... it is INCORRECT."). The caller re-asks
a bounded number of times, then records ``judge_error``.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

LABELS = ("CORRECT", "WRONG")
"""The two labels the binary judge may return."""

_ERROR_EXCERPT_CHARS = 200
_MAX_LITERAL_CHARS = 20_000
_MARK = r"""[\s*_"'`]"""  # whitespace, markdown emphasis and quotes around words
_VERDICT = r"(?:(?P<neg>not|never)" + _MARK + r"+)?(?P<word>incorrect|wrong|correct)"
_LABEL_LINE = re.compile(
    r"""^[\s>*#_\-]*["']?label["']?[\s*_]*[:=][\s*_]*["']?""" + _VERDICT + r"""["']?[\s*_.,]*$""",
    re.IGNORECASE | re.MULTILINE,
)
_BARE_VERDICT = re.compile(r"""^[\s"'*_`]*""" + _VERDICT + r"""[\s"'*_`.!]*$""", re.IGNORECASE)
_INTENSIFIER = (r"(?:entirely|fully|completely|totally|quite|exactly|strictly|clearly|definitely|simply|"
                r"actually|factually|absolutely|also|therefore|thus|hence|so)")
#: ``is``/``was``/``are``/``'s`` (or their ``n't`` forms), then the verdict word; not before if/when/unless
_PREDICATE = re.compile(
    r"(?:\b(?:is|was|are|were)|(?<=\w)['’]s|\b(?P<copneg>is|was|are|were)n['’]t)" + _MARK + r"+"
    r"(?:" + _INTENSIFIER + _MARK + r"+)?(?:(?P<neg>not|never)" + _MARK + r"+)?(?:" + _INTENSIFIER + _MARK
    + r"+)?(?P<word>incorrect|wrong|correct)\b(?!" + _MARK + r"*(?:if|when|unless)\b)",
    re.IGNORECASE,
)
#: a line that opens with the verdict (after an optional ``verdict:``-style key), then punctuation or its end
_LINE_VERDICT = re.compile(
    r"""^[\s>*#_\-"'`]*(?:(?:verdict|judge?ment|grade|result|assessment|evaluation|final\s+answer)"""
    + _MARK + r"*[:=]" + _MARK + r"*)?" + _VERDICT + r"""[\s"'*_`]*(?:[.!:;,\-—–]|$)""",
    re.IGNORECASE | re.MULTILINE,
)
_VERDICT_VALUE = re.compile(r"(?:(?P<neg>not|never) )?(?P<word>incorrect|wrong|correct)", re.IGNORECASE)
_DOUBLE_NEGATIVE = "DOUBLE_NEGATIVE"
_DECODER = json.JSONDecoder()


class ReplyParseError(ValueError):
    """A model reply that a scorer cannot use; the base of every judge-reply parse error.

    Attributes:
        reply: the received reply, truncated to 200 characters.
    """

    def __init__(self, problem: str, reply: str | None) -> None:
        excerpt = "" if reply is None else str(reply)[:_ERROR_EXCERPT_CHARS]
        super().__init__(f"{problem}; received {excerpt!r}")
        self.reply = excerpt


class JudgeParseError(ReplyParseError):
    """The judge reply holds no recognisable CORRECT/WRONG label (or conflicting ones)."""


def _polarity(word: str, negations: int) -> str:
    """``CORRECT``, ``WRONG`` or the double-negative marker for a verdict word under 0, 1 or 2 negations."""
    positive = word.lower() == "correct"
    if negations == 0:
        return "CORRECT" if positive else "WRONG"
    return "WRONG" if positive and negations == 1 else _DOUBLE_NEGATIVE


def _polarity_of(match: re.Match[str]) -> str:
    groups = match.groupdict()
    return _polarity(groups["word"], bool(groups.get("neg")) + bool(groups.get("copneg")))


def _label_value(value: Any) -> str | None:
    """A label value's polarity (see :func:`_polarity`), or None for a value that is no verdict."""
    if not isinstance(value, str):
        return None
    match = _VERDICT_VALUE.fullmatch(" ".join(value.strip().strip(".").split()))
    return _polarity_of(match) if match else None


def _labels_in(obj: Any) -> list[str | None]:
    """Collect the values of every ``label`` key (any case) in a decoded object, depth first."""
    found: list[str | None] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            if isinstance(key, str) and key.strip().lower() == "label":
                found.append(_label_value(value))
            else:
                found.extend(_labels_in(value))
    elif isinstance(obj, list):
        for item in obj:
            found.extend(_labels_in(item))
    return found


def _matching_brace(text: str, start: int) -> int | None:
    """Index of the brace closing ``text[start]``, skipping quoted strings; None if unbalanced."""
    depth = 0
    quote: str | None = None
    escaped = False
    for i in range(start, min(len(text), start + _MAX_LITERAL_CHARS)):
        ch = text[i]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def _object_labels(text: str) -> list[str | None]:
    """Labels from every outermost JSON or Python-literal object in ``text``."""
    found: list[str | None] = []
    i = text.find("{")
    while i != -1:
        end: int | None = None
        obj: Any = None
        try:
            obj, end = _DECODER.raw_decode(text, i)
        except ValueError:
            close = _matching_brace(text, i)
            if close is not None:
                try:
                    obj = ast.literal_eval(text[i : close + 1])
                    end = close + 1
                except (ValueError, SyntaxError, MemoryError, RecursionError):
                    obj = None
        if end is not None and isinstance(obj, dict):
            found.extend(_labels_in(obj))
            i = text.find("{", end)
        else:
            i = text.find("{", i + 1)
    return found


def parse_judge_label(text: str) -> str:
    """Return the binary judge's label from its raw reply (the rules are in the module docstring).

    Examples:
        >>> parse_judge_label('{"label": "CORRECT"}')
        'CORRECT'
        >>> parse_judge_label("The dates match.\\n{'label': 'wrong'}")
        'WRONG'
        >>> parse_judge_label("Reasoning: same city.\\nlabel: Correct")
        'CORRECT'
        >>> parse_judge_label("The answer is INCORRECT.")
        'WRONG'
        >>> parse_judge_label('label: WRONG\\n{"label": "CORRECT"}')
        Traceback (most recent call last):
        ...
        aml_ray.scoring.judge_parse.JudgeParseError: conflicting verdicts in judge reply; received ...

    Args:
        text: the judge model's reply, verbatim.

    Returns:
        ``"CORRECT"`` (only from a label form) or ``"WRONG"`` (from a negative in any accepted form).

    Raises:
        JudgeParseError: if the reply is empty; holds no verdict in an accepted form (a positive one only
            in prose counts as none); holds a ``label`` whose value is not a verdict (e.g. ``"PARTIAL"``);
            holds a double negative (``"not incorrect"``); or holds verdicts that disagree. The message
            includes the reply truncated to 200 characters.
    """
    if text is None or not str(text).strip():
        raise JudgeParseError("empty judge reply", text)
    reply = str(text)

    labels = _object_labels(reply) + [_polarity_of(m) for m in _LABEL_LINE.finditer(reply)]
    bare = _BARE_VERDICT.match(reply)
    if bare:
        labels.append(_polarity_of(bare))
    if None in labels:
        raise JudgeParseError("a label value is none of CORRECT, WRONG, INCORRECT, NOT CORRECT", reply)
    prose = [_polarity_of(m) for pattern in (_PREDICATE, _LINE_VERDICT) for m in pattern.finditer(reply)]
    found = set(labels) | set(prose)
    if _DOUBLE_NEGATIVE in found:
        raise JudgeParseError("a double negative (such as 'not incorrect') asserts no verdict", reply)
    if len(found) > 1:
        raise JudgeParseError("conflicting verdicts in judge reply", reply)
    if found == {"WRONG"} or labels:
        return found.pop()
    raise JudgeParseError(
        'no label found (expected JSON {"label": "CORRECT"|"WRONG"} or a "label: ..." line; a positive verdict '
        "in prose is not a label)", reply
    )
