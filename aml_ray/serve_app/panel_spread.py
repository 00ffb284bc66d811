"""The judge panel's spread of a job, for the board and the private results: read from the ``panel.json`` files
that ``aml-ray rejudge RUN_DIR --panel`` wrote under the job's run directories (:mod:`aml_ray.run.panel`).

A job's run directory holds one run directory per bundle (``<job run dir>/<bundle>/``); a panel of a bundle's run
is at ``<bundle>/rejudge/<label>/panel.json``, the latest by its ``finished_at`` counting. Rule for the headline:
each protocol's Overall is the unweighted mean of its accuracies over the job's datasets (the suite's Overall rule,
:mod:`aml_ray.suite`), given only when every dataset of the job has a panel; the spread is the highest protocol
accuracy minus the lowest (a share in [0, 1], shown in points).
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any


@lru_cache(maxsize=256)
def _read(path: str, mtime_ns: int) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _latest_panel(bundle_dir: Path) -> dict[str, Any] | None:
    """The latest ``panel.json`` under ``bundle_dir/rejudge/`` (by ``finished_at``), or None; an unreadable
    file is skipped."""
    panels = []
    for path in bundle_dir.glob("rejudge/*/panel.json"):
        try:
            panel = _read(str(path), path.stat().st_mtime_ns)
        except (OSError, ValueError):
            continue
        if isinstance(panel.get("protocols"), list):
            panels.append(panel)
    return max(panels, key=lambda p: str(p.get("finished_at") or ""), default=None)


def _spread(accuracies: dict[str, float]) -> float | None:
    return max(accuracies.values()) - min(accuracies.values()) if accuracies else None


def job_panel(run_dir: str | os.PathLike[str] | None, datasets: list[str]) -> dict[str, Any] | None:
    """The panel's figures of a job, or None when no panel was run on it.

    Args:
        run_dir: the job's run directory (``Job.run_dir``; None or empty: none yet).
        datasets: the job's dataset names (the keys of its ``per_dataset``); a bundle directory is matched by
            its run.json's dataset name, else by its own name.

    Returns:
        ``{"datasets": {dataset: {"protocols": {name: accuracy}, "spread", "offline"}}, "overall":
        {"protocols", "spread"} or None (some dataset has no panel), "offline": any panel judged by the offline
        stand-ins}``; accuracies and spreads are shares in [0, 1].
    """
    if not run_dir or not Path(run_dir).is_dir():
        return None
    found: dict[str, dict[str, Any]] = {}
    for bundle_dir in sorted(p for p in Path(run_dir).iterdir() if p.is_dir()):
        panel = _latest_panel(bundle_dir)
        if panel is None:
            continue
        name = bundle_dir.name
        try:
            name = json.loads((bundle_dir / "run.json").read_text(encoding="utf-8"))["dataset"]["name"]
        except (OSError, ValueError, KeyError, TypeError):
            pass
        accuracies = {p["name"]: p["accuracy"] for p in panel["protocols"] if p.get("accuracy") is not None}
        found[name] = {"protocols": accuracies, "spread": _spread(accuracies), "offline": bool(panel.get("offline"))}
    if not found:
        return None
    overall = None
    if datasets and all(d in found for d in datasets):
        names = [n for n in found[datasets[0]]["protocols"] if all(n in found[d]["protocols"] for d in datasets)]
        means = {n: sum(found[d]["protocols"][n] for d in datasets) / len(datasets) for n in names}
        overall = {"protocols": means, "spread": _spread(means)}
    return {"datasets": found, "overall": overall, "offline": any(f["offline"] for f in found.values())}
