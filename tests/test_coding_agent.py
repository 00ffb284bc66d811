"""The locked agent's loop, action protocol and budgets, with a scripted in-process model (no HTTP)."""

from __future__ import annotations

import dataclasses

import pytest

from aml_ray.coding.agent import AgentBudget, RepoView, parse_action, run_agent
from aml_ray.coding.task import AgentView, CodingTask
from aml_ray.prompts import load_prompt


class ScriptedModel:
    """Answers ``complete_batch`` from a list of replies (a dict is returned as the outcome itself)."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.prompts: list[str] = []
        self.systems: list[dict] = []
        self.kwargs: list[dict] = []

    async def complete_batch(self, batch, **kw):
        self.systems.append(batch[0][0])
        prompt = batch[0][-1]["content"]
        self.prompts.append(prompt)
        self.kwargs.append(kw)
        reply = self.replies.pop(0) if self.replies else "LIST ."
        if isinstance(reply, dict):
            return [reply]
        return [{"status": "ok", "text": reply, "attempts": 1, "latency_ms": 1.0, "cached": False, "error": None,
                 "prompt_tokens": len(prompt.split()), "completion_tokens": len(reply.split())}]


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "core.py").write_text("def f():\n    return 1\n")
    (root / "README.md").write_text("# demo\n")
    return root


VIEW = AgentView(instance_id="demo__demo-1", repo="demo/demo", problem_statement="f() should return 2")
FIX = "--- a/pkg/core.py\n+++ b/pkg/core.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 2\n"


@pytest.mark.parametrize("reply,expected", [
    ("LIST pkg", ("LIST", "pkg")),
    ("I will look first.\nREAD `pkg/core.py`", ("READ", "pkg/core.py")),
    ("DIFF\n```diff\n" + FIX + "```\nDone.", ("DIFF", FIX)),
    ("DIFF\n" + FIX, ("DIFF", FIX)),
    ("```diff\n" + FIX + "```", ("DIFF", FIX)),
    ("I am not sure what to do.", ("NONE", "")),
])
def test_parse_action(reply, expected):
    assert parse_action(reply) == expected


async def test_agent_reads_then_submits_and_every_step_is_recorded(repo):
    model = ScriptedModel(["READ pkg/core.py", "DIFF\n" + FIX])
    memories = [{"id": "m1", "content": "f must return 2 (fixed before)", "score": 1.0, "created_at": None}]
    result = await run_agent(VIEW, repo, memories, model=model, model_name="gpt-4o-mini")
    assert result.stop_reason == "submitted" and result.diff == FIX
    assert [s["action"] for s in result.steps] == ["READ", "DIFF"]
    assert "def f():" in result.steps[0]["observation"]
    assert result.memories_in_context == 1 and result.prompt_tokens > 0
    first, second = model.prompts
    assert "f must return 2 (fixed before)" in first and "f() should return 2" in first
    assert "pkg/core.py" in first and "README.md" in first  # the file list
    assert '<step n="1">' in second and "return 1" in second
    system = load_prompt("coding_agent_system")
    assert model.systems[0] == {"role": "system", "content": system.text} and len(set(map(str, model.systems))) == 1
    assert len(model.kwargs[0]["prompt_sha256"]) == 64
    assert all(len(s["prompt_sha256"]) == 64 for s in result.steps)


async def test_baseline_prompt_has_no_memories(repo):
    model = ScriptedModel(["DIFF\n" + FIX])
    await run_agent(VIEW, repo, [], model=model, model_name="gpt-4o-mini")
    assert "(no memories)" in model.prompts[0]


async def test_step_budget_ends_without_a_diff(repo):
    model = ScriptedModel(["LIST .", "nothing useful", "READ pkg/core.py"])
    result = await run_agent(VIEW, repo, [], model=model, model_name="gpt-4o-mini",
                             budget=AgentBudget(max_steps=3))
    assert result.diff is None and result.stop_reason == "step_budget" and len(result.steps) == 3
    assert "no action found" in result.steps[1]["observation"]
    assert "This is your last step" in model.prompts[2] and "last step" not in model.prompts[1]


async def test_token_budget_stops_the_loop(repo):
    model = ScriptedModel(["READ pkg/core.py"] * 10)
    result = await run_agent(VIEW, repo, [], model=model, model_name="gpt-4o-mini",
                             budget=AgentBudget(max_steps=10, max_total_tokens=1500, max_completion_tokens=200))
    assert result.stop_reason == "token_budget" and result.diff is None
    assert len(result.steps) < 10
    assert result.prompt_tokens + result.completion_tokens <= 1500


async def test_model_error_stops_the_attempt(repo):
    model = ScriptedModel([{"status": "error", "text": "", "attempts": 3, "latency_ms": None, "cached": False,
                            "error": "gave up after 3 attempts: HTTP 503", "prompt_tokens": 0, "completion_tokens": 0}])
    result = await run_agent(VIEW, repo, [], model=model, model_name="gpt-4o-mini")
    assert result.stop_reason == "model_error" and "503" in result.error and result.diff is None


def test_repo_view_refuses_paths_outside(repo):
    view = RepoView(repo, max_chars=50)
    assert view.read("../../etc/passwd").startswith("error:")
    assert view.read("/etc/passwd").startswith("error:")
    assert view.list("..").startswith("error:")
    assert view.read("missing.py").startswith("error:")
    (repo / "big.txt").write_text("x" * 500)
    assert "more characters not shown" in view.read("big.txt")


def test_agent_view_holds_no_gold_or_tests():
    task = CodingTask(instance_id="a__b-1", repo="a/b", problem_statement="p", fail_to_pass=("t.py::x",),
                      gold_patch="GOLD", test_patch="HIDDEN", hints_text="HINT")
    assert "GOLD" not in repr(task) and "GOLD" not in str(task.model_dump())
    assert "HIDDEN" not in str(task.model_dump()) and "HINT" not in repr(task)
    assert {f.name for f in dataclasses.fields(task.agent_view())} == {"instance_id", "repo", "problem_statement"}
