"""The per-question drill-down of a finished job, for the key that started it (server-rendered pages).

- ``GET /evaluate/jobs/{job_id}/datasets/{bundle}``: the bundle's questions (category, status, verdict,
  score, evidence recall@:data:`LIST_K`), filtered by ``show`` (``all``, ``wrong``: scored below full
  credit, ``errors``: a Search, answer or judge error) and ``category``.
- ``GET /evaluate/jobs/{job_id}/datasets/{bundle}/questions/{question_id}``: one question: the memories
  Search returned (rank, content, score), the answer, the gold, the judge's verdict and reply, and its
  evidence recall (recall@K by the fuzzy and the exact rule, the first rank that covers its evidence;
  :mod:`aml_ray.serve_app.question_recall`), or why it has none.

The pages read the job's own evidence (:func:`aml_ray.run.evidence.read_questions`) under its run
directory, for bundles that ran only (names taken from ``Job.bundles``, never from the path as given).
A browser without a page session gets 403; another key's job is 404, as on every job view. Readers of
the public board see the published aggregates only: no public route serves these rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path as PathParam, Query, Request
from fastapi.responses import HTMLResponse, Response

from aml_ray.serve_app.deps import ServiceDep, SessionDep
from aml_ray.serve_app.question_recall import BundleRecall, recall_ks
from aml_ray.serve_app.routes.evaluate_pages import _session_key, category_label
from aml_ray.serve_app.routes.pages import JOB_ID
from aml_ray.serve_app.templating import render
from aml_ray.store.errors import NotFound
from aml_ray.store.jobs import get_job_for_key
from aml_ray.store.models import Job

router = APIRouter(tags=["pages"], include_in_schema=False)

#: The columns the list reads (memories and judge replies only on a question's own page).
LIST_COLUMNS = ("question_id", "question", "category", "excluded", "status", "verdict", "score", "n_memories")
#: The columns a question's page reads.
QUESTION_COLUMNS = LIST_COLUMNS + ("gold", "answer", "memories", "judge_raw", "search_error", "answer_error",
                                   "judge_error")
#: Statuses that are errors (:mod:`aml_ray.run.outcome`).
ERROR_STATUSES = ("search_error", "answer_error", "judge_error")
#: The K of the recall@K the question list shows (a question's page shows every K of the run).
LIST_K = 10
BUNDLE = PathParam(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")


def _bundle_dir(job: Job, bundle: str) -> Path:
    """The run directory of a bundle of ``job`` that ran.

    Raises:
        NotFound: the job has not ended with results, or has no such bundle that ran.
    """
    names = {e["name"] for e in job.bundles or () if e.get("status") == "ran"}
    if job.status not in ("completed", "partial") or bundle not in names or not job.run_dir:
        raise NotFound(f"job {job.id} has no scored bundle {bundle!r}")
    return Path(job.run_dir) / bundle


def _rows(job: Job, bundle: str, columns: tuple[str, ...]) -> list[dict[str, Any]]:
    from aml_ray.run.evidence import RunDir, read_questions

    rows = read_questions(RunDir(_bundle_dir(job, bundle)), columns=columns).to_dicts()
    for r in rows:
        r["category_label"] = category_label(bundle, r["category"])
    return sorted(rows, key=lambda r: r["question_id"])


def keep(row: dict[str, Any], show: str, category: str | None) -> bool:
    """Whether a question row passes the list's filters.

    Examples:
        >>> row = {"status": "scored", "score": 0.0, "category": "1", "excluded": False}
        >>> keep(row, "wrong", None), keep(row, "errors", None), keep(row, "all", "2")
        (True, False, False)
    """
    if category and str(row["category"]) != category:
        return False
    if show == "wrong":
        return row["status"] == "scored" and not row["excluded"] and (row["score"] or 0.0) < 1.0
    if show == "errors":
        return row["status"] in ERROR_STATUSES
    return True


def _job(request: Request, service, session, job_id: str) -> Job | Response:
    key = _session_key(request, service, session)
    if key is None:
        return render(request, "job_questions.html", {"refused": "Verify your Leaderboard API key on the "
                                                                  "Evaluation page first."}, status_code=403)
    return get_job_for_key(session, job_id, key.id)


@router.get("/evaluate/jobs/{job_id}/datasets/{bundle}", response_class=HTMLResponse)
def questions_page(request: Request, job_id: Annotated[str, JOB_ID], bundle: Annotated[str, BUNDLE],
                   session: SessionDep, service: ServiceDep,
                   show: Literal["all", "wrong", "errors"] = "all",
                   category: Annotated[str | None, Query(max_length=64)] = None) -> Response:
    """A bundle's questions, filtered (owner only)."""
    try:
        job = _job(request, service, session, job_id)
        if isinstance(job, Response):
            return job
        rows = _rows(job, bundle, LIST_COLUMNS)
        recall = BundleRecall.read(_bundle_dir(job, bundle))
    except NotFound as exc:
        return render(request, "job_questions.html", {"refused": exc.reason}, status_code=404)
    for r in rows:
        r["recall"] = recall.of(r["question_id"])[0]
    categories = sorted({str(r["category"]) for r in rows})
    shown = [r for r in rows if keep(r, show, category)]
    return render(request, "job_questions.html", {
        "job": job, "bundle": bundle, "rows": shown, "total": len(rows), "show": show, "category": category or "",
        "categories": [(c, category_label(bundle, c)) for c in categories], "list_k": LIST_K,
        "recall_note": recall.note})


@router.get("/evaluate/jobs/{job_id}/datasets/{bundle}/questions/{question_id}", response_class=HTMLResponse)
def question_page(request: Request, job_id: Annotated[str, JOB_ID], bundle: Annotated[str, BUNDLE],
                  question_id: Annotated[str, PathParam(min_length=1, max_length=300)],
                  session: SessionDep, service: ServiceDep) -> Response:
    """One question: memories (rank, content, score), answer, gold, verdict, the judge's reply and evidence
    recall (owner only)."""
    try:
        job = _job(request, service, session, job_id)
        if isinstance(job, Response):
            return job
        row = next((r for r in _rows(job, bundle, QUESTION_COLUMNS) if r["question_id"] == question_id), None)
        if row is None:
            raise NotFound(f"bundle {bundle} of job {job_id} has no question {question_id!r}")
    except NotFound as exc:
        return render(request, "job_questions.html", {"refused": exc.reason}, status_code=404)
    recall, note = BundleRecall.read(_bundle_dir(job, bundle)).of(question_id)
    return render(request, "job_question.html", {"job": job, "bundle": bundle, "q": row, "recall": recall,
                                                 "recall_note": note, "ks": recall_ks(recall or {})})
