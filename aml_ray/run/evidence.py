"""Evidence: the audit record of every participant and model call, in Parquet under a run directory.

Layout of a run directory::

    <run_dir>/run.json                           what ran (hashes, counts, models, prompts, versions)
    <run_dir>/results.json, results.parquet      the aggregated score table
    <run_dir>/evidence/adds/<sample_id>.parquet  one row per Add chunk (written once the run's traffic is over)
    <run_dir>/evidence/adds/<sample_id>.jsonl    the sample's Add journal while the run is under way
    <run_dir>/evidence/questions/part-*.parquet  one row per question (excluded ones too); a question a resumed
                                                 run searched again has more, the latest counts (read_questions)
    <run_dir>/evidence/resent/adds.jsonl         Adds that gave up and that a resumed run sent again: their
                                                 earlier rows (:mod:`aml_ray.run.reopen`)
    <run_dir>/evidence/stopped/adds.jsonl        the Add that stopped a run (contract error or a status that
    <run_dir>/evidence/stopped/searches.jsonl    is not retried), one ADD_SCHEMA row; the Search's, one
                                                 QUESTION_SCHEMA row (:class:`StopLog`)
    <run_dir>/media/<sha256>.<ext>               Multimodal: each image once, by content hash
    <run_dir>/inputs/                            the pipeline's inputs while the run is under way
                                                 (:mod:`aml_ray.run.inputs`; rebuilt on resume, removed when
                                                 the run completes; not evidence)

Every Parquet and JSON file is written atomically (temporary file + ``os.replace``), so a killed run
never leaves a half-written one. The Add journal is appended one line per finished Add and flushed;
only its last line can be torn by a kill, and a torn last line is read as "not recorded" (that Add is
sent again, with the same request_id and body, which an idempotent participant acknowledges). No secret is ever part of a row: rows carry ids, hashes, statuses and content only.

A request that stops the run (seed, "Error handling": a contract error or a 400/401/403/404/422, Search
409, stops at once) never reaches the Add journal or the question part files: the journal holds finished
Adds only (a resumed run sends the stopped one again) and a stopped sample's questions are never emitted.
Its row goes to ``evidence/stopped/`` instead (:class:`StopLog`, written by the Ingest stage before it
raises; read with :func:`read_stopped_adds` / :func:`read_stopped_searches`): the Add's row as in the
journal, or the question's input and Search columns, with ``status`` / ``search_status``
``contract_error`` (ContractError) or ``error`` (ParticipantError), the HTTP status, attempts, latency and
request hash, ``contract`` = ``"<field>: <reason>"`` and the message in ``error`` / ``search_error``. These
files are never rewritten or removed: a resumed run appends, so each run directory keeps every request
that stopped it. The run's ``run.json`` ``failure.evidence`` names the file.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

if TYPE_CHECKING:  # polars is imported by the readers only: the hot-path actors import this module for its
    import polars as pl  # schemas and writers, and polars costs each of them about 0.15 s of CPU to import

#: One content part in evidence (Multimodal): ``{"type": "text", "text": ...}`` or
#: ``{"type": "image", "media": "media:<sha256>"}`` (the bytes are in ``<run_dir>/media``, never inline).
PART_TYPE = pa.struct([("type", pa.string()), ("text", pa.string()), ("media", pa.string())])

#: A returned memory. ``content`` is its text; for a memory returned as parts it is the parts rendered
#: in order (:func:`aml_ray.media.render_parts`: ``<image media:<sha256>>`` where an image was) and
#: ``parts`` keeps them; ``parts`` is null for a string memory.
MEMORY_TYPE = pa.struct([("id", pa.string()), ("content", pa.string()), ("score", pa.float64()),
                         ("created_at", pa.string()), ("parts", pa.list_(PART_TYPE))])

#: One row per Add chunk.
ADD_SCHEMA = pa.schema([
    ("sample_id", pa.string()), ("chunk_index", pa.int32()), ("request_id", pa.string()),
    ("user_id", pa.string()), ("session_id", pa.string()), ("n_messages", pa.int32()),
    ("n_words", pa.int32()), ("request_sha256", pa.string()), ("status", pa.string()),
    ("http_status", pa.int32()), ("attempts", pa.int32()), ("retried_statuses", pa.list_(pa.int32())),
    ("latency_ms", pa.float64()), ("elapsed_ms", pa.float64()), ("contract", pa.string()),
    ("error", pa.string()),
    # ms the Add waited for an in-flight slot (latency_ms is its time at the participant)
    ("queue_ms", pa.float64()),
    # the source turns the chunk carried (aml_ray.datasets.base.turn_ids: "D<session>:<turn>")
    ("turn_ids", pa.list_(pa.string())),
])

#: Final ``status`` of a question whose Search succeeded in a retrieval-only run (no Answer, no Judge).
RETRIEVED = "retrieved"

#: One row per question, filled stage by stage (ingest -> search -> answer -> judge).
QUESTION_SCHEMA = pa.schema([
    # from the dataset (platform side; the gold never goes to a participant)
    ("dataset", pa.string()), ("sample_id", pa.string()), ("question_id", pa.string()), ("ref", pa.string()),
    ("user_id", pa.string()), ("question", pa.string()), ("options", pa.list_(pa.string())),
    ("gold", pa.string()), ("category", pa.string()), ("speakers", pa.list_(pa.string())),
    ("question_date", pa.string()), ("rubric", pa.list_(pa.string())), ("step", pa.int32()), ("excluded", pa.bool_()), ("excluded_reason", pa.string()),
    # Multimodal: the question as parts (null for a text question), sent to Search and the answer model
    ("question_parts", pa.list_(PART_TYPE)),
    # search
    ("search_status", pa.string()), ("search_http_status", pa.int32()), ("search_attempts", pa.int32()),
    ("search_retried_statuses", pa.list_(pa.int32())), ("search_latency_ms", pa.float64()),
    # ms the Search waited for an in-flight slot; search_latency_ms is its time at the participant
    ("search_queue_ms", pa.float64()),
    ("search_request_sha256", pa.string()), ("contract", pa.string()), ("search_error", pa.string()),
    ("memories", pa.list_(MEMORY_TYPE)), ("n_memories", pa.int32()),
    # answer context (participant order, cut to the token budget)
    ("context_tokens", pa.int32()), ("memories_in_context", pa.int32()), ("memories_cut", pa.int32()),
    # answer
    ("answer", pa.string()), ("answer_status", pa.string()), ("answer_error", pa.string()),
    ("answer_latency_ms", pa.float64()), ("answer_attempts", pa.int32()),
    ("prompt_tokens", pa.int32()), ("completion_tokens", pa.int32()), ("answer_cached", pa.bool_()),
    ("cost_usd", pa.float64()),
    # answer-length cap (aml_ray.stages.answer.cap_answers): the whole answer's tokens, whether it was cut to the
    # suite's cap, and the whole answer when it was (``answer`` is then the cut text the judge reads)
    ("answer_tokens", pa.int32()), ("answer_capped", pa.bool_()), ("answer_full", pa.string()),
    # judge and lexical metrics
    ("verdict", pa.string()), ("judge_raw", pa.string()), ("judge_status", pa.string()),
    ("judge_error", pa.string()), ("judge_attempts", pa.int32()), ("judge_verdicts", pa.list_(pa.string())),
    ("judge_raw_all", pa.list_(pa.string())),  # every judge reply of every ask, in order
    ("score", pa.float64()), ("score_detail", pa.string()), ("f1", pa.float64()),
    ("bleu1", pa.float64()), ("status", pa.string()),
])


#: The columns a question has before its Search (from the dataset: ``dataset`` .. ``question_parts``), in
#: ``QUESTION_SCHEMA`` order; a sample's input file holds its pending questions as structs of these
#: (:data:`aml_ray.run.inputs.SAMPLE_INPUT_SCHEMA`).
QUESTION_INPUT_COLUMNS = tuple(QUESTION_SCHEMA.names[:QUESTION_SCHEMA.names.index("search_status")])
QUESTION_INPUT_TYPE = pa.struct([QUESTION_SCHEMA.field(name) for name in QUESTION_INPUT_COLUMNS])

#: The columns the Search fills (:func:`search_columns`), in ``QUESTION_SCHEMA`` order.
SEARCH_COLUMNS = ("search_status", "search_http_status", "search_attempts", "search_retried_statuses",
                  "search_latency_ms", "search_queue_ms", "search_request_sha256", "contract", "search_error", "memories",
                  "n_memories")
SEARCH_SCHEMA = pa.schema([QUESTION_SCHEMA.field(name) for name in SEARCH_COLUMNS])


def search_columns(outcomes: list[dict[str, Any]]) -> pa.Table:
    """Search outcomes -> their question columns (:data:`SEARCH_SCHEMA`), one row per outcome, in order.

    Built column by column: one Arrow conversion per column instead of one dict per row (the memories,
    ten structs a row and more, are most of a question row's bytes).

    Args:
        outcomes: :meth:`aml_ray.actors.participant.ParticipantClient.search` outcomes (``status``,
            ``http_status``, ``attempts``, ``retried_statuses``, ``latency_ms``, ``request_sha256``,
            ``error``, ``memories`` with string ``content``; a memory returned as parts carries
            ``parts`` too, already stored by :func:`aml_ray.media.memories_to_evidence`).
    """
    return pa.Table.from_pydict({
        "search_status": [o["status"] for o in outcomes],
        "search_http_status": [o["http_status"] for o in outcomes],
        "search_attempts": [o["attempts"] for o in outcomes],
        "search_retried_statuses": [o["retried_statuses"] for o in outcomes],
        "search_latency_ms": [o["latency_ms"] for o in outcomes],
        "search_queue_ms": [o.get("queue_ms") for o in outcomes],
        "search_request_sha256": [o["request_sha256"] for o in outcomes],
        "contract": ["ok" if o["status"] == "ok" else None for o in outcomes],
        "search_error": [o["error"] for o in outcomes],
        "memories": [o["memories"] for o in outcomes],
        "n_memories": [len(o["memories"]) for o in outcomes],
    }, schema=SEARCH_SCHEMA)


#: The per-question figures a run's summary reads (:func:`aml_ray.run.evaluation.evaluate`: the score table of
#: :func:`aml_ray.scoring.aggregate`, run.json's search, token, cost and judge-run figures): the question id,
#: category, statuses, scores, latencies and token counts, without the memories, question, gold, answer or
#: judge text that make a row large (about 100 bytes a row instead of kilobytes).
SUMMARY_COLUMNS = ("question_id", "category", "excluded", "status", "search_status", "search_attempts",
                   "search_retried_statuses", "search_latency_ms", "search_queue_ms", "context_tokens", "memories_cut",
                   "prompt_tokens", "completion_tokens", "answer_cached", "cost_usd", "answer_capped", "verdict",
                   "judge_verdicts", "score", "f1", "bleu1", "n_memories")


def empty_question_row() -> dict[str, Any]:
    """A question row with every column present (None where not yet filled)."""
    return {name: None for name in QUESTION_SCHEMA.names}


def to_table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows (dicts) -> a table of exactly ``schema`` (missing keys are null; extra keys are an error).

    Raises:
        ValueError: a row holds a key the schema does not declare (catches typos early).
    """
    names = set(schema.names)
    for row in rows:
        extra = set(row) - names
        if extra:
            raise ValueError(f"evidence row has undeclared columns {sorted(extra)}")
    return pa.Table.from_pylist(rows, schema=schema)


def _write_atomic(path: Path, write: Callable[[str], None]) -> None:
    """Run ``write(tmp)`` on a temporary file in ``path``'s folder, then ``os.replace`` it onto ``path``.

    A failed or interrupted ``write`` leaves ``path`` as it was and no temporary file behind.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_parquet_atomic(table: pa.Table | Iterable[pa.Table], path: Path, schema: pa.Schema | None = None) -> None:
    """Write ``table`` to ``path`` via a temporary file in the same folder and ``os.replace``.

    ``table`` may also be an iterable of tables (each cast to ``schema``, which is then required), written
    one row group each as they arrive, so the file's rows are never all in memory at once.

    Raises:
        ValueError: an iterable of tables without ``schema`` (nothing is written).
    """
    if isinstance(table, pa.Table):
        _write_atomic(path, lambda tmp: pq.write_table(table, tmp))
        return
    if schema is None:
        raise ValueError("write_parquet_atomic: an iterable of tables needs its schema")

    def write_parts(tmp: str) -> None:
        with pq.ParquetWriter(tmp, schema) as writer:
            for part in table:
                writer.write_table(part.cast(schema))

    _write_atomic(path, write_parts)


def write_arrow_atomic(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` as an Arrow IPC file (uncompressed), atomically as :func:`write_parquet_atomic`.

    For files a process reads back soon and often, where Parquet's decoding is the cost (the pipeline's
    sample inputs, :mod:`aml_ray.run.inputs`); evidence stays Parquet.
    """
    def write(tmp: str) -> None:
        with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)

    _write_atomic(path, write)


