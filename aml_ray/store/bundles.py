"""A job's bundles as the job keeps them (``Job.bundles``): one entry per bundle of its suite, in suite order.

An entry is a JSON object: ``name``, ``dataset``, ``status`` (``pending``, ``running``, ``ran``, ``failed``
or ``skipped``: :class:`aml_ray.run.suite_run.BundleOutcome`'s words, plus the first two), ``progress``
(the bundle's own share of finished units, 0..1) and, once the bundle ended, the outcome's facts
(``reason``, ``score``, ``coverage``, ``n_total``, ``n_scored``...). The job's overall progress is the mean
of its bundles' progress (:func:`overall_progress`): a bundle's units are counted against its own totals,
so the next bundle's start never lowers it, and a bundle that failed keeps the share it reached (a job with
a failed bundle never reads 100 %).
"""

from __future__ import annotations

from typing import Any

#: The outcome facts an entry keeps (of :meth:`aml_ray.run.suite_run.BundleOutcome.describe`; no paths).
OUTCOME_FIELDS = ("title", "status", "reason", "score", "score_ci_low", "score_ci_high", "coverage", "n_total",
                  "n_scored", "deviations", "wall_s")
#: Statuses of a bundle that has ended.
ENDED = ("ran", "failed", "skipped")


def pending(bundles: list[Any]) -> list[dict[str, Any]]:
    """The entries of a job about to run ``bundles`` (objects with ``name`` and ``dataset``), all pending."""
    return [{"name": b.name, "dataset": b.dataset, "status": "pending", "progress": 0.0} for b in bundles]


def share_done(totals: dict[str, int], done: dict[str, int]) -> float:
    """Finished units over all units of one bundle's stages, 0..1 (0 before its totals are known).

    Examples:
        >>> share_done({"add": 10, "search": 30}, {"add": 10, "search": 10, "search_failed": 2})
        0.5
        >>> share_done({}, {"add": 3})
        0.0
    """
    total = sum(totals.values())
    return sum(min(done.get(k, 0), n) for k, n in totals.items()) / total if total else 0.0


def overall_progress(entries: list[dict[str, Any]]) -> float:
    """The mean of the bundles' progress, 0..1 (a ``ran`` bundle counts 1).

    Examples:
        >>> overall_progress([{"status": "ran", "progress": 1.0}, {"status": "failed", "progress": 0.4},
        ...                   {"status": "running", "progress": 0.5}, {"status": "pending", "progress": 0.0}])
        0.475
    """
    if not entries:
        return 0.0
    return sum(1.0 if e["status"] == "ran" else min(max(e.get("progress") or 0.0, 0.0), 1.0)
               for e in entries) / len(entries)


def running(entries: list[dict[str, Any]] | None) -> tuple[int, dict[str, Any]] | None:
    """``(1-based position, entry)`` of the bundle that runs now, or None."""
    return next(((i, e) for i, e in enumerate(entries or (), 1) if e["status"] == "running"), None)


def failure_summary(entries: list[dict[str, Any]]) -> str:
    """The error summary of a job whose bundles did not all run: one bundle's reason when the job has one
    bundle, else ``bundle <name> <status>: <reason>`` for each, joined by ``; ``."""
    ended = [e for e in entries if e["status"] in ("failed", "skipped")]
    if len(entries) == 1 and ended:
        reason = ended[0].get("reason") or ended[0]["status"]
        return reason.removeprefix("stopped: ")
    return "; ".join(f"bundle {e['name']} {e['status']}: {e.get('reason') or '-'}" for e in ended)
