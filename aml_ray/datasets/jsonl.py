"""Reading JSON Lines benchmark files with errors that name the file and line."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, value)`` for every non-blank line of a JSON Lines file (1-based numbers).

    Lines are split on ``\\n`` only, so a U+2028 inside a JSON string stays in its record.

    Raises:
        ValueError: a line that is not JSON, as ``"<path>:<n>: not JSON (<reason>)"``.
    """
    text = Path(path).read_text(encoding="utf-8")
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from None