def write_json_atomic(obj: Any, path: Path) -> None:
    """Write JSON (UTF-8, indented, sorted keys) atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    os.replace(tmp, path)


class RunDir:
    """Paths of one run directory (see the module docstring for the layout)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.adds = self.root / "evidence" / "adds"
        self.questions = self.root / "evidence" / "questions"
        self.run_json = self.root / "run.json"
        self.results_json = self.root / "results.json"
        self.results_parquet = self.root / "results.parquet"
        self.media = self.root / "media"
        self.inputs = self.root / "inputs"
        self.stopped = self.root / "evidence" / "stopped"
        self.recall = self.root / "evidence" / "recall.parquet"  # per-question evidence recall (scoring.evidence_recall)
        self.injections = self.root / "evidence" / "injections.parquet"  # integrity canaries' flags (run.injection)
        self.resent = self.root / "evidence" / "resent"  # rows a resumed run replaced by sending again (run.reopen)

    def add_file(self, sample_id: str) -> Path:
        return self.adds / f"{sample_id}.parquet"

    def add_journal(self, sample_id: str) -> Path:
        return self.adds / f"{sample_id}.jsonl"


class AddJournal:
    """One sample's Add evidence while its Adds are under way: a JSON line per finished Add.

    Args:
        run_dir: the run directory.
        sample_id: the sample.
    """

    def __init__(self, run_dir: RunDir, sample_id: str):
        self.path = run_dir.add_journal(sample_id)
        self.final = run_dir.add_file(sample_id)

    def rows(self) -> list[dict[str, Any]]:
        """Rows recorded so far (from the final Parquet if the sample finished).

        Raises:
            EvidenceError: a damaged line that is not the last one, or a damaged Parquet file.
        """
        if self.final.exists():
            return _read_dir_files([self.final], ADD_SCHEMA).to_dicts()
        if not self.path.exists():
            return []
        return read_journal(self.path, "Add journal ")

    def append(self, row: dict[str, Any]) -> None:
        """Record one finished Add (one flushed line)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            fh.flush()

    def gave_up(self) -> list[dict[str, Any]]:
        """The sample's recorded Adds that gave up (``status`` ``error``: the retries ran out, e.g. the
        participant had gone away) and have no later ``ok`` row, in journal order; reads only.

        Raises:
            EvidenceError: as :meth:`rows`.
        """
        return self._split(self.rows())[1]

    @staticmethod
    def _split(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """``(kept, taken)``: the latest ``ok`` row of each chunk, by chunk index; every other row, in order."""
        latest = {row["chunk_index"]: row for row in rows}
        kept = sorted((r for r in latest.values() if r["status"] == "ok"), key=lambda r: r["chunk_index"])
        ids = set(map(id, kept))
        return kept, [row for row in rows if id(row) not in ids]

    def reopen_failed(self, record: Callable[[list[dict[str, Any]]], None]) -> list[dict[str, Any]]:
        """Take the Adds of :meth:`gave_up` out of the sample's evidence, so that the sample's next run sends
        them again with the same request_id and body; returns the rows taken out (empty: nothing changed).

        ``record(rows)`` gets the rows taken out before anything changes (a kill never loses them). The rows
        kept, the latest ``ok`` row of each chunk, then become the journal again (written atomically), and the
        sample's Parquet, if it had one, is removed. A kill in between leaves that Parquet, which :meth:`rows`
        reads first, so the next resume takes the same rows out.

        Raises:
            EvidenceError: as :meth:`rows`.
        """
        kept, taken = self._split(self.rows())
        if not taken:
            return []
        record(taken)
        lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in kept)
        _write_atomic(self.path, lambda tmp: Path(tmp).write_text(lines, encoding="utf-8"))
        self.final.unlink(missing_ok=True)
        return taken

    def finish(self) -> None:
        """Write the sample's Parquet evidence (rows by chunk index) atomically and drop the journal."""
        rows = sorted(self.rows(), key=lambda r: r["chunk_index"])
        write_parquet_atomic(to_table(rows, ADD_SCHEMA), self.final)
        self.path.unlink(missing_ok=True)


