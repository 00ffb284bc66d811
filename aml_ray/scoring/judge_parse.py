"""Parse the binary LLM judge's reply into ``"CORRECT"`` or ``"WRONG"``.

Source: the LoCoMo / LongMemEval judge contract in DESIGN.md ("Scoring contracts"): the judge is asked
to answer with JSON ``{"label": "CORRECT"|"WRONG"}`` (as in mem0's ``evaluation/metrics/llm_judge.py``,
which reads ``json.loads(reply)["label"]``). Real judge replies drift from that, so these forms are
accepted, all case-insensitive in the key and the value:

- a JSON object with a ``label`` key, alone, inside a fenced ```` ```json ```` block, or embedded in
  prose (for example after a one-line rationale); nested objects are searched too;
- the same object written as a Python literal with single quotes, ``{'label': 'WRONG'}``;
- a line that holds only ``label: CORRECT`` (``=`` instead of ``:``, quotes, and markdown bold or
  bullets around it are tolerated);
- a reply that is exactly one label word (``"CORRECT"``, ``"wrong."``).

Anything else raises :class:`JudgeParseError`, in particular prose that merely mentions the words
("the answer is correct, not wrong"): the parser never guesses. When the accepted forms in one reply
disagree, it raises too. The caller retries a bounded number of times, then records ``judge_error``.
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
_LABEL_LINE = re.compile(
    r"""^[\s>*#_\-]*["']?label["']?[\s*_]*[:=][\s*_]*["']?(correct|wrong)["']?[\s*_.,]*$""",
    re.IGNORECASE | re.MULTILINE,
)
_BARE_LABEL = re.compile(r"""^[\s"'*_`]*(correct|wrong)[\s"'*_`.!]*$""", re.IGNORECASE)
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


def _label_value(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    cleaned = value.strip().strip(".").strip().upper()
    return cleaned if cleaned in LABELS else None


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
    """Return the binary judge's label from its raw reply.

    Examples:
        >>> parse_judge_label('{"label": "CORRECT"}')
        'CORRECT'
        >>> parse_judge_label("The dates match.\\n{'label': 'wrong'}")
        'WRONG'
        >>> parse_judge_label("Reasoning: same city.\\nlabel: Correct")
        'CORRECT'

    Args:
        text: the judge model's reply, verbatim.

    Returns:
        ``"CORRECT"`` or ``"WRONG"``.

    Raises:
        JudgeParseError: if the reply is empty, holds no label in an accepted form, holds a ``label``
            whose value is neither CORRECT nor WRONG (e.g. ``"INCORRECT"``), or holds conflicting
            labels. The message includes the reply truncated to 200 characters.
    """
    if text is None or not str(text).strip():
        raise JudgeParseError("empty judge reply", text)
    reply = str(text)

    structured = _object_labels(reply)
    if not structured:
        structured = [m.group(1).upper() for m in _LABEL_LINE.finditer(reply)]
    if not structured:
        bare = _BARE_LABEL.match(reply)
        if bare:
            return bare.group(1).upper()
        raise JudgeParseError(
            'no label found (expected JSON {"label": "CORRECT"|"WRONG"} or a "label: ..." line)', reply
        )
    if None in structured:
        raise JudgeParseError("a label value is neither CORRECT nor WRONG", reply)
    distinct = set(structured)
    if len(distinct) > 1:
        raise JudgeParseError("conflicting labels in judge reply", reply)
    return distinct.pop()
