"""The locked coding agent: a bounded loop with the answer model that ends in a unified diff.

The loop (everything an auditor needs is in this file, ``prompts/coding_agent_system.j2`` (the fixed
system prompt: the protocol and rules) and ``prompts/coding_agent.j2`` (the user message of a step)):

1. The memories Search returned are kept in participant order and cut to ``memory_budget_tokens``
   (the Textual rule, :func:`aml_ray.models.context.fit_context`); the baseline condition has none.
2. Each step sends the fixed system prompt and one user message rendered with the memories, the
   problem statement, the repository's file list, the steps left and every earlier step (action +
   observation), at temperature 0 (each step's request is self-contained and cacheable).
3. The reply's first action line decides: ``LIST <dir>`` and ``READ <path>`` are answered from the
   snapshot (read-only, paths checked like a diff's, output cut to ``max_observation_chars``);
   ``DIFF`` ends the loop with the lines after it as the candidate diff (Markdown fences removed). A
   reply without an action gets an observation that says so and costs a step; a reply that is a bare
   unified diff counts as ``DIFF``.
4. The loop stops at ``max_steps`` steps, or when the tokens used (prompt + completion, as the endpoint
   reports them) would pass ``max_total_tokens``; the step that reaches either limit is told it is the
   last. A model failure (after the client's bounded retries) stops the loop as ``model_error``.

Every step becomes one evidence row (:data:`STEP_SCHEMA`): the sha256 of the rendered user message, the
reply, the parsed action, the observation, usage and latency.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from aml_ray.coding.diffs import DiffRefused, check_path
from aml_ray.coding.task import AgentView
from aml_ray.models.context import fit_context, memory_line
from aml_ray.prompts import Prompt, load_prompt
from aml_ray.models.tokens import count_tokens

AGENT_PROMPT = "coding_agent"
AGENT_SYSTEM_PROMPT = "coding_agent_system"
_ACTION = re.compile(r"^[ \t>*`]*(LIST|READ|DIFF)\b[ \t:]*(.*)$", re.MULTILINE)
_FENCE = re.compile(r"^```[\w+-]*[ \t]*$", re.MULTILINE)

#: One row per agent step.
STEP_SCHEMA = pa.schema([
    ("sample_id", pa.string()), ("instance_id", pa.string()), ("condition", pa.string()), ("step", pa.int32()),
    ("prompt_sha256", pa.string()), ("prompt_chars", pa.int32()), ("reply", pa.string()),
    ("action", pa.string()), ("argument", pa.string()), ("observation", pa.string()),
    ("model_status", pa.string()), ("model_error", pa.string()), ("attempts", pa.int32()),
    ("latency_ms", pa.float64()), ("prompt_tokens", pa.int32()), ("completion_tokens", pa.int32()),
    ("cached", pa.bool_()),
])


@dataclass(frozen=True)
class AgentBudget:
    """The agent's fixed limits (recorded in run.json).

    Attributes:
        max_steps: model calls per attempt (default 8).
        max_total_tokens: prompt + completion tokens per attempt (default 200,000).
        max_completion_tokens: ``max_tokens`` of each call (default 2,048).
        memory_budget_tokens: tokens of retrieved memories in the prompt (default 8,000).
        max_observation_chars: characters of one LIST/READ observation (default 12,000).
        max_file_list: paths in the initial file list (default 300).
    """

    max_steps: int = 8
    max_total_tokens: int = 200_000
    max_completion_tokens: int = 2048
    memory_budget_tokens: int = 8000
    max_observation_chars: int = 12_000
    max_file_list: int = 300

    def __post_init__(self) -> None:
        for name in ("max_steps", "max_total_tokens", "max_completion_tokens", "memory_budget_tokens",
                     "max_observation_chars", "max_file_list"):
            if getattr(self, name) < 1:
                raise ValueError(f"AgentBudget.{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class AgentResult:
    """The outcome of one attempt.

    Attributes:
        diff: the candidate diff, or None when the agent did not submit one.
        stop_reason: ``submitted``, ``step_budget``, ``token_budget`` or ``model_error``.
        steps: the evidence rows (without sample/condition columns).
        prompt_tokens / completion_tokens: totals over the steps.
        memories_in_context / memories_cut / context_tokens: the memory cut.
        error: the model error when ``stop_reason == "model_error"``.
    """

    diff: str | None
    stop_reason: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    memories_in_context: int = 0
    memories_cut: int = 0
    context_tokens: int = 0
    error: str | None = None


def parse_action(reply: str) -> tuple[str, str]:
    """The first action of a reply.

    Returns:
        ``(action, argument)``: ``("LIST", dir)``, ``("READ", path)``, ``("DIFF", diff_text)`` or
        ``("NONE", "")``. A reply without an action line that holds ``--- a/`` and ``+++ b/`` lines is
        taken as ``DIFF`` with the whole reply.
    """
    m = _ACTION.search(reply)
    if m is None:
        if re.search(r"^--- (a/|/dev/null)", reply, re.M) and re.search(r"^\+\+\+ b/", reply, re.M):
            return "DIFF", _unfence(reply)
        return "NONE", ""
    kind, rest = m.group(1), m.group(2).strip().strip("`").strip()
    if kind == "DIFF":
        return "DIFF", _unfence(((rest + "\n") if rest else "") + reply[m.end():].lstrip("\n"))
    return kind, rest


def _unfence(text: str) -> str:
    """The diff text: the first fenced block's body when the text opens with a fence, else the text."""
    stripped = text.lstrip("\n")
    opening = _FENCE.match(stripped)
    if opening:
        rest = stripped[opening.end():].lstrip("\n")
        closing = _FENCE.search(rest)
        body = (rest[:closing.start()] if closing else rest).strip("\n")
    else:
        body = _FENCE.sub("", text).strip("\n")
    return body + "\n" if body else ""


