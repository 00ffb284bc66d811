"""The Coding track's task format: SWE-bench-shaped tasks, past trajectories and memory sets.

Source of the shapes: SWE-bench's task instances (``instance_id, repo, base_commit, problem_statement,
patch, test_patch, FAIL_TO_PASS, PASS_TO_PASS``; https://github.com/SWE-bench/SWE-bench, "Dataset"),
as SWE-ContextBench ships them, and AML's CAMBench description ("150 software-engineering tasks run
under relevant and noisy memory conditions, for 300 scored attempts").

What the agent and the participant may see is decided by construction, not by care at each call site:

- The participant receives only Add messages built from :class:`Trajectory` turns and a Search whose
  query is :attr:`CodingTask.problem_statement` (:mod:`aml_ray.coding.trajectories`).
- The agent receives :meth:`CodingTask.agent_view`: the problem statement and the repository snapshot.
- ``gold_patch``, ``test_patch`` and ``hints_text`` are excluded from :meth:`model_dump`/``repr`` and from
  the agent view; only the sandbox reads ``test_patch`` (it adds the hidden tests, as SWE-bench's harness
  does) and only platform-side selection helpers may read ``gold_patch``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: Memory conditions of one task (CAMBench: relevant and noisy; plus the no-memory baseline of the same
#: locked agent, which sends no Add and no Search).
Condition = Literal["relevant", "noisy", "baseline"]
CONDITIONS: tuple[Condition, ...] = ("relevant", "noisy", "baseline")

_SAFE_ID = re.compile(r"^[A-Za-z0-9._\-]+$")


class CodingTask(BaseModel):
    """One repository task, SWE-bench compatible.

    Attributes:
        instance_id: SWE-bench instance id, e.g. ``"django__django-11905"`` (letters, digits, ``._-``;
            it becomes part of the user_id).
        repo: ``owner/name`` of the repository, e.g. ``"django/django"``.
        snapshot: the repository at ``base_commit`` as a local directory or archive (``.tar``,
            ``.tar.gz``, ``.tgz``, ``.zip``); None when the operator has not provided it (the attempt is
            then recorded as ``no_snapshot`` and leaves the coverage).
        base_commit: the commit the snapshot was taken at (provenance only).
        problem_statement: the issue text: the Search query and the agent's task.
        fail_to_pass: pytest node ids that fail before the fix and must pass after it.
        pass_to_pass: pytest node ids that pass before and must still pass.
        gold_patch: the reference fix (SWE-bench ``patch``); never sent anywhere.
        test_patch: the hidden tests (SWE-bench ``test_patch``), applied only inside the sandbox.
        hints_text: SWE-bench hints; not used by the locked agent.
        relevant: ids of trajectories that hold the fix's clue (the "relevant" memory set).
        noisy: ids of trajectories without it (the "noisy" memory set).
        source: where the row came from, e.g. ``"swecontextbench-lite"`` or ``"fixture"``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    instance_id: str
    repo: str
    snapshot: str | None = None
    base_commit: str | None = None
    problem_statement: str = Field(min_length=1)
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...] = ()
    gold_patch: str | None = Field(default=None, exclude=True, repr=False)
    test_patch: str | None = Field(default=None, exclude=True, repr=False)
    hints_text: str | None = Field(default=None, exclude=True, repr=False)
    relevant: tuple[str, ...] = ()
    noisy: tuple[str, ...] = ()
    source: str = "local"

    @field_validator("instance_id")
    @classmethod
    def _safe_id(cls, v: str) -> str:
        if not _SAFE_ID.match(v):
            raise ValueError(f"instance_id {v!r} may only use letters, digits, '.', '_' and '-'")
        return v

    @field_validator("fail_to_pass")
    @classmethod
    def _has_failing_tests(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("a task needs at least one FAIL_TO_PASS test (SWE-bench's resolved rule "
                             "has nothing to check otherwise)")
        return v

    def memory_set(self, condition: Condition) -> tuple[str, ...]:
        """Trajectory ids Added for ``condition``: relevant -> ``relevant``, noisy -> ``noisy``, baseline -> none.

        Raises:
            ValueError: an unknown condition (allowed: relevant, noisy, baseline).
        """
        if condition == "relevant":
            return self.relevant
        if condition == "noisy":
            return self.noisy
        if condition == "baseline":
            return ()
        raise ValueError(f"unknown condition {condition!r}; allowed: {', '.join(CONDITIONS)}")

    def agent_view(self) -> AgentView:
        """What the locked agent may see: the problem statement and the snapshot (no gold, no tests)."""
        return AgentView(instance_id=self.instance_id, repo=self.repo, problem_statement=self.problem_statement)


@dataclass(frozen=True, slots=True)
class AgentView:
    """The agent's side of a task (built by :meth:`CodingTask.agent_view`)."""

    instance_id: str
    repo: str
    problem_statement: str


TurnRole = Literal["user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn of a past trajectory, already folded to text.

    Attributes:
        role: ``user``, ``assistant`` or ``tool`` (a tool call's result); tool *calls* are assistant
            turns rendered as text.
        content: non-empty text.
        timestamp_ms: UTC Unix milliseconds, or None when the source has none.
    """

    role: TurnRole
    content: str
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Trajectory:
    """A past working session on a repository: the unit that becomes one Add session.

    Attributes:
        trajectory_id: stable id (letters, digits, ``._-``), used as the session key.
        repo: ``owner/name`` of the repository worked on.
        turns: the ordered turns.
        source_instance_id: the SWE-bench instance the session worked on, when known.
        files_touched: repository-relative paths the session edited (platform-side metadata).
        title: a one-line summary, when the source has one.
    """

    trajectory_id: str
    repo: str
    turns: tuple[Turn, ...]
    source_instance_id: str | None = None
    files_touched: tuple[str, ...] = ()
    title: str | None = None

    def __post_init__(self) -> None:
        if not _SAFE_ID.match(self.trajectory_id):
            raise ValueError(f"trajectory_id {self.trajectory_id!r} may only use letters, digits, '.', '_' "
                             "and '-'")


@dataclass(frozen=True)
class CodingBench:
    """A set of tasks and the trajectories their memory sets refer to.

    Attributes:
        name: the dataset name in ids (``eval:<run>:<name>:...``), e.g. ``"cambench-local"``.
        tasks: the tasks, in a stable order.
        trajectories: trajectory id -> trajectory.
        root: the folder the bench was loaded from (relative snapshots resolve against it), if any.

    Raises:
        ValueError: a task's memory set names a trajectory the bench does not hold, or two tasks share
            an instance_id.
    """

    name: str
    tasks: tuple[CodingTask, ...]
    trajectories: dict[str, Trajectory]
    root: Path | None = None

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for task in self.tasks:
            if task.instance_id in seen:
                raise ValueError(f"bench {self.name}: instance_id {task.instance_id} appears twice")
            seen.add(task.instance_id)
            missing = [t for t in (*task.relevant, *task.noisy) if t not in self.trajectories]
            if missing:
                raise ValueError(f"bench {self.name}: task {task.instance_id} names unknown trajectories "
                                 f"{missing}")

    def memory(self, task: CodingTask, condition: Condition) -> list[Trajectory]:
        """The trajectories Added for ``task`` under ``condition``, in memory-set order."""
        return [self.trajectories[t] for t in task.memory_set(condition)]

    def repos(self) -> list[str]:
        """Distinct repositories of the tasks, sorted."""
        return sorted({t.repo for t in self.tasks})
