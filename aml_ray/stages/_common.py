"""Helpers shared by the stages: progress reports and participant-call failure recording."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from aml_ray.actors.participant import ParticipantError
from aml_ray.contract import ContractError
from aml_ray.run.evidence import QUESTION_SCHEMA, RETRIEVED, SEARCH_COLUMNS


def report(tracker, stage: str, n: int) -> None:
    """Fire-and-forget progress count (once per batch, or per slice of one in the model stage; never per row)."""
    if tracker is not None and n:
        tracker.incr.remote(stage, n)


class StageStopped(RuntimeError):
    """Raised inside a stage after a contract error or non-retryable status was recorded on the tracker."""


async def participant_failure(exc: BaseException, tracker, evidence: str | None = None) -> None:
    """If ``exc`` is a ContractError/ParticipantError, record it on the tracker and raise StageStopped.

    Ray Data re-wraps UDF exceptions as text; the tracker keeps the structured cause (the field) for the
    driver. Any other exception is left to the caller to re-raise.

    Args:
        exc: the exception the stage met.
        tracker: the ``ProgressTracker`` actor handle, or None.
        evidence: the file holding the stopped request's evidence row, relative to the run directory
            (:class:`aml_ray.run.evidence.StopLog`); goes to the failure as ``evidence`` (run.json).
    """
    if isinstance(exc, ContractError):
        failure = {"kind": "ContractError", "field": exc.field, "request_id": exc.request_id,
                   "summary": f"ContractError: field '{exc.field}': {exc.reason}"}
    elif isinstance(exc, ParticipantError):
        own = getattr(exc, "cause", None)  # an actor call's error is Ray's RayTaskError(ParticipantError), whose
        # text is Ray's header and traceback; its ``cause`` is the participant client's own error
        failure = {"kind": "ParticipantError", "status": exc.status, "request_id": exc.request_id,
                   "summary": f"ParticipantError: {own if isinstance(own, ParticipantError) else exc}"}
    else:
        return
    if evidence is not None:
        failure["evidence"] = evidence
    if tracker is not None:
        await tracker.record_failure.remote(failure)
    raise StageStopped(failure["summary"]) from None


async def stop_on(exc: BaseException, tracker, record: Callable[[dict[str, Any]], str | None] | None = None) -> None:
    """Stop the stage on a ContractError/ParticipantError, after writing the stopped request's evidence row.

    Args:
        exc: the exception the stage met (any other kind returns, for the caller to re-raise).
        tracker: as :func:`participant_failure`.
        record: writes the row from the outcome the error carries (``exc.outcome``, set by
            :class:`~aml_ray.actors.participant.ParticipantClient`) and returns its file
            (:meth:`aml_ray.run.evidence.StopLog.append`); not called when the error carries none. A row that
            cannot be written never hides the error: the failure's ``evidence`` then says
            ``"not written: <why>"``.

    Raises:
        StageStopped: ``exc`` stops the stage (recorded on the tracker first).
    """
    outcome = exc.outcome if isinstance(exc, (ContractError, ParticipantError)) else None
    evidence = None
    if outcome is not None and record is not None:
        try:
            evidence = record(outcome)
        except (OSError, ValueError) as write_error:  # the participant's error stays the run's cause
            evidence = f"not written: {type(write_error).__name__}: {write_error}"
    await participant_failure(exc, tracker, evidence)


async def call_participant(ref, tracker, record: Callable[[dict[str, Any]], str | None] | None = None):
    """Await a ParticipantClient call; a stage-stopping error is recorded (:func:`stop_on`), then re-raised."""
    try:
        return await ref
    except Exception as exc:
        await stop_on(exc, tracker, record)
        raise



def table_with(rows: list[dict[str, Any]], batch: pa.Table, kept: tuple[str, ...]) -> pa.Table:
    """Question rows -> a ``QUESTION_SCHEMA`` table whose ``kept`` columns are ``batch``'s own Arrow data.

    A stage that does not change a heavy column (the memories: Answer reads them, Judge does not even
    read them) leaves it out of the Python round trip: the memories measured close to a third of what a
    whole-row ``to_pylist`` plus ``from_pylist`` costs (docs/benchmarks.md).

    Args:
        rows: the batch's rows, in order, as dicts (the ``kept`` keys may be present; they are ignored; a
            column no row names is null).
        batch: the stage's input batch (``QUESTION_SCHEMA``), same row count.
        kept: columns taken from ``batch`` unchanged.

    Raises:
        ValueError: a row holds a key the schema does not declare (as :func:`aml_ray.run.evidence.to_table`).
    """
    present = set().union(*rows)
    extra = present - set(QUESTION_SCHEMA.names)
    if extra:
        raise ValueError(f"evidence row has undeclared columns {sorted(extra)}")
    # columns no row holds (a Search-stage row has no answer or judge yet) are null arrays, not a
    # None per row converted one by one
    fields = [f for f in QUESTION_SCHEMA if f.name in present and f.name not in kept]
    rebuilt = pa.Table.from_pylist(rows, schema=pa.schema(fields))
    n = len(rows)
    return pa.Table.from_arrays([batch.column(f.name) if f.name in kept
                                 else rebuilt.column(f.name) if f.name in present else pa.nulls(n, f.type)
                                 for f in QUESTION_SCHEMA], schema=QUESTION_SCHEMA)


def searched_questions(questions: pa.Table, search: pa.Table, *, final: bool = False) -> pa.Table:
    """Questions and their Search columns -> a ``QUESTION_SCHEMA`` table, Arrow column by column.

    Args:
        questions: the questions' input columns (:data:`aml_ray.run.evidence.QUESTION_INPUT_COLUMNS`).
        search: their Search columns (:data:`aml_ray.run.evidence.SEARCH_SCHEMA`), same rows in the same order.
        final: a retrieval-only run ends at Search: ``status`` is ``retrieved`` where the Search succeeded,
            else ``search_error``; otherwise ``status`` stays null for the later stages.

    Returns:
        One row per question; the columns no stage has filled yet (answer, judge) are null.

    Raises:
        ValueError: the two tables differ in length.
    """
    n = questions.num_rows
    if search.num_rows != n:
        raise ValueError(f"{n} questions but {search.num_rows} Search rows")
    columns = {name: questions.column(name) for name in questions.column_names}
    columns.update((name, search.column(name)) for name in SEARCH_COLUMNS)
    if final:  # one compute call, not a Python loop over the rows
        ok = pc.fill_null(pc.equal(search.column("search_status"), "ok"), False)
        columns["status"] = pc.if_else(ok, RETRIEVED, "search_error")
    return pa.Table.from_arrays([columns[f.name] if f.name in columns else pa.nulls(n, f.type)
                                 for f in QUESTION_SCHEMA], schema=QUESTION_SCHEMA)