def finish_add_journals(run_dir: RunDir) -> int:
    """Turn every Add journal left in ``run_dir`` into its sample's Parquet evidence (:meth:`AddJournal.finish`).

    The driver calls it once the pipeline has run to its end (:func:`aml_ray.run.pipeline.run_pipeline`),
    not the Ingest stage after each sample: a Parquet file per sample costs milliseconds of CPU
    (measured: docs/benchmarks.md) on the event loop that feeds the participant client, while the journal alone already makes a resumed run exact. A run that
    stopped early keeps its journals; the run that resumes it writes them.

    Returns:
        The number of samples written.

    Raises:
        EvidenceError: a journal damaged before its last line (nothing of it is written).
    """
    journals = sorted(run_dir.adds.glob("*.jsonl")) if run_dir.adds.exists() else []
    for path in journals:
        AddJournal(run_dir, path.name[: -len(".jsonl")]).finish()
    return len(journals)


def as_question_table(table: pa.Table) -> pa.Table:
    """``table`` with exactly :data:`QUESTION_SCHEMA`'s columns, order and types; itself when it has them.

    A cast to the same schema still costs a compute call per column (about 50, the driver's largest
    share of CPU per block in ``scripts/bench_pipeline.py``), so a block the stages already built to the
    schema is passed through.

    Raises:
        KeyError: a column of the schema is missing.
        pyarrow.ArrowInvalid: a column cannot be cast to its type.
    """
    if table.schema.equals(QUESTION_SCHEMA):
        return table
    return table.select(QUESTION_SCHEMA.names).cast(QUESTION_SCHEMA)


