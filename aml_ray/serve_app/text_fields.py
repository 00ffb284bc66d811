"""Text field types of the API's request bodies: control characters are refused with a 422.

A NUL byte or another control character in a name or label is never what a person typed: SQLite stores it
(and a page shows the text cut at it), PostgreSQL refuses it outright. :data:`Line` (one-line fields:
names, labels, e-mail, URLs) refuses every character of Unicode category ``Cc``; :data:`Text` (free text:
descriptions, reasons) allows tab, line feed and carriage return and refuses the rest.
"""

from __future__ import annotations

import unicodedata
from typing import Annotated

from pydantic import AfterValidator

#: Control characters a multi-line text may hold.
TEXT_WHITESPACE = frozenset("\t\n\r")


def _first_control(value: str, allowed: frozenset[str]) -> str | None:
    return next((c for c in value if c not in allowed and unicodedata.category(c) == "Cc"), None)


def no_control_line(value: str) -> str:
    """``value`` unchanged when it holds no control character.

    Raises:
        ValueError: names the first control character's code point (e.g. ``U+0000``) and the fix.
    """
    bad = _first_control(value, frozenset())
    if bad is not None:
        raise ValueError(f"control character U+{ord(bad):04X} is not allowed here: remove it (one line of "
                         f"printable text)")
    return value


def no_control_text(value: str) -> str:
    """``value`` unchanged when its only control characters are tab, line feed and carriage return.

    Raises:
        ValueError: names the first other control character's code point and the fix.
    """
    bad = _first_control(value, TEXT_WHITESPACE)
    if bad is not None:
        raise ValueError(f"control character U+{ord(bad):04X} is not allowed: remove it (tab and line breaks "
                         f"are fine)")
    return value


#: A one-line text field: no control characters.
Line = Annotated[str, AfterValidator(no_control_line)]
#: A multi-line text field: tab, line feed and carriage return only.
Text = Annotated[str, AfterValidator(no_control_text)]
