"""Errata: versioned corrections of a bundle's gold answers, applied when a finished run is re-judged.

An errata file (JSON) belongs to one bundle and has a version; each entry names a question by aml-ray's
question id and either gives the corrected gold answer (a string, or a list of acceptable answers) or
excludes the question, always with the public source of the correction::

    {"bundle": "locomo", "version": "2026-12-10", "dataset_sha256": "<sha256 of the file it corrects>",
     "entries": [{"question_id": "conv-26:q0005", "answer": "The Saturday before 25 May 2023",
                  "source": "https://github.com/snap-research/locomo/pull/28", "note": "..."},
                 {"question_id": "conv-26:q0094", "exclude": true, "source": "https://..."}]}

``aml-ray rejudge RUN_DIR --errata FILE`` applies it to the run's stored answers (:func:`apply_errata`) and
records the errata's bundle, version and sha256 in ``rejudge.json`` and ``results.json``; ``aml-ray compare
RUN_DIR RUN_DIR/rejudge/<label>`` then shows the difference it makes. The errata shipped with aml-ray are
in this folder, one file per bundle (:func:`shipped`): ``locomo.json``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, ValidationError, model_validator

#: Where the shipped errata files are: ``<bundle>.json``.
SHIPPED = Path(__file__).resolve().parent


class Erratum(BaseModel):
    """One correction: a new gold answer, or the question excluded; with its public source."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    question_id: str = Field(min_length=1)
    answer: str | list[str] | None = None
    exclude: bool = False
    source: HttpUrl
    note: str | None = None

    @model_validator(mode="after")
    def _one_change(self) -> Erratum:
        if self.exclude == (self.answer is not None):
            raise ValueError("give either 'answer' (the corrected gold) or 'exclude': true, not both or neither")
        if isinstance(self.answer, list) and not self.answer or self.answer == "":
            raise ValueError("'answer' is empty: give the corrected gold answer")
        return self


class Errata(BaseModel):
    """A bundle's errata file (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bundle: str = Field(min_length=1)
    version: str = Field(min_length=1)
    dataset_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    note: str | None = None
    entries: list[Erratum] = Field(min_length=1)
    sha256: str = ""

    @model_validator(mode="after")
    def _unique(self) -> Errata:
        seen: set[str] = set()
        for e in self.entries:
            if e.question_id in seen:
                raise ValueError(f"question_id {e.question_id!r} is listed twice: keep one entry per question")
            seen.add(e.question_id)
        return self

    def describe(self) -> dict[str, Any]:
        """``{"bundle", "version", "sha256", "entries"}`` for rejudge.json and results.json."""
        return {"bundle": self.bundle, "version": self.version, "sha256": self.sha256, "entries": len(self.entries)}


def load_errata(path: Path) -> Errata:
    """Read and check an errata file.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not JSON, or a field is wrong: the message names the file, the field (e.g.
            ``entries.2.source``) and what it needs.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--errata {path}: no such file")
    data = path.read_bytes()
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise ValueError(f"--errata {path}: not JSON ({exc})") from None
    if isinstance(raw, dict):
        raw = {**raw, "sha256": hashlib.sha256(data).hexdigest()}
    try:
        return Errata.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "file"
        raise ValueError(f"--errata {path}: {where}: {first['msg']}") from None


def shipped(bundle: str) -> Path:
    """The errata file aml-ray ships for ``bundle``.

    Raises:
        FileNotFoundError: none is shipped for it.
    """
    path = SHIPPED / f"{bundle}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no errata are shipped for bundle {bundle!r}")
    return path


def apply_errata(rows: list[dict[str, Any]], errata: Errata, *, dataset: str,
                 dataset_sha256: str | None = None) -> dict[str, int]:
    """Apply ``errata`` to question evidence rows in place: a corrected gold replaces ``gold`` (JSON text, as
    evidence stores it); an excluded question becomes ``excluded`` with ``excluded_reason`` naming the errata.
    A Streaming row ``<question_id>@<step>`` is corrected with its question.

    Args:
        rows: the run's question rows.
        errata: the loaded errata.
        dataset: the run's dataset name (must be the errata's bundle).
        dataset_sha256: the run's dataset file hash; refused when the errata name another file.

    Returns:
        ``{"corrected": n, "excluded": n, "not_in_run": n}``: rows changed, and entries that matched no scored
        row (their question is not in the run, or the run excludes it already).

    Raises:
        ValueError: the errata are another bundle's, or correct another file of it.
    """
    if errata.bundle != dataset:
        raise ValueError(f"errata {errata.bundle} {errata.version} correct bundle {errata.bundle!r}, but the run "
                         f"is of {dataset!r}: pass that bundle's errata file")
    if errata.dataset_sha256 and dataset_sha256 and errata.dataset_sha256 != dataset_sha256:
        raise ValueError(f"errata {errata.bundle} {errata.version} correct the file with sha256 "
                         f"{errata.dataset_sha256[:12]}..., but the run read {dataset_sha256[:12]}...")
    by_id = {e.question_id: e for e in errata.entries}
    counts = {"corrected": 0, "excluded": 0}
    matched: set[str] = set()
    for row in rows:
        entry = by_id.get(row["question_id"].split("@", 1)[0])
        if entry is None or row["excluded"]:  # a question the run never scored stays as it was
            continue
        matched.add(entry.question_id)
        if entry.exclude:
            row.update(excluded=True, excluded_reason=f"errata {errata.version}: {entry.source}")
            counts["excluded"] += 1
        else:
            row["gold"] = json.dumps(entry.answer)
            counts["corrected"] += 1
    return {**counts, "not_in_run": len(by_id) - len(matched)}