class QuestionWriter:
    """Appends question rows to numbered part files (``part-00000.parquet`` ...), each written atomically.

    Args:
        run_dir: the run directory.
    """

    def __init__(self, run_dir: RunDir):
        self.dir = run_dir.questions
        self.dir.mkdir(parents=True, exist_ok=True)
        # after the highest number present: a part file lost from the middle never gets a later one overwritten
        numbers = [int(p.stem.split("-", 1)[1]) for p in self.dir.glob("part-*.parquet") if p.stem[5:].isdigit()]
        self._next = max(numbers, default=-1) + 1
        self.rows_written = 0

    def write(self, table: pa.Table | Iterable[pa.Table]) -> None:
        """Write one part file; empty tables are skipped.

        ``table`` may be an iterable of tables (e.g. read one by one from a file): they go to the same part
        file as they arrive (one row group each); an iterable that yields no rows writes no file.
        """
        if isinstance(table, pa.Table):
            if table.num_rows == 0:
                return
            write_parquet_atomic(as_question_table(table), self.dir / f"part-{self._next:05d}.parquet")
            n = table.num_rows
        else:
            tables = iter(table)
            first = next((t for t in tables if t.num_rows), None)
            if first is None:
                return
            counted = [first.num_rows]

            def parts() -> Iterator[pa.Table]:
                yield first
                for t in tables:
                    counted.append(t.num_rows)
                    yield t

            write_parquet_atomic(parts(), self.dir / f"part-{self._next:05d}.parquet", QUESTION_SCHEMA)
            n = sum(counted)
        self._next += 1
        self.rows_written += n


