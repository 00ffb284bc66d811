"""Reading JSON Lines benchmark files with errors that name the file and line."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from aml_ray.datasets.validate import DatasetFormatError, read_text


def iter_jsonl(path: str | os.PathLike[str], what: str = "one JSON object per line") -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, value)`` for every non-blank line of a JSON Lines file (1-based numbers).

    Lines are split on ``\\n`` only, so a U+2028 inside a JSON string stays in its record.

    Args:
        path: the file.
        what: what the file must hold, for the messages (``"one CL-bench task per line"``).

    Raises:
        DatasetFormatError: an empty (or blank) file, or a line that is not JSON, as
            ``"<path>: line <n>: not JSON (<reason>); expected <what>"``.
        OSError: the file cannot be read.
    """
    text = read_text(path, what)
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetFormatError(f"not JSON ({exc.msg} at column {exc.colno}); expected {what}",
                                     file=path, item=f"line {n}") from None
