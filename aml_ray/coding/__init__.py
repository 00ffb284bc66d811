"""The Coding track: memory-assisted repository tasks, executed and scored by their tests.

Past work on repositories (trajectories) is Added to the participant, each task Searches it with its
problem statement, a locked agent turns what came back into a diff, and the diff is tested in a
sandbox: resolved when the failing tests now pass and the passing tests still pass (SWE-bench). Every
task runs under relevant memory, noisy memory and no memory (AML's CAMBench: relevant vs noisy).

Modules, one concept each: :mod:`~aml_ray.coding.task` (format), :mod:`~aml_ray.coding.bench` (SWE-bench
rows, bench folders), :mod:`~aml_ray.coding.swecontextbench` (loaders), :mod:`~aml_ray.coding.trajectories`
(Add/Search requests), :mod:`~aml_ray.coding.agent` (the locked agent), :mod:`~aml_ray.coding.diffs` and
:mod:`~aml_ray.coding.sandbox` (execution), :mod:`~aml_ray.coding.scoring`, :mod:`~aml_ray.coding.fixtures`
(offline generator) and :mod:`~aml_ray.coding.runner` (the evaluation). See ``README.md`` beside them.
"""

from __future__ import annotations

import importlib
from typing import Any

# Public names and their modules; imported on first use so that ``aml-ray --help`` stays fast (the agent
# module loads the tokenizer).
_EXPORTS = {"AgentBudget": "agent", "AgentResult": "agent", "parse_action": "agent", "run_agent": "agent",
            "load_bench": "bench", "task_from_swebench_row": "bench", "load_cambench": "cambench",
            "write_cambench": "cambench", "is_harness_path": "harness",
            "DiffApplyError": "diffs", "DiffRefused": "diffs", "apply_diff": "diffs",
            "ContainerSandbox": "sandbox", "Sandbox": "sandbox", "SandboxConfig": "sandbox", "SandboxJob": "sandbox",
            "SubprocessSandbox": "sandbox", "TestReport": "sandbox", "SandboxUnavailable": "sandbox", "sandbox_remote": "sandbox",
            "is_resolved": "scoring", "memory_gain": "scoring", "resolved_rates": "scoring",
            "CONDITIONS": "task", "CodingBench": "task", "CodingTask": "task", "Trajectory": "task", "Turn": "task"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
