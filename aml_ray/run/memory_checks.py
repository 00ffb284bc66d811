"""The run's checks of the memories its participant returned: isolation (a memory of another user_id), evidence
recall and the integrity canaries (memories or answers addressed to the model, :mod:`aml_ray.run.injection`),
in one pass over each question's memories.

:func:`memory_checks` reads them from the run's question evidence after the pipeline. :class:`RunningChecks`
does the same pass while the pipeline runs, fed each output table as the driver receives it (the rows it
writes as evidence), in a thread of its own, so that after the run's last Search only the last tables are
left to check: with the reference BM25 system's 100 memories a question, the pass over LoCoMo's 1,540
questions took 1.0 s of the run's tail. A resumed run, whose evidence holds
rows of earlier attempts, reads the files instead, each question's latest row only
(:func:`aml_ray.run.evidence.iter_question_rows`).
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from aml_ray.run.evidence import RunDir, as_question_table, iter_question_rows, write_parquet_atomic
from aml_ray.run.injection import InjectionFinder
from aml_ray.run.inputs import PipelineInputs, read_sample_files
from aml_ray.run.isolation import LeakFinder, index_adds

#: The question evidence columns the checks read.
COLUMNS = ("question_id", "user_id", "sample_id", "category", "excluded", "search_status", "memories", "answer")

#: The Arrow schema of ``evidence/injections.parquet`` (:attr:`aml_ray.run.injection.InjectionFinder.flags`).
INJECTION_SCHEMA = pa.schema([("question_id", pa.string()), ("where", pa.string()), ("memory_id", pa.string()),
                              ("rank", pa.int32()), ("rules", pa.list_(pa.string())), ("excerpt", pa.string())])

Checked = tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]
"""``(leaks, recall table, flags)``: one dict per question that got a memory of another user_id (empty when
isolation held), the per-category recall table (:func:`aml_ray.scoring.evidence_recall.recall_table`), and one
dict per memory or answer flagged by the integrity canaries (:class:`aml_ray.run.injection.InjectionFinder`)."""


def adds_index(inputs: PipelineInputs):
    """Who was sent what in the run (:func:`aml_ray.run.isolation.index_adds` over every sample input's Adds),
    for the isolation check."""
    def adds_by_user():
        for path in inputs.sample_paths():
            adds = json.loads(read_sample_files([path]).column("adds_json")[0].as_py())
            if adds:
                yield adds[0]["user_id"], adds

    return index_adds(adds_by_user())


def _check(samples, inputs: PipelineInputs, rows: Iterable[dict[str, Any]]
           ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """``(leaks, recall rows, flags)`` of ``rows`` (:data:`COLUMNS`), in one pass."""
    from aml_ray.scoring.evidence_recall import recall_rows

    finder, canaries = LeakFinder(adds_index(inputs)), InjectionFinder()

    def checked(rows):
        for row in rows:
            finder.check(row)
            canaries.check(row)
            yield row

    return finder.leaks, list(recall_rows(samples, checked(rows))), canaries.flags


def _written(run_dir: RunDir, leaks: list[dict[str, Any]], recall: list[dict[str, Any]],
             flags: list[dict[str, Any]]) -> Checked:
    """Write the per-question recall rows to ``evidence/recall.parquet`` and the flags to
    ``evidence/injections.parquet``; the leaks, the recall table and the flags."""
    from aml_ray.scoring.evidence_recall import recall_table

    table = pa.Table.from_pylist(recall) if recall else pa.table({"question_id": pa.array([], pa.string())})
    write_parquet_atomic(table, run_dir.recall)
    write_parquet_atomic(pa.Table.from_pylist(flags, schema=INJECTION_SCHEMA), run_dir.injections)
    return leaks, recall_table(recall), flags


def memory_checks(samples, inputs: PipelineInputs, run_dir: RunDir) -> Checked:
    """The run's isolation check and evidence recall, in one pass over its question evidence's memories.

    Leaks: :class:`aml_ray.run.isolation.LeakFinder`, the run's sample inputs (who was sent what:
    :func:`adds_index`) against each question's memories. Recall: per-question evidence recall written to
    ``evidence/recall.parquet`` (:func:`aml_ray.scoring.evidence_recall.recall_rows`). The memories are read one row group at a time,
    and once for both: reading and converting them is most of either check's time with a participant that
    returns many.

    Returns:
        :data:`Checked`.
    """
    files = [str(p) for p in sorted(run_dir.questions.glob("*.parquet"))]
    return _written(run_dir, *_check(samples, inputs, iter_question_rows(files, COLUMNS)))


class RunningChecks:
    """:func:`memory_checks` done while the pipeline runs: :meth:`feed` each output table as the driver receives
    it (a fresh run's evidence is exactly those tables, in that order), :meth:`finish` after the pipeline.

    The pass runs in a daemon thread, one table after another; the index of who was sent what is built
    there first. The results equal :func:`memory_checks`' over the evidence files: the same rows in the same
    order (the excluded questions' rows, written first, have no memories and no recall row).

    Args:
        samples / inputs: the run's samples and inputs.
    """

    def __init__(self, samples, inputs: PipelineInputs):
        self.samples, self.inputs = samples, inputs
        self._tables: queue.SimpleQueue[pa.Table | None] = queue.SimpleQueue()
        self._result: tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]] | None = None  # None: not (yet) made
        self._thread = threading.Thread(target=self._run, name="aml-ray-memory-checks", daemon=True)
        self._thread.start()

    def feed(self, table: pa.Table) -> None:
        """Check ``table``'s rows (question rows: :data:`aml_ray.run.evidence.QUESTION_SCHEMA`'s columns) in the
        checks' thread; returns at once."""
        self._tables.put(table)

    def close(self) -> None:
        """No more tables: the thread ends once it has checked those fed (idempotent)."""
        self._tables.put(None)

    def finish(self, run_dir: RunDir) -> Checked:
        """Wait for the tables fed, write ``evidence/recall.parquet``; :func:`memory_checks`' result.

        Raises what :func:`memory_checks` raises: when the pass in the thread failed, it is made again over the
        evidence files.
        """
        self.close()
        self._thread.join()
        if self._result is None:  # the thread's pass failed: the evidence files are the record
            return memory_checks(self.samples, self.inputs, run_dir)
        return _written(run_dir, *self._result)

    def _rows(self) -> Iterator[dict[str, Any]]:
        while (table := self._tables.get()) is not None:
            yield from as_question_table(table).select(list(COLUMNS)).to_pylist()

    def _run(self) -> None:
        try:
            self._result = _check(self.samples, self.inputs, self._rows())
        except BaseException:  # noqa: BLE001 - finish() makes the pass again from the files
            pass
