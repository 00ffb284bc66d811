"""The pipeline's inputs, built one sample at a time and spilled to disk (flat driver memory).

The driver never holds the whole corpus's Add requests or question rows: :func:`build_inputs` chunks one
sample, builds its Add requests (ids per DESIGN.md "IDs") and question rows, writes them to the inputs
folder and forgets them; :class:`PipelineInputs` keeps only counts and the folder. The pipeline
(:func:`aml_ray.run.pipeline.run_pipeline`) hands Ray Data one path per block, so each Ingest task still gets
exactly one sample (DESIGN.md "The pipeline": the unit of ingestion is one sample).
Ray Data carries only the file paths (:func:`read_sample_files` runs in the Ingest actor).

Layout of the inputs folder (``<run_dir>/inputs/`` for ``aml-ray run``; rebuilt on every start and
resume, derived from the dataset and the run id, never evidence)::

    sample-000000.arrow ...     one file per sample, one row of :data:`SAMPLE_INPUT_SCHEMA` (the
                                IngestStage's input row), in the adapter's sample order; an Arrow IPC
                                file (:func:`read_sample_files` says why not Parquet)
    excluded.parquet            question rows that are not scored (:data:`aml_ray.run.evidence.QUESTION_SCHEMA`,
                                e.g. LoCoMo category 5), one row group per sample that has any; absent
                                when there are none
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from aml_ray.contract import AddRequest
from aml_ray.datasets.base import Sample, turn_ids
from aml_ray.datasets.chunking import chunk_sample, count_words
from aml_ray.run.evidence import (
    QUESTION_INPUT_COLUMNS,
    QUESTION_INPUT_TYPE,
    QUESTION_SCHEMA,
    empty_question_row,
    to_table,
    write_arrow_atomic,
)
from aml_ray.ids import IdScheme

#: One sample's input row, as :class:`aml_ray.stages.IngestStage` takes it: the ordered AddRequest dicts
#: (``adds_json``) and their metadata (``add_meta_json``: chunk_index, n_words, session_index), each a JSON
#: text, and the sample's pending, scorable questions (``questions``: structs of
#: :data:`aml_ray.run.evidence.QUESTION_INPUT_COLUMNS`). The questions are Arrow, not JSON, so the Ingest stage
#: takes them as columns (:func:`sample_questions`) without a dict per question (measured cheaper on the
#: Ingest actor's data path: docs/benchmarks.md).
SAMPLE_INPUT_SCHEMA = pa.schema([("sample_id", pa.string()), ("adds_json", pa.string()),
                                 ("add_meta_json", pa.string()), ("questions", pa.list_(QUESTION_INPUT_TYPE))])

SAMPLE_FILE_PATTERN = "sample-*.arrow"
#: Sample files of an earlier aml-ray (Parquet): removed by a rebuild like the current ones.
_OLD_SAMPLE_FILE_PATTERN = "sample-*.parquet"
EXCLUDED_FILE = "excluded.parquet"


@dataclass
class InputCounts:
    """Counts of samples' inputs; one sample's (:class:`SampleInput`) add up to the run's (:class:`PipelineInputs`).

    Attributes:
        n_chunks / n_messages: Add chunks and messages (a resumed run's finished ones too).
        n_questions / n_scorable / n_excluded: question rows (with Streaming, one per (question, step)),
            for run.json and progress totals, including those a resumed run already has.
        n_pending: scorable question rows this start still has to produce (those in ``done_questions``
            are not in the files).
        by_category: questions per category (each question once, whatever its steps).
    """

    n_chunks: int = 0
    n_messages: int = 0
    n_questions: int = 0
    n_scorable: int = 0
    n_excluded: int = 0
    n_pending: int = 0
    by_category: dict[str, int] = field(default_factory=dict)

    def add(self, other: "InputCounts") -> None:
        """Add ``other``'s counts to these, in place."""
        for name in ("n_chunks", "n_messages", "n_questions", "n_scorable", "n_excluded", "n_pending"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for category, n in other.by_category.items():
            self.by_category[category] = self.by_category.get(category, 0) + n


@dataclass(kw_only=True)
class PipelineInputs(InputCounts):
    """What the Ray job consumes: the inputs folder (module docstring) and counts, nothing per row.

    Attributes:
        folder: the inputs folder holding ``sample-NNNNNN.arrow`` and ``excluded.parquet``.
        n_samples: samples (= sample files, = Ingest tasks).
        max_sample_chunks: the most Add chunks of one sample (the sequential part of ingestion).
        n_excluded_pending: excluded question rows this start still has to write to the evidence.
        the others: :class:`InputCounts`, summed over the samples.
    """

    folder: Path
    n_samples: int = 0
    max_sample_chunks: int = 0
    n_excluded_pending: int = 0

    def sample_path(self, index: int) -> Path:
        """The input file of the ``index``-th sample (0-based, adapter order)."""
        return self.folder / f"sample-{index:06d}.arrow"

    def sample_paths(self) -> list[str]:
        """Every sample file, in sample order (``n_samples`` strings)."""
        return [str(self.sample_path(i)) for i in range(self.n_samples)]

    def sample_row(self, index: int) -> dict[str, str]:
        """The ``index``-th sample's row read back from its file (:data:`SAMPLE_INPUT_SCHEMA`).

        Raises:
            IndexError: ``index`` outside ``[0, n_samples)``.
        """
        if not 0 <= index < self.n_samples:
            raise IndexError(f"sample index {index} outside [0, {self.n_samples})")
        [row] = read_sample_files([str(self.sample_path(index))]).to_pylist()
        return row

    @property
    def excluded_path(self) -> Path:
        """The excluded question rows (exists only when ``n_excluded_pending`` > 0)."""
        return self.folder / EXCLUDED_FILE


def stream_steps(n_sessions: int, checkpoints: list[float]) -> list[int]:
    """Streaming steps of a sample: after ``ceil(f * n_sessions)`` sessions for each fraction ``f``.

    Source: DESIGN.md "Streaming mode" (the same question is searched at several points of ingestion).

    Raises:
        ValueError: a fraction outside (0, 1].
    """
    bad = [f for f in checkpoints if not 0 < f <= 1]
    if bad:
        raise ValueError(f"stream checkpoints must be fractions in (0, 1], got {bad}")
    return sorted({max(1, math.ceil(f * n_sessions)) for f in checkpoints})


@dataclass(kw_only=True)
class SampleInput(InputCounts):
    """One sample's inputs: its IngestStage row, its excluded question rows and its counts.

    Attributes:
        row: ``{sample_id, adds_json, add_meta_json, questions}`` (:data:`SAMPLE_INPUT_SCHEMA`; the
            questions as dicts of :data:`aml_ray.run.evidence.QUESTION_INPUT_COLUMNS`).
        excluded: excluded question rows not yet in the evidence (``status="excluded"``).
        the others: :class:`InputCounts`, for this sample.
    """

    row: dict[str, str]
    excluded: list[dict[str, Any]]


def sample_input(sample: Sample, ids: IdScheme, *, stream_checkpoints: list[float] | None = None,
                 done_questions: set[str] | frozenset[str] = frozenset(),
                 media_dir: Path | None = None) -> SampleInput:
    """Chunk one sample, build its Add requests and its question rows (arguments as :func:`build_inputs`).

    Raises:
        ValueError: a stream checkpoint outside (0, 1]; a question with image parts and no ``media_dir``.
    """
    user_id = ids.user_id(sample.sample_id)
    position = {s.key: i for i, s in enumerate(sample.sessions, start=1)}
    adds, meta = [], []
    out = SampleInput(row={}, excluded=[])
    turns = {s.key: turn_ids(s) for s in sample.sessions}
    offset: dict[str, int] = {}  # session -> its turns already in earlier chunks (a chunk never spans two sessions)
    for chunk in chunk_sample(sample):
        request = AddRequest(request_id=ids.request_id(sample.sample_id, chunk.index),
                             messages=list(chunk.messages), user_id=user_id,
                             session_id=ids.session_id(sample.sample_id, chunk.session_key))
        adds.append(request.model_dump(exclude_none=True))
        start = offset.get(chunk.session_key, 0)
        offset[chunk.session_key] = start + len(chunk.messages)
        meta.append({"chunk_index": chunk.index, "n_words": sum(count_words(m) for m in chunk.messages),
                     "session_index": position[chunk.session_key],
                     "turn_ids": turns[chunk.session_key][start:start + len(chunk.messages)]})
        out.n_messages += len(chunk.messages)
    steps: list[int | None] = [None]
    if stream_checkpoints:
        steps = list(stream_steps(len(sample.sessions), stream_checkpoints))
    questions = []
    for q in sample.questions:
        out.by_category[q.category] = out.by_category.get(q.category, 0) + 1
        for step in steps:
            qid = q.question_id if step is None else f"{q.question_id}@{step}"
            out.n_questions += 1
            if q.excluded_reason is None:
                out.n_scorable += 1
            else:
                out.n_excluded += 1
            if qid in done_questions:
                continue
            row = empty_question_row()
            row.update(dataset=ids.dataset, sample_id=sample.sample_id, question_date=q.question_date,
                       rubric=list(q.rubric), step=step, question_id=qid, user_id=user_id,
                       ref=ids.question_ref(sample.sample_id, qid), question=q.question,
                       options=list(q.options) if q.options else None, gold=json.dumps(q.answer),
                       category=q.category, speakers=list(sample.speakers),
                       excluded=q.excluded_reason is not None, excluded_reason=q.excluded_reason)
            if q.question_parts:
                row["question_parts"] = _question_parts(q.question_parts, media_dir)
            if q.excluded_reason is not None:
                row["status"] = "excluded"
                out.excluded.append(row)
            else:
                questions.append({name: row[name] for name in QUESTION_INPUT_COLUMNS})
    out.n_chunks, out.n_pending = len(adds), len(questions)
    out.row = {"sample_id": sample.sample_id, "adds_json": json.dumps(adds), "add_meta_json": json.dumps(meta),
               "questions": questions}
    return out


def build_inputs(samples: Iterable[Sample], ids: IdScheme, *, out_dir: Path,
                 stream_checkpoints: list[float] | None = None,
                 done_questions: set[str] | frozenset[str] = frozenset(),
                 media_dir: Path | None = None) -> PipelineInputs:
    """Build every sample's inputs, one sample at a time, into ``out_dir`` (layout: module docstring).

    Only one sample's rows are in memory at once (pass a generator of samples to hold only one
    :class:`Sample` too). Input files of an earlier build in ``out_dir`` (``sample-*.arrow``,
    ``excluded.parquet``) are removed first: a resumed run rebuilds them without its done questions.

    Args:
        samples: the adapter's samples, in order.
        ids: the run's id scheme.
        out_dir: the inputs folder (created).
        stream_checkpoints: Streaming mode: fractions of a sample's sessions after which every question
            is searched (e.g. ``[0.5, 1.0]``); each (question, step) is its own row, with question_id
            ``<id>@<step>``. None: the ordinary mode (search after all Adds).
        done_questions: question ids already in the evidence (resume): counted, not written again.
        media_dir: the run's media folder (Multimodal): a question's images are stored there once and its
            row refers to them (``question_parts``); required when a question has parts.

    Returns:
        The counts and the folder (:class:`PipelineInputs`).

    Raises:
        ValueError: as :func:`sample_input`.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in [*out_dir.glob(SAMPLE_FILE_PATTERN), *out_dir.glob(_OLD_SAMPLE_FILE_PATTERN), out_dir / EXCLUDED_FILE]:
        stale.unlink(missing_ok=True)
    inputs = PipelineInputs(folder=out_dir)
    with _ExcludedWriter(inputs.excluded_path) as excluded:
        for index, sample in enumerate(samples):
            one = sample_input(sample, ids, stream_checkpoints=stream_checkpoints, done_questions=done_questions,
                               media_dir=media_dir)
            write_arrow_atomic(pa.Table.from_pylist([one.row], schema=SAMPLE_INPUT_SCHEMA), inputs.sample_path(index))
            excluded.write(one.excluded)
            inputs.add(one)
            inputs.n_samples += 1
            inputs.n_excluded_pending += len(one.excluded)
            inputs.max_sample_chunks = max(inputs.max_sample_chunks, one.n_chunks)
    return inputs


def read_sample_files(paths: Iterable[str]) -> pa.Table:
    """Sample files -> their rows, in the given order (:data:`SAMPLE_INPUT_SCHEMA`; one row per file).

    Each file is an Arrow IPC file (:func:`aml_ray.run.evidence.write_arrow_atomic`), read whole into memory
    and opened from there on the calling thread: no decoding, no thread pool, and no memory map that
    would outlive the file (a finished run removes its inputs). The Ingest actor reads a sample's file
    when the sample starts, on its event loop, where every millisecond is taken from the participant
    client's 2 cores: an IPC file measured several times faster to read than the same rows in Parquet,
    for a larger file (docs/benchmarks.md).

    Raises:
        FileNotFoundError: a file is missing (e.g. a run directory that not every node sees).
        pyarrow.ArrowInvalid: a file is not an Arrow IPC file, or its columns cannot be cast to the schema
            (a file from another version).
    """
    tables = []
    for path in paths:
        table = pa.ipc.open_file(pa.py_buffer(Path(path).read_bytes())).read_all()
        tables.append(table if table.schema.equals(SAMPLE_INPUT_SCHEMA)
                      else table.select(SAMPLE_INPUT_SCHEMA.names).cast(SAMPLE_INPUT_SCHEMA))
    return pa.concat_tables(tables) if tables else SAMPLE_INPUT_SCHEMA.empty_table()


def sample_questions(table: pa.Table) -> pa.Table:
    """The pending questions of a table of sample rows as one table of their columns, in order.

    Args:
        table: rows of :data:`SAMPLE_INPUT_SCHEMA` (e.g. :func:`read_sample_files`).

    Returns:
        One row per question, the columns :data:`aml_ray.run.evidence.QUESTION_INPUT_COLUMNS`.
    """
    questions = table.column("questions").combine_chunks()
    if isinstance(questions, pa.ChunkedArray):  # no rows: no chunk to combine
        return pa.Table.from_pylist([], schema=pa.schema(list(QUESTION_INPUT_TYPE)))
    return pa.Table.from_struct_array(questions.flatten())


def iter_sample_rows(inputs: PipelineInputs) -> Iterator[dict[str, str]]:
    """The sample rows back from their files, one at a time, in sample order (tools, tests, baselines)."""
    for i in range(inputs.n_samples):
        yield inputs.sample_row(i)


def iter_excluded(inputs: PipelineInputs) -> Iterator[pa.Table]:
    """The excluded question rows, one table per sample that has any (:data:`QUESTION_SCHEMA`)."""
    if not inputs.n_excluded_pending:
        return
    f = pq.ParquetFile(inputs.excluded_path)
    for i in range(f.num_row_groups):
        yield f.read_row_group(i).cast(QUESTION_SCHEMA)


class _ExcludedWriter:
    """Appends excluded question rows to one Parquet file, a row group per call; the file appears
    (atomically, by rename) only when the writer closes without error and wrote a row."""

    def __init__(self, path: Path):
        self.path = path
        self._tmp: str | None = None
        self._writer: pq.ParquetWriter | None = None

    def write(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        if self._writer is None:
            fd, self._tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
            os.close(fd)
            self._writer = pq.ParquetWriter(self._tmp, QUESTION_SCHEMA)
        self._writer.write_table(to_table(rows, QUESTION_SCHEMA))

    def __enter__(self) -> _ExcludedWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._writer is None:
            return
        self._writer.close()
        if exc_type is None:
            os.replace(self._tmp, self.path)
        else:
            Path(self._tmp).unlink(missing_ok=True)


def _question_parts(parts, media_dir: Path | None) -> list[dict[str, Any]]:
    """A question's contract parts -> evidence parts, its images stored once in the run's media folder."""
    from aml_ray.media import MediaStore

    if media_dir is None:
        raise ValueError("a question has image parts but the run has no media folder (Multimodal needs one)")
    return MediaStore(media_dir).externalize(list(parts))
