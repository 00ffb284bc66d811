"""SWE-bench rows -> :class:`CodingTask`, and the local bench folder format (read and write).

A SWE-bench row (https://github.com/SWE-bench/SWE-bench, "Dataset") has ``instance_id, repo,
base_commit, problem_statement, patch, test_patch, FAIL_TO_PASS, PASS_TO_PASS, hints_text`` and more;
``FAIL_TO_PASS``/``PASS_TO_PASS`` are JSON-encoded lists in the Hugging Face release and plain lists in
some copies (SWE-ContextBench ships lists), so both are accepted.

Local bench folder (what :mod:`aml_ray.coding.fixtures` writes and ``aml-ray coding run`` reads)::

    <bench>/bench.json          {"name": "cambench-local", "tasks": [<SWE-bench row + snapshot,
                                 relevant_trajectories, noisy_trajectories>, ...]}
    <bench>/trajectories/<id>.json   {trajectory_id, repo, source_instance_id, files_touched, title,
                                      turns: [{role, content, timestamp_ms}]}
    <bench>/repos/<name>/       snapshots (a row's ``snapshot`` is relative to <bench>)
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

from aml_ray.coding.task import CodingBench, CodingTask, Trajectory, Turn
from aml_ray.run.evidence import write_json_atomic

BENCH_FILE = "bench.json"


def parse_test_list(value: Any, field: str = "tests") -> tuple[str, ...]:
    """A SWE-bench test list: a list, a JSON string or a Python-literal string of strings.

    Raises:
        ValueError: naming the field, when the value is none of these.
    """
    if isinstance(value, str):
        text = value.strip()
        try:
            value = json.loads(text) if text else []
        except ValueError:
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                raise ValueError(f"{field}: {text[:80]!r} is not a JSON or Python list of test ids") from None
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{field}: expected a list of test id strings, got {type(value).__name__}")
    return tuple(value)


def task_from_swebench_row(row: dict[str, Any], *, snapshot: str | None = None, relevant: tuple[str, ...] = (),
                           noisy: tuple[str, ...] = (), source: str = "swe-bench") -> CodingTask:
    """Build a task from a SWE-bench-format row.

    Args:
        row: the row (SWE-bench field names).
        snapshot: the repository snapshot path, or None.
        relevant / noisy: trajectory ids of the memory sets.
        source: provenance label.

    Raises:
        ValueError: a required field is missing or malformed (the message names it).
    """
    for name in ("instance_id", "repo", "problem_statement", "FAIL_TO_PASS"):
        if name not in row:
            raise ValueError(f"row {row.get('instance_id', '?')}: field {name!r} is missing")
    return CodingTask(
        instance_id=row["instance_id"], repo=row["repo"], snapshot=snapshot, base_commit=row.get("base_commit"),
        problem_statement=row["problem_statement"],
        fail_to_pass=parse_test_list(row["FAIL_TO_PASS"], "FAIL_TO_PASS"),
        pass_to_pass=parse_test_list(row.get("PASS_TO_PASS", []), "PASS_TO_PASS"),
        gold_patch=row.get("patch"), test_patch=row.get("test_patch") or None, hints_text=row.get("hints_text"),
        relevant=tuple(relevant), noisy=tuple(noisy), source=source)


def trajectory_to_json(t: Trajectory) -> dict[str, Any]:
    """A trajectory as the JSON object of ``trajectories/<id>.json``."""
    return {"trajectory_id": t.trajectory_id, "repo": t.repo, "source_instance_id": t.source_instance_id,
            "files_touched": list(t.files_touched), "title": t.title,
            "turns": [{"role": u.role, "content": u.content, "timestamp_ms": u.timestamp_ms} for u in t.turns]}


def trajectory_from_json(obj: dict[str, Any]) -> Trajectory:
    """The inverse of :func:`trajectory_to_json`."""
    return Trajectory(trajectory_id=obj["trajectory_id"], repo=obj["repo"],
                      source_instance_id=obj.get("source_instance_id"),
                      files_touched=tuple(obj.get("files_touched") or ()), title=obj.get("title"),
                      turns=tuple(Turn(role=u["role"], content=u["content"], timestamp_ms=u.get("timestamp_ms"))
                                  for u in obj["turns"]))


def write_bench(root: Path, name: str, rows: list[dict[str, Any]], trajectories: list[Trajectory]) -> Path:
    """Write a local bench folder (rows carry ``snapshot`` relative to ``root``).

    Returns:
        The path of ``bench.json``.
    """
    for t in trajectories:
        write_json_atomic(trajectory_to_json(t), root / "trajectories" / f"{t.trajectory_id}.json")
    path = root / BENCH_FILE
    write_json_atomic({"name": name, "tasks": rows}, path)
    return path


def load_trajectories(root: Path) -> dict[str, Trajectory]:
    """Every ``<root>/trajectories/*.json``, by trajectory id (file-name order)."""
    trajectories: dict[str, Trajectory] = {}
    for f in sorted((Path(root) / "trajectories").glob("*.json")):
        t = trajectory_from_json(json.loads(f.read_text(encoding="utf-8")))
        trajectories[t.trajectory_id] = t
    return trajectories


def load_bench(root: Path) -> CodingBench:
    """Read a local bench folder.

    Args:
        root: the folder holding ``bench.json`` (or the ``bench.json`` file itself).

    Returns:
        The bench; snapshots are resolved to absolute paths.

    Raises:
        FileNotFoundError: no ``bench.json``, or a trajectory file a task names is missing.
        ValueError: a malformed row.
    """
    root = Path(root)
    if root.is_file():
        root = root.parent
    path = root / BENCH_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: a bench folder holds bench.json, trajectories/ and repos/ "
                                "(see aml_ray.coding.bench)")
    doc = json.loads(path.read_text(encoding="utf-8"))
    trajectories = load_trajectories(root)
    tasks = []
    for row in doc["tasks"]:
        snap = row.get("snapshot")
        snapshot = str((root / snap).resolve()) if snap else None
        tasks.append(task_from_swebench_row(
            row, snapshot=snapshot, relevant=tuple(row.get("relevant_trajectories", ())),
            noisy=tuple(row.get("noisy_trajectories", ())), source=row.get("source", "local")))
    return CodingBench(name=doc.get("name", "cambench-local"), tasks=tuple(tasks), trajectories=trajectories,
                       root=root)
