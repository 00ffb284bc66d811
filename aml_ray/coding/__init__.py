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

from aml_ray.coding.agent import AgentBudget, AgentResult, parse_action, run_agent
from aml_ray.coding.bench import load_bench, task_from_swebench_row
from aml_ray.coding.diffs import DiffApplyError, DiffRefused, apply_diff
from aml_ray.coding.sandbox import (
    ContainerSandbox,
    Sandbox,
    SandboxConfig,
    SandboxJob,
    SubprocessSandbox,
    TestReport,
    sandbox_remote,
)
from aml_ray.coding.scoring import is_resolved, memory_gain, resolved_rates
from aml_ray.coding.task import CONDITIONS, CodingBench, CodingTask, Trajectory, Turn

__all__ = [
    "CONDITIONS",
    "AgentBudget",
    "AgentResult",
    "CodingBench",
    "CodingTask",
    "ContainerSandbox",
    "DiffApplyError",
    "DiffRefused",
    "Sandbox",
    "SandboxConfig",
    "SandboxJob",
    "SubprocessSandbox",
    "TestReport",
    "Trajectory",
    "Turn",
    "apply_diff",
    "is_resolved",
    "load_bench",
    "memory_gain",
    "parse_action",
    "resolved_rates",
    "run_agent",
    "sandbox_remote",
    "task_from_swebench_row",
]