class BufferedQuestionWriter:
    """Collects the pipeline's output blocks and writes them as fewer, larger part files.

    The pipeline hands back one block per sample (about 100-200 rows); a Parquet part file per block
    cost the driver about a fifth of its CPU in ``scripts/bench_pipeline.py`` (2 cores, 100 samples of
    100 questions: a ``ParquetWriter`` opened, written and closed 100 times). Rows wait here at most
    until ``min_rows`` have arrived or ``max_wait_s`` has passed since the last write, checked as each
    block arrives; a block that arrives after a quiet spell longer than that is written at once. So
    with a slow participant every block is still on disk as soon as it is done, and a resumed run
    redoes at most ``max_wait_s`` worth of questions. :meth:`flush` writes the rest (call it on every
    exit, error included: finished rows are evidence).

    Args:
        writer: the :class:`QuestionWriter` the parts go to.
        min_rows: rows that trigger a write.
        max_wait_s: seconds after the last write that trigger one.
        clock: seconds, monotonic (``time.monotonic``; tests pass their own).
    """

    def __init__(self, writer: QuestionWriter, *, min_rows: int = 2_000, max_wait_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic):
        self.writer, self.min_rows, self.max_wait_s, self.clock = writer, min_rows, max_wait_s, clock
        self._pending: list[pa.Table] = []
        self._rows = 0
        self._last = clock()

    def append(self, table: pa.Table) -> None:
        """Buffer ``table`` (:data:`QUESTION_SCHEMA`'s columns, in any order); write if a limit is reached.

        Raises:
            KeyError: a column of the schema is missing.
        """
        if table.num_rows:
            self._pending.append(as_question_table(table))
            self._rows += table.num_rows
        if self._rows >= self.min_rows or self.clock() - self._last >= self.max_wait_s:
            self.flush()

    def flush(self) -> None:
        """Write what is buffered as one part file (nothing when empty)."""
        if self._pending:
            self.writer.write(pa.concat_tables(self._pending))
        self._pending, self._rows, self._last = [], 0, self.clock()


