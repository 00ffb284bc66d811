"""CAMBench's shape: a task/condition file, its loader and writer.

Source of the shape: AML's user documentation, "CAMBench Coding: 150 software-engineering tasks run under
relevant and noisy memory conditions, for 300 scored attempts" (``shared/seeds``). AML's data is not
public and no file format is published, so this module defines the one the platform reads:

``<folder>/cambench.jsonl``, one JSON object per line, one task per line::

    {"instance_id": "owner__repo-123", "repo": "owner/repo", "base_commit": "...",
     "problem_statement": "...", "patch": "<gold diff>", "test_patch": "<hidden tests diff>",
     "FAIL_TO_PASS": ["tests/x.py::t"], "PASS_TO_PASS": [...],
     "snapshot": "repos/owner__repo-123",            # relative to <folder>; null when not provided
     "conditions": {"relevant": ["traj-a", ...], "noisy": ["traj-b", ...]}}

- the SWE-bench fields are read as :func:`aml_ray.coding.bench.task_from_swebench_row` reads them;
- ``conditions`` must hold exactly ``relevant`` and ``noisy``, each a non-empty list of trajectory ids
  (each task is scored under both: 150 tasks give 300 scored attempts);
- trajectories are ``<folder>/trajectories/<id>.json`` (the bench folder format of
  :mod:`aml_ray.coding.bench`).

The fixture generator writes this file (``aml-ray coding generate --tasks 150``) and ``aml-ray coding
run --cambench <file>`` reads it.
"""

from __future__ import annotations

import json
from pathlib import Path

from aml_ray.coding.bench import load_trajectories, task_from_swebench_row, trajectory_to_json
from aml_ray.coding.task import CodingBench
from aml_ray.run.evidence import write_json_atomic

CAMBENCH_FILE = "cambench.jsonl"
CAMBENCH_TASKS = 150
CAMBENCH_CONDITIONS = ("relevant", "noisy")
CAMBENCH_ATTEMPTS = CAMBENCH_TASKS * len(CAMBENCH_CONDITIONS)  # 300


def load_cambench(path: Path, *, name: str = "cambench", expect_tasks: int | None = None) -> CodingBench:
    """Read a CAMBench task/condition file (format in the module docstring).

    Args:
        path: the ``.jsonl`` file, or the folder holding ``cambench.jsonl``.
        name: the dataset name in ids.
        expect_tasks: when given, the number of tasks the file must hold (150 for the full suite).

    Returns:
        The bench (snapshots resolved to absolute paths; memory sets from ``conditions``).

    Raises:
        FileNotFoundError: no such file, or a trajectory file a task names is missing.
        ValueError: a malformed line (the message names the line number and the field) or a task count
            other than ``expect_tasks``.
    """
    path = Path(path)
    if path.is_dir():
        path = path / CAMBENCH_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: a CAMBench file is JSON Lines, one task per line "
                                "(see aml_ray.coding.cambench)")
    root = path.parent
    trajectories = load_trajectories(root)
    tasks = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path.name} line {n}"
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{where}: not JSON ({exc})") from None
        cond = row.get("conditions")
        if not isinstance(cond, dict) or set(cond) != set(CAMBENCH_CONDITIONS):
            raise ValueError(f"{where}: field 'conditions' must be an object with exactly the keys "
                             f"{list(CAMBENCH_CONDITIONS)}, got {cond!r:.120}")
        for key in CAMBENCH_CONDITIONS:
            ids = cond[key]
            if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
                raise ValueError(f"{where}: conditions.{key} must be a non-empty list of trajectory ids")
        missing = [i for key in CAMBENCH_CONDITIONS for i in cond[key] if i not in trajectories]
        if missing:
            raise FileNotFoundError(f"{where}: trajectories {missing[:5]} have no file in {root / 'trajectories'}")
        snap = row.get("snapshot")
        try:
            tasks.append(task_from_swebench_row(row, snapshot=str((root / snap).resolve()) if snap else None,
                                                relevant=tuple(cond["relevant"]), noisy=tuple(cond["noisy"]),
                                                source=row.get("source", "cambench")))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    if expect_tasks is not None and len(tasks) != expect_tasks:
        raise ValueError(f"{path}: {len(tasks)} tasks, expected {expect_tasks} (CAMBench: {CAMBENCH_TASKS} tasks x "
                         f"{len(CAMBENCH_CONDITIONS)} conditions = {CAMBENCH_ATTEMPTS} scored attempts)")
    return CodingBench(name=name, tasks=tuple(tasks), trajectories=trajectories, root=root)


def write_cambench(bench: CodingBench, folder: Path) -> Path:
    """Write ``bench`` as ``<folder>/cambench.jsonl`` plus its trajectories (snapshots stay where they are).

    Snapshots are written relative to ``folder`` when inside it, else absolute.

    Returns:
        The file's path.

    Raises:
        ValueError: a task without a relevant or a noisy memory set (CAMBench scores both).
    """
    folder = Path(folder)
    lines = []
    for t in bench.tasks:
        if not t.relevant or not t.noisy:
            raise ValueError(f"task {t.instance_id}: CAMBench needs both a relevant and a noisy memory set")
        snap = None
        if t.snapshot:
            p = Path(t.snapshot).resolve()
            snap = str(p.relative_to(folder.resolve())) if p.is_relative_to(folder.resolve()) else str(p)
        lines.append(json.dumps({
            "instance_id": t.instance_id, "repo": t.repo, "base_commit": t.base_commit,
            "problem_statement": t.problem_statement, "patch": t.gold_patch, "test_patch": t.test_patch,
            "FAIL_TO_PASS": list(t.fail_to_pass), "PASS_TO_PASS": list(t.pass_to_pass), "snapshot": snap,
            "hints_text": t.hints_text, "conditions": {"relevant": list(t.relevant), "noisy": list(t.noisy)},
            "source": t.source}))
    for tid, traj in bench.trajectories.items():
        target = folder / "trajectories" / f"{tid}.json"
        if not target.exists():
            write_json_atomic(trajectory_to_json(traj), target)
    path = folder / CAMBENCH_FILE
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path
