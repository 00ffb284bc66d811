"""A run's honest outcome: the failure budget during the run, and the status derived from the evidence.

A run that did not measure what it claims never says ``completed``. The status is computed
from the evidence by :func:`run_outcome`, never assumed:

- ``completed``: every Add succeeded and every scorable question has its evidence row with a final
  status (scored, or recorded with its own error: ``search_error``, ``answer_error``, ``judge_error``),
  the failure budget held, and no memory crossed users.
- ``partial``: the budget held, but some Adds failed or some scorable questions have no final row (the
  numbers cover fewer questions than the dataset; ``--resume`` can finish it).
- ``failed``: the pre-flight failed, a contract error or non-retryable status stopped the run, the
  failure budget was exceeded, a memory of another user_id was returned (``isolation``), or no
  question was scored at all.

The failure budget (:class:`FailureBudget`): a stage (Add or Search) has failed too much when at least
:data:`BUDGET_MIN_FAILURES` of its requests failed after their retries and they are more than
:data:`BUDGET_SHARE` of the stage's requests so far. The Ingest stage checks it after every outcome and
stops the run as soon as it is crossed; :func:`run_outcome` applies the same share to the whole run's
evidence at the end (where the minimum count does not apply: 1 failed Add of 2 is a failed run).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the Ingest actor imports this module: polars only where the evidence is read
    import polars as pl

#: Most share of an Add or Search stage's requests that may fail (after retries) in a run that is not failed.
BUDGET_SHARE = 0.10
#: Failures a stage must have before the running budget can stop the run (a share of 1 in 3 is noise).
BUDGET_MIN_FAILURES = 5
_PLURAL = {"add": "Adds", "search": "Searches"}


class StageFailed(Exception):
    """The run stopped (raised by :func:`aml_ray.run.pipeline.run_pipeline` and
    :func:`aml_ray.run.evaluation.evaluate`): the pre-flight failed, a contract error, a non-retryable
    participant status, the failure budget, a memory of another user_id, or an internal error.

    Attributes:
        summary: one line for the job's error summary (names the field for a contract error).
        failure: the structured cause when it was a participant's fault:
            ``{"kind": "ContractError"|"ParticipantError", "summary", "field"|"status", "request_id"}``.
    """

    def __init__(self, summary: str, failure: dict | None = None):
        super().__init__(summary)
        self.summary = summary
        self.failure = failure


@dataclass
class StageCounts:
    """Requests of one stage: how many ended ok, how many failed, failures by HTTP status, one failed request_id."""

    ok: int = 0
    failed: int = 0
    statuses: Counter = field(default_factory=Counter)
    sample_request_id: str | None = None
    sample_error: str | None = None

    @property
    def attempted(self) -> int:
        return self.ok + self.failed

    def share(self) -> float:
        return self.failed / self.attempted if self.attempted else 0.0

    def status_text(self) -> str:
        """``"transport x3, HTTP 503 x2"``: the failures by last status (transport = no HTTP reply)."""
        return ", ".join(f"{k} x{n}" for k, n in self.statuses.most_common())


def _status_key(http_status: int | None) -> str:
    return "transport" if not http_status else f"HTTP {http_status}"


class FailureBudget:
    """Counts Add and Search outcomes of a run and says when the failure budget is exceeded.

    Args:
        share: most failed share per stage (:data:`BUDGET_SHARE`).
        min_failures: failures a stage must have before :meth:`exceeded` can say yes (:data:`BUDGET_MIN_FAILURES`).
    """

    def __init__(self, share: float = BUDGET_SHARE, min_failures: int = BUDGET_MIN_FAILURES):
        self.share, self.min_failures = share, min_failures
        self.stages: dict[str, StageCounts] = {"add": StageCounts(), "search": StageCounts()}

    def record(self, stage: str, ok: bool, *, http_status: int | None = None, request_id: str | None = None,
               error: str | None = None) -> None:
        """Count one finished request of ``stage`` (``add`` | ``search``), after its retries."""
        counts = self.stages[stage]
        if ok:
            counts.ok += 1
            return
        counts.failed += 1
        counts.statuses[_status_key(http_status)] += 1
        if counts.sample_request_id is None:
            counts.sample_request_id, counts.sample_error = request_id, error

    def exceeded(self) -> str | None:
        """The stage whose budget is exceeded (Add first), or None."""
        for stage, counts in self.stages.items():
            if counts.failed >= self.min_failures and counts.share() > self.share:
                return stage
        return None

    def summary(self, stage: str) -> str:
        """One line for the error summary: stage, counts, share, statuses and a sample request_id."""
        c = self.stages[stage]
        return (f"failure budget exceeded: {c.failed} of {c.attempted} {_PLURAL[stage]} failed after retries "
                f"({c.share():.0%} > {self.share:.0%}; {c.status_text()}); e.g. request_id {c.sample_request_id}"
                + (f": {c.sample_error}" if c.sample_error else ""))

    def failure(self, stage: str) -> dict[str, Any]:
        """The structured failure the driver turns into the run's error (``kind = "FailureBudget"``)."""
        c = self.stages[stage]
        return {"kind": "FailureBudget", "stage": stage, "summary": self.summary(stage), "failed": c.failed,
                "attempted": c.attempted, "statuses": dict(c.statuses), "request_id": c.sample_request_id}


