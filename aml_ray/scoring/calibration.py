"""Calibration sets: answers with a human verdict, against which each judge protocol of the panel is measured.

Format (JSON Lines, UTF-8, one item per line; blank lines are skipped)::

    {"id": "cal-01", "question": "When did Caroline go to the LGBTQ support group?",
     "gold": "7 May 2023", "answer": "On 7 May 2023.", "human_verdict": "CORRECT", "category": "2"}

- ``question`` (non-empty string), ``gold`` (a non-empty string, or a non-empty list of acceptable
  answers), ``answer`` (a string; may be empty), ``human_verdict`` (``"CORRECT"`` or ``"WRONG"``);
- ``id`` (optional, unique; default ``line-<n>``), ``category`` (optional string: the question type a
  category-dependent judge prompt reads, e.g. a LongMemEval question type).

No other field is allowed. :func:`load_calibration` raises :class:`CalibrationError` naming the file, the
line and the field. The example set shipped with the package (:data:`EXAMPLE`) was written for the tests:
its verdicts are the authors' reading of each answer, not human ground truth.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

#: The example calibration set (written for the tests; not human ground truth).
EXAMPLE = Path(__file__).with_name("calibration_example.jsonl")


class CalibrationError(ValueError):
    """A calibration file that cannot be used; the message names the file, the line and the field."""


class _Item(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    id: str | None = Field(default=None, min_length=1)
    question: str = Field(min_length=1)
    gold: str | list[str]
    answer: str
    human_verdict: Literal["CORRECT", "WRONG"]
    category: str | None = None

    @field_validator("gold")
    @classmethod
    def _gold(cls, value: str | list[str]) -> str | list[str]:
        golds = [value] if isinstance(value, str) else value
        if not golds or any(not g.strip() for g in golds):
            raise ValueError("expected a non-empty string or a non-empty list of non-empty strings")
        return value


@dataclass(frozen=True)
class CalibrationItem:
    """One calibration answer.

    Attributes:
        id: unique within the set.
        question / answer: the texts the judge sees.
        gold: the acceptable answers (at least one).
        human_verdict: ``"CORRECT"`` or ``"WRONG"``.
        category: the question type for a category-dependent judge prompt, or None.
    """

    id: str
    question: str
    gold: tuple[str, ...]
    answer: str
    human_verdict: str
    category: str | None

    def as_row(self) -> dict:
        """The item as an answered question row, the shape the judge scorers fill (``gold`` as JSON)."""
        return {"question_id": self.id, "question": self.question, "gold": json.dumps(list(self.gold)),
                "answer": self.answer, "category": self.category or "", "excluded": False, "search_status": "ok",
                "answer_status": "ok", "judge_status": None, "verdict": None, "status": None}


def load_calibration(path: Path) -> list[CalibrationItem]:
    """Read and validate a calibration file (format in the module docstring).

    Returns:
        The items in file order (at least one).

    Raises:
        CalibrationError: the file is missing, holds no item, a line is not a JSON object, a field is
            missing, of the wrong type or unknown, or an id repeats; the message names line and field.
    """
    path = Path(path)
    if not path.is_file():
        raise CalibrationError(f"calibration file {path} not found: pass a JSON Lines file "
                               "(aml_ray/scoring/calibration.py documents the format)")
    items: list[CalibrationItem] = []
    seen: set[str] = set()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CalibrationError(f"{path}: line {n}: not JSON ({exc.msg}); write one JSON object per line") from None
        if not isinstance(raw, dict):
            raise CalibrationError(f"{path}: line {n}: expected a JSON object, got {type(raw).__name__}")
        try:
            item = _Item.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "(item)"
            raise CalibrationError(f"{path}: line {n}: field {field!r}: {first['msg']}") from None
        item_id = item.id or f"line-{n}"
        if item_id in seen:
            raise CalibrationError(f"{path}: line {n}: field 'id': {item_id!r} repeats; give every item its own id")
        seen.add(item_id)
        golds = (item.gold,) if isinstance(item.gold, str) else tuple(item.gold)
        items.append(CalibrationItem(item_id, item.question, golds, item.answer, item.human_verdict, item.category))
    if not items:
        raise CalibrationError(f"{path}: no calibration item; write at least one JSON object per line")
    return items
