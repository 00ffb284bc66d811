"""SWE-ContextBench loaders: Lite task rows and Claude-Code past-experience transcripts.

Source: jiayuanz3/SWEContextBench @ 31bb041 (see ``shared/datasets/MANIFEST.md``): ``cases/SWEContextBench
Lite/*.json`` (99 SWE-bench rows from 12 repositories) and ``cases/SWEContextBench Lite Past
Experience/*.jsonl`` (Claude-Code session transcripts, one JSON event per line). Files are read where
they are; nothing is copied into the repository.

Transcript -> :class:`Trajectory` (one session):

- events of ``type`` ``user``/``assistant`` are kept in file order; a ``summary`` whose ``leafUuid`` is
  an event of this file gives the title (Claude Code also writes summaries of other sessions);
  ``file-history-snapshot`` events and side chains (``isSidechain``) are dropped;
- an assistant event's blocks fold to one text: ``text`` as is, ``tool_use`` as
  ``[tool_use <name>] <input JSON>``, ``thinking`` dropped (the model's private reasoning; pass
  ``include_thinking=True`` to keep it); consecutive assistant events of the same ``message.id`` merge
  into one turn (Claude Code writes one event per block);
- a user event whose blocks are ``tool_result`` becomes a ``tool`` turn per result; a plain user event
  a ``user`` turn;
- text longer than ``max_chars`` per block (default 4,000 characters) is cut with a marker saying how
  much was left out (tool outputs can be hundreds of kB; the chunker would put each alone in an Add);
- the first user message names the solved task (``instance_id: ...``, ``repo: ...``);
  ``files_touched`` lists the ``Edit``/``Write``/``MultiEdit`` paths under the session's ``testbed/``
  checkout, made repository-relative.

Memory sets for Lite (a proxy, since upstream ships no task -> experience relevance map; the
third-party proxy in MANIFEST.md uses the same idea): a trajectory is **relevant** to a task when it is
on the same repository and edited a file the task's gold patch changes; **noisy** trajectories are up to
``noisy_per_task`` others (same repository first, then the rest, by id). The gold patch is read on the
platform side only, to choose the sets; it never reaches the participant or the agent.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from aml_ray.coding.bench import task_from_swebench_row
from aml_ray.coding.diffs import diff_paths
from aml_ray.coding.task import CodingBench, CodingTask, Trajectory, Turn

LITE_DATASET = "swecontextbench-lite"
#: Expected Lite counts (MANIFEST.md: "99 tasks from 12 repos").
LITE_TASKS, LITE_REPOS = 99, 12
_ARCHIVES = (".tar.gz", ".tgz", ".tar", ".zip")


def find_snapshot(snapshots_dir: Path | None, instance_id: str) -> str | None:
    """``<dir>/<instance_id>`` as a directory or archive (``.tar.gz``, ``.tgz``, ``.tar``, ``.zip``), if present."""
    if snapshots_dir is None:
        return None
    base = Path(snapshots_dir) / instance_id
    if base.is_dir():
        return str(base)
    for ext in _ARCHIVES:
        candidate = base.with_name(instance_id + ext)
        if candidate.is_file():
            return str(candidate)
    return None


def load_lite(lite_dir: Path, *, snapshots_dir: Path | None = None) -> list[CodingTask]:
    """Read the Lite rows (``<lite_dir>/*.json``), sorted by instance_id.

    Args:
        lite_dir: the folder of row files.
        snapshots_dir: where the operator keeps one snapshot per instance (see :func:`find_snapshot`).

    Raises:
        FileNotFoundError: no ``*.json`` file in ``lite_dir``.
        ValueError: a row's file name differs from its instance_id, or a malformed row.
    """
    files = sorted(Path(lite_dir).glob("*.json"))
    if not files:
        raise FileNotFoundError(f"no SWE-ContextBench rows (*.json) in {lite_dir}")
    tasks = []
    for f in files:
        row = json.loads(f.read_text(encoding="utf-8"))
        if row.get("instance_id") != f.stem:
            raise ValueError(f"{f}: instance_id {row.get('instance_id')!r} differs from the file name")
        tasks.append(task_from_swebench_row(row, snapshot=find_snapshot(snapshots_dir, f.stem), source=LITE_DATASET))
    return tasks


def _ms(stamp: str | None) -> int | None:
    if not stamp:
        return None
    try:
        return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None


def _cut(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n[... {len(text) - max_chars} characters cut]"


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, dict):
                parts.append(f"[{part.get('type', 'part')}]")
        return "\n".join(parts)
    return "" if content is None else str(content)


def _repo_relative(path: str) -> str | None:
    marker = "/testbed/"
    norm = path.replace("\\", "/")
    if marker in norm:
        return norm.split(marker, 1)[1]
    return None


def load_transcript(path: Path, *, include_thinking: bool = False, max_chars: int = 4000) -> Trajectory:
    """Map one Claude-Code transcript (``.jsonl``) to a trajectory (rules in the module docstring).

    Args:
        path: the transcript file; its stem becomes the trajectory id.
        include_thinking: keep ``thinking`` blocks as assistant text.
        max_chars: characters kept per block.

    Raises:
        ValueError: the file holds no user or assistant turn.
    """
    turns: list[Turn] = []
    instance = repo = None
    touched: list[str] = []
    last_assistant_id: str | None = None
    events = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    uuids = {ev.get("uuid") for ev in events if ev.get("uuid")}
    # Claude Code writes summaries by leafUuid, sometimes of another session: keep only this session's
    title = next((ev.get("summary") for ev in events if ev.get("type") == "summary" and ev.get("leafUuid") in uuids),
                 None)
    for ev in events:
        kind = ev.get("type")
        if kind not in ("user", "assistant") or ev.get("isSidechain"):
            continue
        msg = ev.get("message") or {}
        content = msg.get("content")
        stamp = _ms(ev.get("timestamp"))
        if kind == "assistant":
            parts = []
            for block in content if isinstance(content, list) else [{"type": "text", "text": content or ""}]:
                btype = block.get("type")
                if btype == "text":
                    parts.append(_cut(str(block.get("text", "")), max_chars))
                elif btype == "thinking" and include_thinking:
                    parts.append(_cut("(thinking) " + str(block.get("thinking", "")), max_chars))
                elif btype == "tool_use":
                    args = block.get("input") or {}
                    parts.append(_cut(f"[tool_use {block.get('name')}] {json.dumps(args, ensure_ascii=False)}",
                                      max_chars))
                    if block.get("name") in ("Edit", "Write", "MultiEdit") and isinstance(args, dict):
                        rel = _repo_relative(str(args.get("file_path", "")))
                        if rel and rel not in touched:
                            touched.append(rel)
            text = "\n".join(p for p in parts if p.strip())
            if not text:
                continue
            mid = msg.get("id")
            if turns and turns[-1].role == "assistant" and mid is not None and mid == last_assistant_id:
                prev = turns.pop()
                text, stamp = prev.content + "\n" + text, prev.timestamp_ms
            turns.append(Turn(role="assistant", content=text, timestamp_ms=stamp))
            last_assistant_id = mid
            continue
        last_assistant_id = None
        if isinstance(content, str):
            if instance is None:
                m = re.search(r"instance_id:\s*(\S+)", content)
                instance = m.group(1) if m else None
                r = re.search(r"^\s*repo:\s*(\S+)", content, re.M)
                repo = r.group(1) if r else None
            if content.strip():
                turns.append(Turn(role="user", content=_cut(content, max_chars), timestamp_ms=stamp))
            continue
        for block in content or []:
            if block.get("type") == "tool_result":
                text = _result_text(block.get("content"))
                turns.append(Turn(role="tool", content=_cut(text, max_chars) if text.strip() else "(no output)",
                                  timestamp_ms=stamp))
            elif block.get("type") == "text" and str(block.get("text", "")).strip():
                turns.append(Turn(role="user", content=_cut(str(block["text"]), max_chars), timestamp_ms=stamp))
    if not turns:
        raise ValueError(f"{path}: no user or assistant turn")
    if repo is None and instance and "__" in instance:
        owner, rest = instance.split("__", 1)
        repo = f"{owner}/{rest.rsplit('-', 1)[0]}"
    return Trajectory(trajectory_id=Path(path).stem, repo=repo or "unknown", turns=tuple(turns),
                      source_instance_id=instance, files_touched=tuple(touched), title=title)


def load_transcripts(folder: Path, **kw: Any) -> list[Trajectory]:
    """Every ``*.jsonl`` transcript of a folder, sorted by file name (see :func:`load_transcript`)."""
    return [load_transcript(f, **kw) for f in sorted(Path(folder).glob("*.jsonl"))]


def memory_sets(task: CodingTask, trajectories: list[Trajectory], *, noisy_per_task: int = 3
                ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The (relevant, noisy) trajectory ids of a task by gold-patch file overlap (module docstring).

    Args:
        task: the task (its ``gold_patch`` is read here, platform side only).
        trajectories: candidate past sessions.
        noisy_per_task: most noisy trajectories.
    """
    gold = set(diff_paths(task.gold_patch)) if task.gold_patch else set()
    relevant = [t.trajectory_id for t in trajectories
                if t.repo == task.repo and gold.intersection(t.files_touched)
                and t.source_instance_id != task.instance_id]
    rest = [t for t in trajectories if t.trajectory_id not in relevant and t.source_instance_id != task.instance_id]
    rest.sort(key=lambda t: (t.repo != task.repo, t.trajectory_id))
    return tuple(relevant), tuple(t.trajectory_id for t in rest[:noisy_per_task])


def lite_bench(lite_dir: Path, *, experience_dir: Path | None = None, snapshots_dir: Path | None = None,
               noisy_per_task: int = 3, name: str = LITE_DATASET) -> CodingBench:
    """Lite tasks with memory sets from the experience transcripts (see :func:`memory_sets`).

    Args:
        lite_dir: the Lite row files.
        experience_dir: the transcripts (``*.jsonl``); None gives empty memory sets.
        snapshots_dir: the operator's snapshots (one per instance); tasks without one are recorded as
            ``no_snapshot`` by the runner.
        noisy_per_task: most noisy trajectories per task.
        name: the dataset name in ids.
    """
    trajectories = load_transcripts(experience_dir) if experience_dir else []
    tasks = []
    for task in load_lite(lite_dir, snapshots_dir=snapshots_dir):
        relevant, noisy = memory_sets(task, trajectories, noisy_per_task=noisy_per_task)
        tasks.append(task.model_copy(update={"relevant": relevant, "noisy": noisy}))
    return CodingBench(name=name, tasks=tuple(tasks), trajectories={t.trajectory_id: t for t in trajectories},
                       root=Path(lite_dir))