@dataclass
class RunOutcome:
    """A run's status and the counts it was derived from.

    Attributes:
        status: ``completed`` | ``partial`` | ``failed``.
        reasons: one line per reason the run is not ``completed`` (empty when it is).
        counts: ``{"adds": {"expected", "ok", "failed", "missing"}, "questions": {"scorable", "final",
            "missing", "scored", "errors"}, "searches": {"ok", "failed"}}``.
        failure: the structured failure that stopped the run, if one did.
    """

    status: str
    reasons: list[str]
    counts: dict[str, Any]
    failure: dict[str, Any] | None = None

    @property
    def summary(self) -> str | None:
        """The error summary: the reasons joined, or None for a completed run."""
        return "; ".join(self.reasons) or None

    def describe(self) -> dict[str, Any]:
        return {"status": self.status, "reasons": self.reasons, "counts": self.counts}


#: Question statuses that say the question was scored (a verdict or a score) or, for a retrieval-only
#: run, that its Search returned.
SCORED_STATUSES = ("scored", "retrieved")


def run_outcome(adds: pl.DataFrame, questions: pl.DataFrame, *, expected_adds: int, scorable: int,
                stopped: dict[str, Any] | None = None, isolation: list[dict[str, Any]] | None = None,
                share: float = BUDGET_SHARE) -> RunOutcome:
    """Derive the run's status from its evidence (module docstring for the rules).

    Args:
        adds: the Add evidence (``status`` per chunk; a chunk sent again on resume may have several rows:
            its last one counts).
        questions: the question evidence (``question_id``, ``excluded``, ``status``, ``search_status``).
        expected_adds: chunks the dataset has (run.json ``dataset.chunks``).
        scorable: scorable questions of the dataset (run.json ``dataset.scorable_questions``; a Streaming
            run searches each at several steps: pass the number of question rows expected).
        stopped: the failure that stopped the run (contract, status, budget, pre-flight), if any.
        isolation: the leaks found (:func:`aml_ray.run.isolation.find_leaks`), if any.
        share: the failure budget's share (:data:`BUDGET_SHARE`).

    Returns:
        The :class:`RunOutcome`.
    """
    import polars as pl

    if adds.height and "chunk_index" in adds.columns:
        last = adds.group_by(["sample_id", "chunk_index"], maintain_order=True).last()
    else:
        last = adds
    add_ok = int((last["status"] == "ok").sum()) if last.height else 0
    add_failed = last.height - add_ok
    scored_rows = questions.filter(~pl.col("excluded").fill_null(False)) if questions.height else questions
    final = scored_rows.filter(pl.col("status").is_not_null()) if scored_rows.height else scored_rows
    n_final = final.height
    n_scored = int(final["status"].is_in(SCORED_STATUSES).sum()) if n_final else 0
    search_failed = int(scored_rows["search_status"].is_in(["error", "contract_error"]).sum()) if scored_rows.height else 0
    search_ok = int((scored_rows["search_status"] == "ok").sum()) if scored_rows.height else 0
    counts = {"adds": {"expected": expected_adds, "ok": add_ok, "failed": add_failed,
                       "missing": max(0, expected_adds - last.height)},
              "questions": {"scorable": scorable, "final": n_final, "missing": max(0, scorable - n_final),
                            "scored": n_scored, "errors": n_final - n_scored},
              "searches": {"ok": search_ok, "failed": search_failed}}
    failed: list[str] = []
    partial: list[str] = []
    if stopped is not None:
        failed.append(stopped.get("summary") or str(stopped))
    if isolation:
        first = isolation[0]
        failed.append(f"isolation: {len(isolation)} question(s) got memories of another user_id; e.g. question "
                      f"{first['question_id']} of {first['user_id']} got memory {first['memory_id']!r} of "
                      f"{first['owner_user_id']} ({first['evidence']})")
    for stage, bad, total in (("add", add_failed, last.height), ("search", search_failed, search_ok + search_failed)):
        if total and bad / total > share and stopped is None:
            failed.append(f"failure budget exceeded: {bad} of {total} {_PLURAL[stage]} failed after retries "
                          f"({bad / total:.0%} > {share:.0%})")
    if stopped is None and not isolation and scorable and n_scored == 0:
        failed.append(f"no question was scored (0 of {scorable})")
    if add_failed:
        partial.append(f"{add_failed} of {expected_adds} Adds failed after retries")
    if counts["adds"]["missing"]:
        partial.append(f"{counts['adds']['missing']} of {expected_adds} Adds were never sent")
    if counts["questions"]["missing"]:
        partial.append(f"{counts['questions']['missing']} of {scorable} scorable questions have no result")
    if failed:
        return RunOutcome("failed", failed + [r for r in partial if stopped is None], counts, stopped)
    if partial:
        return RunOutcome("partial", partial, counts)
    return RunOutcome("completed", [], counts)
