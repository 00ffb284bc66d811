"""What a resumed run does again: the Adds and Searches that gave up, and the questions they touched.

A request that gave up (its retries ran out on transient failures: the participant went away, or kept
answering 429/5xx) is recorded with ``status`` ``error`` and does not stop the run; the run then ends
``partial`` (:mod:`aml_ray.run.outcome`). Resuming it (``aml-ray run --resume``) does them again:

- each sample's Adds that gave up are taken out of its evidence (:meth:`~aml_ray.run.evidence.AddJournal.reopen_failed`)
  and sent again by the run, with the same request_id and body (the run keeps its run_id); their earlier
  rows go to ``evidence/resent/adds.jsonl``, so the evidence keeps every request;
- every question of such a sample is searched, answered and judged again: its Search had seen a store
  without those Adds. (A Streaming step's question then sees the store as it is on resume, which holds
  the sample's later steps too.)
- every question whose Search gave up is searched again.

Their new rows go to new part files; :func:`~aml_ray.run.evidence.read_questions` reads each question's
latest row. A request that *stopped* the run (a contract error or a status the AML error table does not
retry) is in ``evidence/stopped/`` and is sent again in any case: it never reached the journal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from aml_ray.run.evidence import AddJournal, RunDir, read_questions

#: ``status`` of a recorded Add, and ``search_status`` of a recorded Search, that gave up after its retries.
GAVE_UP = "error"


@dataclass
class Reopened:
    """What a resume does again (:func:`plan_reopen`; run.json's ``resumed_resends`` entry is :meth:`describe`).

    Attributes:
        done_questions: question ids whose latest row stands (neither done again nor counted as pending).
        adds: Adds that gave up, to be sent again.
        samples: the samples they belong to (all their questions are done again).
        questions: questions with a row that are done again (their sample's Adds, or their own Search).
    """

    done_questions: set[str] = field(default_factory=set)
    adds: int = 0
    samples: list[str] = field(default_factory=list)
    questions: int = 0

    def describe(self) -> dict[str, int | list[str]]:
        """``{"adds", "samples", "questions"}``, for run.json."""
        return {"adds": self.adds, "samples": self.samples, "questions": self.questions}

    def apply(self, run_dir: RunDir) -> None:
        """Take the Adds that gave up out of the evidence (their rows to ``evidence/resent/adds.jsonl`` first),
        so the run sends them again. Call it once the resume is accepted: until then the evidence is unchanged.

        Raises:
            EvidenceError: a damaged journal or Parquet file.
        """
        for sample_id in self.samples:
            AddJournal(run_dir, sample_id).reopen_failed(lambda rows: _append_lines(run_dir.resent / "adds.jsonl", rows))


def plan_reopen(run_dir: RunDir) -> Reopened:
    """What the resume of the stopped run in ``run_dir`` does again (the module docstring); reads only.

    Returns:
        :class:`Reopened`; :meth:`Reopened.apply` makes the change to the evidence.

    Raises:
        EvidenceError: a damaged journal, Parquet or part file.
    """
    import polars as pl

    samples, adds = [], 0
    files = run_dir.adds.iterdir() if run_dir.adds.exists() else ()
    for sample_id in sorted({p.name[: -len(p.suffix)] for p in files if p.suffix in (".jsonl", ".parquet")}):
        failed = len(AddJournal(run_dir, sample_id).gave_up())
        if failed:
            samples.append(sample_id)
            adds += failed
    questions = read_questions(run_dir, columns=("question_id", "sample_id", "status", "search_status", "excluded"))
    finished = questions.filter(pl.col("status").is_not_null())
    again = (pl.col("search_status") == GAVE_UP) | (pl.col("sample_id").is_in(samples) & ~pl.col("excluded"))
    redo = finished.filter(again.fill_null(False))
    done = set(finished["question_id"].to_list()) - set(redo["question_id"].to_list())
    return Reopened(done_questions=done, adds=adds, samples=samples, questions=redo.height)


def _append_lines(path: Path, rows: list[dict]) -> None:
    """Append ``rows`` as JSON lines (flushed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        fh.flush()
