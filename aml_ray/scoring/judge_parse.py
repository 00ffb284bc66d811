"""Parse the binary LLM judge's reply into ``"CORRECT"`` or ``"WRONG"``.

Source: the LoCoMo / LongMemEval judge contract in DESIGN.md ("Scoring contracts"): the judge is asked
for a one-line rationale, then JSON ``{"label": "CORRECT"|"WRONG"}`` on the last line (mem0's
``evaluation/metrics/llm_judge.py`` reads ``json.loads(reply)["label"]``). A reply is read in two layers.

**Labels** decide. These forms are labels, all case-insensitive in the key and the value:

- a JSON object, alone, inside a fenced ```` ```json ```` block or embedded in prose, or the same object
  as a Python literal (``{'label': 'WRONG'}``); nested objects are searched too. A key that names a
  verdict (``label``, ``label2``, ``verdict``, ``judgment``, ``grade``, ``correctness``, with an
  optional ``final_`` prefix) is a label when its value is a verdict; a ``label`` key whose value is
  no verdict (``"PARTIAL"``) is an error. Other keys (``reason``, ``answer``) are rationale;
- a line that holds only a verdict, optionally after a short key and a colon (``label: CORRECT``,
  ``CORRECTNESS: WRONG``, ``**Verdict:** incorrect``, ``Incorrect.``);
- a verdict that ends the reply's last line after a sentence break (``... but incomplete. WRONG``).

A label's value is ``CORRECT``, or a negative: ``WRONG``, ``INCORRECT`` or ``NOT CORRECT`` (all read as
``WRONG``). When the labels agree, their verdict is the reply's verdict and everything else is rationale,
whatever verdict words it uses ("the year is correct but the month is wrong", "which is not wrong").
Labels that disagree (two JSON labels, a bare final label against the JSON, ``{"label": "CORRECT",
"label2": "WRONG"}``) and a double-negative label (``{"label": "NOT WRONG"}``) raise.

**Prose** counts only in a reply without any label, and only a negative is accepted from it (the rule
that a negative verdict is WRONG at once, so the caller never re-asks it into a CORRECT; the parser never
guesses in the answer's favour). A negative counts when it is asserted:

- after ``is``/``was``/``are``/``'s`` (``not`` and an intensifier such as ``clearly`` or ``entirely``
  may come between): "The answer is INCORRECT.", "it's wrong", "is not entirely correct", "isn't
  correct"; a conditional ("would be wrong", "is wrong if ...") or a hedge ("might be wrong", "is
  probably wrong") asserts nothing;
- at the start of a line before punctuation, optionally after ``verdict``/``judgment``/``grade``/
  ``result``/``assessment``/``evaluation``/``final answer`` and a colon: "Incorrect. The gold says
  May.", "**WRONG** - different city".

Without a label, a positive verdict in prose ("The answer is correct."), a double negative ("is not
incorrect"), prose verdicts that disagree, or no verdict at all raise :class:`JudgeParseError`. The
caller re-asks a bounded number of times, then records ``judge_error``.
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
#: a line that holds only a verdict, after an optional short key and a colon (``label: CORRECT``)
_LABEL_LINE = re.compile(
    r"""^[\s>*#_\-`"']*(?:[a-z][\w ]{0,30}?["'*_\s]*[:=][\s*_`"']*)?""" + _VERDICT + r"""[\s"'*_`.!,]*$""",
    re.IGNORECASE | re.MULTILINE,
)
#: a verdict that ends a line after a sentence break, a colon or a spaced dash (``... incomplete. WRONG``)
_FINAL_LABEL = re.compile(
    r"""(?:[.!?:;|)\]]|\s[-—–])[\s*_`"']*""" + _VERDICT + r"""[\s"'*_`.!]*$""", re.IGNORECASE
)
#: JSON keys whose verdict value is a label: label, label2, verdict, final_judgment, correctness, ...
_LABEL_KEY = re.compile(r"(?:final[_\s-]?)?(?:label|verdict|judge?ment|grade|correctness)\w*", re.IGNORECASE)
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
    """Collect the labels of a decoded object, depth first: every ``label`` key's value (None when it is
    no verdict) and every verdict value of another label-like key (see ``_LABEL_KEY``)."""
    found: list[str | None] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            name = key.strip() if isinstance(key, str) else ""
            if isinstance(value, (dict, list)):
                found.extend(_labels_in(value))
            elif name.lower() == "label":
                found.append(_label_value(value))
            elif _LABEL_KEY.fullmatch(name) and _label_value(value) is not None:
                found.append(_label_value(value))
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
        aml_ray.scoring.judge_parse.JudgeParseError: conflicting labels in judge reply; received ...

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
    last_line = reply.strip().splitlines()[-1]
    final = _FINAL_LABEL.search(last_line)
    if final:
        labels.append(_polarity_of(final))
    if None in labels:
        raise JudgeParseError("a label value is none of CORRECT, WRONG, INCORRECT, NOT CORRECT", reply)
    if _DOUBLE_NEGATIVE in labels:
        raise JudgeParseError("a double negative label (such as 'NOT WRONG') asserts no verdict", reply)
    if len(set(labels)) > 1:
        raise JudgeParseError("conflicting labels in judge reply", reply)
    if labels:
        return labels[0]
    prose = {_polarity_of(m) for pattern in (_PREDICATE, _LINE_VERDICT) for m in pattern.finditer(reply)}
    if _DOUBLE_NEGATIVE in prose:
        raise JudgeParseError("a double negative (such as 'not incorrect') asserts no verdict", reply)
    if len(prose) > 1:
        raise JudgeParseError("conflicting verdicts in the judge's prose and no label", reply)
    if prose == {"WRONG"}:
        return "WRONG"
    raise JudgeParseError(
        'no label found (expected JSON {"label": "CORRECT"|"WRONG"} or a "label: ..." line; a positive verdict '
        "in prose is not a label)", reply
    )