class EvidenceError(Exception):
    """An evidence file is missing or damaged (never silently ignored)."""


def read_journal(path: Path, what: str = "") -> list[dict[str, Any]]:
    """The rows of a JSON-lines journal; a torn last line (a kill mid-write) is not a row.

    Args:
        path: the journal file.
        what: how the error names the file (e.g. ``"Add journal "``), before its path.

    Raises:
        EvidenceError: a damaged line that is not the last one (nothing is changed).
    """
    lines = path.read_text(encoding="utf-8").split("\n")
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # torn by a kill mid-write: not recorded
                break
            raise EvidenceError(f"{what}{path} is damaged at line {i + 1}; restore it or start a new run "
                                "directory, nothing was changed") from None
    return rows


def _read_dir(folder: Path, schema: pa.Schema, columns: Sequence[str] | None = None) -> pl.DataFrame:
    return _read_dir_files(sorted(folder.glob("*.parquet")), schema, columns)


def _read_file(path: Path, schema: pa.Schema) -> pa.Table:
    """One evidence file as ``schema``; a column the file predates (evidence of an earlier aml-ray, e.g.
    ``judge_raw_all``) is read as nulls, so older runs stay readable for resume, rejudge and reports."""
    present = set(pq.read_schema(path).names)
    table = pq.read_table(path, columns=[n for n in schema.names if n in present])
    missing = [f for f in schema if f.name not in present]
    if missing:
        columns = {name: table.column(name) for name in table.column_names}
        columns.update((f.name, pa.nulls(table.num_rows, f.type)) for f in missing)
        table = pa.Table.from_arrays([columns[f.name] for f in schema], names=schema.names)
    return table.cast(schema)


