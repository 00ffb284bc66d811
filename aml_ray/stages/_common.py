"""Helpers shared by the stages: progress reports and participant-call failure recording."""

from __future__ import annotations

from aml_ray.actors.participant import ParticipantError
from aml_ray.contract import ContractError


def report(tracker, stage: str, n: int) -> None:
    if tracker is not None and n:
        tracker.incr.remote(stage, n)


async def call_participant(ref, tracker):
    """Await a ParticipantClient call; a stage-stopping error is recorded on the tracker, then re-raised."""
    try:
        return await ref
    except ContractError as exc:
        failure = {"kind": "ContractError", "field": exc.field, "request_id": exc.request_id,
                   "summary": f"ContractError: field '{exc.field}': {exc.reason}"}
    except ParticipantError as exc:
        failure = {"kind": "ParticipantError", "status": exc.status, "request_id": exc.request_id,
                   "summary": f"ParticipantError: {exc}"}
    if tracker is not None:
        await tracker.record_failure.remote(failure)
    raise StageStopped(failure["summary"])


class StageStopped(RuntimeError):
    """Raised inside a stage after a contract error or non-retryable status was recorded on the tracker."""
