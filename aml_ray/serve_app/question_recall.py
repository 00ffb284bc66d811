"""Evidence recall of one bundle's questions as the drill-down pages show it.

The figures are the run's own: ``evidence/recall.parquet`` under the bundle's run directory, one row per
question whose Search succeeded (:func:`aml_ray.scoring.evidence_recall.recall_rows`; ``recall@K`` by the
fuzzy rule, the headline, and ``recall_exact@K``, with ``first_rank`` / ``first_rank_exact``). A dataset
has evidence ids when any of its rows names one (resolved or not); a question without a row was excluded or
its Search failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: What the page says when a question has no recall figures, by cause.
NOTES = {
    "not_computed": "Evidence recall was not computed for this run.",
    "no_ids": "No evidence ids in this dataset.",
    "no_row": "No evidence recall: the question was excluded or its Search failed.",
    "no_question_ids": "This question has no evidence ids.",
    "unresolved": "None of this question's evidence ids names a turn of its conversation.",
}


@dataclass(frozen=True)
class BundleRecall:
    """A bundle's per-question recall rows.

    Attributes:
        rows: ``{question_id: recall row}`` (the columns of ``recall.parquet``); empty when ``computed`` is
            False.
        computed: whether the run wrote ``recall.parquet``.
    """

    rows: dict[str, dict[str, Any]]
    computed: bool

    @classmethod
    def read(cls, bundle_dir: Path) -> BundleRecall:
        """The recall rows of the bundle whose run directory is ``bundle_dir`` (none when the file is absent)."""
        import pyarrow.parquet as pq

        from aml_ray.run.evidence import RunDir

        path = RunDir(bundle_dir).recall
        if not path.is_file():
            return cls({}, False)
        return cls({r["question_id"]: r for r in pq.read_table(path).to_pylist()}, True)

    @property
    def has_ids(self) -> bool:
        """Whether any question of the dataset names an evidence id (resolved to turns or not)."""
        return any((r.get("n_evidence") or 0) + (r.get("n_unresolved") or 0) for r in self.rows.values())

    @property
    def note(self) -> str | None:
        """Why no question of the bundle has figures (one of :data:`NOTES`), or None when some may have."""
        if not self.computed:
            return NOTES["not_computed"]
        return None if self.has_ids else NOTES["no_ids"]

    def of(self, question_id: str) -> tuple[dict[str, Any] | None, str | None]:
        """``(recall row, None)`` when the question has figures, else ``(None, the note that says why)``
        (one of :data:`NOTES`)."""
        if self.note:
            return None, self.note
        row = self.rows.get(question_id)
        if row is None:
            return None, NOTES["no_row"]
        if not row.get("n_evidence"):
            return None, NOTES["unresolved" if row.get("n_unresolved") else "no_question_ids"]
        return row, None


def recall_ks(row: dict[str, Any]) -> list[int]:
    """The K values of a recall row's ``recall@K`` columns, ascending (the run's own, whatever its K were).

    Examples:
        >>> recall_ks({"recall@10": 1.0, "recall@1": 0.0, "recall_exact@1": 0.0, "first_rank": 2})
        [1, 10]
    """
    return sorted(int(name.split("@", 1)[1]) for name in row if name.startswith("recall@"))