def _read_dir_files(files: list[Path], schema: pa.Schema, columns: Sequence[str] | None = None) -> pl.DataFrame:
    import polars as pl

    if columns is not None:
        unknown = [c for c in columns if c not in schema.names]
        if unknown:
            raise ValueError(f"evidence has no columns {unknown}")
        schema = pa.schema([schema.field(c) for c in columns])
    if not files:
        return pl.from_arrow(schema.empty_table())  # type: ignore[return-value]
    tables = []
    for f in files:
        try:
            tables.append(_read_file(f, schema))
        except (pa.ArrowInvalid, OSError) as exc:
            raise EvidenceError(f"evidence file {f} is damaged ({exc}); restore it or start a new run "
                                "directory, nothing was changed") from exc
    return pl.from_arrow(pa.concat_tables(tables))  # type: ignore[return-value]


def read_adds(run_dir: RunDir) -> pl.DataFrame:
    """All Add evidence rows of a run (schema :data:`ADD_SCHEMA`)."""
    return _read_dir(run_dir.adds, ADD_SCHEMA)


def read_questions(run_dir: RunDir, columns: Sequence[str] | None = None) -> pl.DataFrame:
    """The question evidence of a run (schema :data:`QUESTION_SCHEMA`): one row per question, its latest.

    A question a resumed run searched again (:mod:`aml_ray.run.reopen`) has several rows in the part files;
    the last one, by part file number then row, is its evidence of record and the only one returned (the
    earlier rows stay in the files, for the audit).

    Args:
        run_dir: the run directory.
        columns: read only these columns, in this order (e.g. :data:`SUMMARY_COLUMNS`): the others are never
            decoded, so a summary of a large run does not hold its memories, answers and judge texts.
            None: every column.

    Raises:
        ValueError: a column the schema does not declare.
        EvidenceError: a damaged evidence file.
    """
    wanted = list(columns) if columns is not None else None
    read = wanted if wanted is None or "question_id" in wanted else [*wanted, "question_id"]
    frame = _read_dir(run_dir.questions, QUESTION_SCHEMA, read)
    if frame["question_id"].n_unique() < frame.height:
        frame = frame.unique(subset="question_id", keep="last", maintain_order=True)
    return frame if read is wanted else frame.select(wanted)