class RepoView:
    """Read-only view of a repository snapshot directory for the agent's LIST and READ.

    Args:
        root: the snapshot directory.
        max_chars: characters per observation.
    """

    def __init__(self, root: Path, max_chars: int):
        self.root = Path(root)
        self.max_chars = max_chars

    def files(self, under: str = ".", limit: int | None = None) -> list[str]:
        """Repository-relative file paths under ``under``, sorted, ``.git`` skipped, symlinks not followed."""
        base = self.root if under in (".", "", "/") else check_path(self.root, under.strip("/"))
        out: list[str] = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d != ".git" and d != "__pycache__")
            for name in sorted(filenames):
                out.append(os.path.relpath(os.path.join(dirpath, name), self.root))
                if limit is not None and len(out) >= limit:
                    return out
        return out

    def file_list(self, limit: int) -> str:
        """The initial file list (first ``limit`` paths; the rest is counted)."""
        paths = self.files(limit=limit + 1)
        more = len(paths) > limit
        text = "\n".join(paths[:limit])
        return text + ("\n... more files: use LIST <directory>" if more else "")

    def _cut(self, text: str) -> str:
        if len(text) <= self.max_chars:
            return text
        return text[:self.max_chars] + f"\n... [{len(text) - self.max_chars} more characters not shown]"

    def list(self, under: str) -> str:
        """The observation for ``LIST <under>``."""
        try:
            target = self.root if under in (".", "", "/") else check_path(self.root, under.strip("/"))
        except DiffRefused as exc:
            return f"error: {exc}"
        if not target.is_dir():
            return f"error: {under!r} is not a directory of the repository"
        return self._cut("\n".join(self.files(under)) or "(empty)")

    def read(self, path: str) -> str:
        """The observation for ``READ <path>``."""
        try:
            target = check_path(self.root, path.strip())
        except DiffRefused as exc:
            return f"error: {exc}"
        if not target.is_file():
            return f"error: {path!r} is not a file of the repository"
        text = target.read_text(encoding="utf-8", errors="replace")
        return self._cut(f"{path.strip()} ({text.count(chr(10))} lines):\n{text}")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


