"""Public leaderboard, no key needed: ``GET /api/leaderboard/{track}`` (JSON) and ``/leaderboard/{track}`` (HTML).

One board per track (:data:`HEADLINES` says what each Overall is). Coding rows also carry ``memory_gain``
(resolved rate with relevant memory minus with noisy memory, :mod:`aml_ray.serve_app.coding_jobs`).

Filters: ``division`` (open_source | commercial) and ``dataset`` (keep rows scored on it, show only its
column, rank by it unless ``sort`` is given). Sorting: ``sort`` in overall | coverage | published_at |
system, ``order`` asc | desc.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from aml_ray.serve_app.deps import SessionDep
from aml_ray.serve_app.panel_spread import job_panel
from aml_ray.serve_app.schemas import Division, LeaderboardOut, LeaderboardRow, Track
from aml_ray.serve_app.settings import board_datasets, dataset_titles
from aml_ray.serve_app.templating import render
from aml_ray.store.models import Job
from aml_ray.store.results import TRACKS, leaderboard

router = APIRouter(tags=["leaderboard"])
Sort = Literal["overall", "coverage", "published_at", "system"]
CODING_DATASET = "cambench"
#: What Overall is on each track's board (shown above the table).
HEADLINES = {
    "textual": "Overall = the unweighted mean of the suite's dataset scores.",
    "multimodal": "Overall = the unweighted mean of the Multimodal suite's dataset scores (Mem-Gallery, ATM-Bench).",
    "coding": "Overall = CAMBench resolved rate with relevant memory (SWE-bench's resolved rule); memory gain = "
              "resolved rate with relevant memory minus with noisy memory.",
}


def competition_ranks(keys: list) -> list[int]:
    """Standard competition ranks of values already in display order: equal neighbours share a rank.

    Examples:
        >>> competition_ranks([0.9, 0.8, 0.8, 0.7])
        [1, 2, 2, 4]
    """
    ranks: list[int] = []
    for i, key in enumerate(keys):
        ranks.append(ranks[-1] if i and key == keys[i - 1] else i + 1)
    return ranks


def board(session, track: str, division: str | None, dataset: str | None, sort: str | None,
          order: str) -> LeaderboardOut:
    """The rows of a track after filters and sorting, ranked by :func:`competition_ranks` of the sort key."""
    rows = leaderboard(session, track, division=division, sort=sort or "overall", descending=order == "desc")
    datasets = sorted({d for r in rows for d in r.per_dataset} | set(board_datasets(track)))
    if dataset:
        rows = [r for r in rows if dataset in r.per_dataset]
        datasets = [dataset]
        if sort is None:
            def score(r):
                acc = r.per_dataset[dataset].get("accuracy")
                return -1.0 if acc is None else acc
            rows.sort(key=score, reverse=order == "desc")
    if dataset and sort is None:
        keys = [r.per_dataset[dataset].get("accuracy") for r in rows]
    else:
        column = {"system": "system_name"}.get(sort or "overall", sort or "overall")
        keys = [getattr(r, column) for r in rows]
    ranks = competition_ranks(keys) if (sort or "overall") in ("overall", "coverage") else list(range(1, len(rows) + 1))
    out = [LeaderboardRow(rank=rank, system=r.system_name, organization=r.organization, version=r.version_label,
                          division=r.division, overall=r.overall, coverage=r.coverage,
                          datasets={d: r.per_dataset[d] for d in datasets if d in r.per_dataset},
                          answer_model=r.answer_model, suite=r.suite,
                          memory_gain=(r.per_dataset.get(CODING_DATASET) or {}).get("memory_gain")
                          if track == "coding" else None,
                          panel=_panel(session, r), published_at=r.published_at) for rank, r in zip(ranks, rows)]
    return LeaderboardOut(track=track, datasets=datasets, rows=out)


def _panel(session, row) -> dict | None:
    """The judge panel's figures of a published row's job (:func:`~aml_ray.serve_app.panel_spread.job_panel`)."""
    job = session.get(Job, row.job_id)
    return job_panel(job.run_dir if job is not None else None, sorted(row.per_dataset))


@router.get("/api/leaderboard/{track}", response_model=LeaderboardOut)
def leaderboard_json(track: Track, session: SessionDep, division: Division | None = None,
                     dataset: Annotated[str | None, Query(max_length=64)] = None, sort: Sort | None = None,
                     order: Literal["asc", "desc"] = "desc") -> LeaderboardOut:
    """The public rows of a track (empty before any publication)."""
    return board(session, track, division, dataset, sort, order)


@router.get("/leaderboard/{track}", response_class=HTMLResponse)
def leaderboard_page(request: Request, track: Track, session: SessionDep,
                     division: Division | Literal[""] | None = None,
                     dataset: Annotated[str | None, Query(max_length=64)] = None, sort: Sort | None = None,
                     order: Literal["asc", "desc"] = "desc") -> HTMLResponse:
    """The public leaderboard page: Overall, per-dataset columns with score bars, filters and sorting, on the
    site's layout with its headers (:data:`~aml_ray.serve_app.templating.PAGE_HEADERS`).

    An empty ``division`` or ``dataset`` (the filter form's "All") means no filter.
    """
    division, dataset = division or None, dataset or None
    data = board(session, track, division, dataset, sort, order)
    all_datasets = sorted(set(board_datasets(track)) | set(data.datasets))
    return render(request, "leaderboard.html", {
        "board": data, "tracks": TRACKS, "track": track, "division": division, "dataset": dataset,
        "headline": HEADLINES.get(track, ""),
        "sort": sort or "overall", "order": order, "all_datasets": all_datasets,
        "titles": {d: t for d, t in dataset_titles(track).items() if d in all_datasets}})


@router.get("/", include_in_schema=False)
def home() -> RedirectResponse:
    """The Textual board is the landing page."""
    return RedirectResponse("/leaderboard/textual")