def iter_question_rows(files: Sequence[str | Path], columns: Sequence[str]) -> Iterator[dict[str, Any]]:
    """Question evidence files (in part order) -> each question's latest row (:func:`read_questions`' rule),
    ``columns`` only, read one row group at a time: a large run's memories are never all in memory.

    Raises:
        KeyError: a column the files do not hold.
    """
    columns = list(columns)
    ids = [pq.read_table(path, columns=["question_id"]).column(0).to_pylist() for path in files]
    latest: dict[str, tuple[int, int]] = {}
    for f, column in enumerate(ids):
        latest.update((qid, (f, i)) for i, qid in enumerate(column))
    superseded = sum(map(len, ids)) > len(latest)
    for f, path in enumerate(files):
        parquet, at = pq.ParquetFile(path), 0
        for group in range(parquet.num_row_groups):
            rows = parquet.read_row_group(group, columns=columns).to_pylist()
            if superseded:
                rows = [row for i, row in enumerate(rows, at) if latest[ids[f][i]] == (f, i)]
            at += parquet.metadata.row_group(group).num_rows
            yield from rows


class StopLog:
    """The participant requests that stopped a run, one JSON line each (module docstring).

    Files: ``evidence/stopped/adds.jsonl`` (rows of :data:`ADD_SCHEMA`) and ``evidence/stopped/searches.jsonl``
    (rows of :data:`QUESTION_SCHEMA`: the question's input and Search columns, the rest null). Appended with
    one flushed line per row, as the Add journal is; a torn last line is read as not recorded, and the next
    append (a resumed run that stops again) cuts it off first.

    Args:
        run_dir: the run directory.
    """

    #: stage -> (file name, row schema)
    FILES = {"add": ("adds.jsonl", ADD_SCHEMA), "search": ("searches.jsonl", QUESTION_SCHEMA)}

    def __init__(self, run_dir: RunDir):
        self.folder = run_dir.stopped

    def path(self, stage: str) -> Path:
        """The file of ``stage`` (``"add"`` or ``"search"``)."""
        return self.folder / self.FILES[stage][0]

    def append(self, stage: str, row: dict[str, Any]) -> str:
        """Record the row of the request that stopped the run.

        Args:
            stage: ``"add"`` or ``"search"``.
            row: the evidence row (keys of the stage's schema only).

        Returns:
            The file written, relative to the run directory (for run.json's ``failure.evidence``).

        Raises:
            ValueError: a key the stage's schema does not declare (nothing is written).
        """
        extra = set(row) - set(self.FILES[stage][1].names)
        if extra:
            raise ValueError(f"evidence row has undeclared columns {sorted(extra)}")
        path = self.path(stage)
        path.parent.mkdir(parents=True, exist_ok=True)
        line = (json.dumps(row, ensure_ascii=False, default=str) + "\n").encode()
        with open(path, "ab") as fh:
            if fh.tell():
                _drop_torn_line(path)  # a resumed run after a kill mid-write: that line was never recorded
            fh.write(line)
            fh.flush()
        return path.relative_to(self.folder.parent.parent).as_posix()

    def rows(self, stage: str) -> pa.Table:
        """The recorded rows of ``stage`` as a table of its schema (empty when none).

        Raises:
            EvidenceError: a damaged line that is not the last one.
        """
        path = self.path(stage)
        schema = self.FILES[stage][1]
        if not path.exists():
            return schema.empty_table()
        return to_table(read_journal(path), schema)


def _drop_torn_line(path: Path) -> None:
    """Cut a last line without its newline (torn by a kill: read as not recorded) off ``path``."""
    with open(path, "r+b") as fh:
        data = fh.read()
        if data and not data.endswith(b"\n"):
            fh.truncate(data.rfind(b"\n") + 1)


def read_stopped_adds(run_dir: RunDir) -> pl.DataFrame:
    """The Adds that stopped the run (schema :data:`ADD_SCHEMA`; :class:`StopLog`)."""
    import polars as pl

    return pl.from_arrow(StopLog(run_dir).rows("add"))  # type: ignore[return-value]


def read_stopped_searches(run_dir: RunDir) -> pl.DataFrame:
    """The Searches that stopped the run, as their questions' rows (:data:`QUESTION_SCHEMA`; :class:`StopLog`)."""
    import polars as pl

    return pl.from_arrow(StopLog(run_dir).rows("search"))  # type: ignore[return-value]