async def run_agent(view: AgentView, repo_dir: Path, memories: list[dict[str, Any]], *, model,
                    model_name: str, budget: AgentBudget = AgentBudget(), prompt: Prompt | None = None,
                    system_prompt: Prompt | None = None) -> AgentResult:
    """Run the locked agent on one task (see the module docstring for the loop).

    Args:
        view: the agent's side of the task (problem statement; never the gold or the tests).
        repo_dir: the snapshot directory the agent may LIST and READ.
        memories: Search results in participant order (``{id, content, score, created_at}``); empty for
            the baseline.
        model: an object with ``async complete_batch(batch, **kw)`` (``ModelClient`` or ``ActorModel``).
        model_name: the answer model's name (token counting).
        budget: the limits.
        prompt: the user-message template (default ``coding_agent``).
        system_prompt: the fixed system prompt (default ``coding_agent_system``; rendered without values).

    Returns:
        The :class:`AgentResult`.
    """
    prompt = prompt or load_prompt(AGENT_PROMPT)
    system_prompt = system_prompt or load_prompt(AGENT_SYSTEM_PROMPT)
    system = system_prompt.render()
    pin = hashlib.sha256(f"{system_prompt.sha256}:{prompt.sha256}".encode()).hexdigest()
    ctx = fit_context(memories, budget.memory_budget_tokens, model_name)
    repo = RepoView(repo_dir, budget.max_observation_chars)
    file_list = repo.file_list(budget.max_file_list)
    result = AgentResult(diff=None, stop_reason="step_budget", memories_in_context=len(ctx.memories),
                         memories_cut=ctx.cut, context_tokens=ctx.tokens)
    history: list[dict[str, Any]] = []
    for n in range(1, budget.max_steps + 1):
        used = result.prompt_tokens + result.completion_tokens

        def render(final: bool) -> str:
            return prompt.render(repo=view.repo, problem_statement=view.problem_statement,
                                 memories=[memory_line(m) for m in ctx.memories], file_list=file_list,
                                 history=history, steps_left=budget.max_steps - n + 1, max_steps=budget.max_steps,
                                 final=final)

        def fits(text: str) -> bool:
            need = count_tokens(system, model_name) + count_tokens(text, model_name) + budget.max_completion_tokens
            return used + need <= budget.max_total_tokens

        last_reason = "step_budget" if n == budget.max_steps else None
        text = render(last_reason is not None)
        if not fits(text):  # one more ordinary step would pass the token budget: the last one asks for the diff
            last_reason, text = "token_budget", render(True)
            if not fits(text):
                result.stop_reason = "token_budget"
                break
        messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
        out = (await model.complete_batch([messages], max_tokens=budget.max_completion_tokens,
                                          prompt_sha256=pin))[0]
        row: dict[str, Any] = {"step": n, "prompt_sha256": _sha(text), "prompt_chars": len(text),
                               "reply": out.get("text") or "", "model_status": out["status"],
                               "model_error": out.get("error"), "attempts": out.get("attempts"),
                               "latency_ms": out.get("latency_ms"), "prompt_tokens": out.get("prompt_tokens") or 0,
                               "completion_tokens": out.get("completion_tokens") or 0,
                               "cached": bool(out.get("cached")), "action": None, "argument": None,
                               "observation": None}
        result.steps.append(row)
        result.prompt_tokens += row["prompt_tokens"]
        result.completion_tokens += row["completion_tokens"]
        if out["status"] != "ok":
            result.stop_reason, result.error = "model_error", out.get("error")
            break
        action, arg = parse_action(row["reply"])
        row.update(action=action, argument=arg)
        if action == "DIFF":
            result.diff, result.stop_reason = arg, "submitted"
            break
        if action == "LIST":
            observation = repo.list(arg or ".")
        elif action == "READ":
            observation = repo.read(arg) if arg else "error: READ needs a path"
        else:
            observation = "error: no action found; start a line with LIST <directory>, READ <path> or DIFF"
        row["observation"] = observation
        history.append({"n": n, "action": f"{action} {arg}".strip() if action != "NONE" else "(none)",
                        "observation": observation})
        if last_reason is not None:
            result.stop_reason = last_reason
            break
    return result
