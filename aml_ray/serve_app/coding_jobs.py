"""The Coding track's jobs in the service: run CAMBench, summarise it for the board, gate it for publication.

Source of the shape: AML's user documentation ("CAMBench Coding: 150 software-engineering tasks run under
relevant and noisy memory conditions, for 300 scored attempts"). A job runs every task of the configured
task file (:meth:`aml_ray.serve_app.settings.ServiceSettings.coding_bench_path`; a smoke runs the first
``smoke_limit_samples`` tasks, a full run ``full_limit_samples`` or all) under :data:`CONDITIONS` with
:func:`aml_ray.coding.runner.run_coding`, into ``<run dir>/cambench``; a run.json that says ``completed``
is read back, an unfinished one is resumed (finished attempts are never run twice).

The tests of every attempt run in :class:`aml_ray.coding.sandbox.SubprocessSandbox` with the settings'
``coding_sandbox`` limits. A host that cannot isolate them makes ``run_coding`` raise
:class:`aml_ray.coding.sandbox.SandboxUnavailable` before anything starts: the job fails with that
message; the service has no unsandboxed mode.

Headline (the board's Overall): the resolved rate with relevant memory; beside it the memory gain
``relevant - noisy`` (:func:`aml_ray.coding.scoring.memory_gain`) and coverage = scored / attempted over
both conditions. The locked agent model is :data:`LOCKED_AGENT_MODEL`, the answer model every shipped
suite locks (``aml_ray/suites/*.json`` ``models.answer``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.serve_app.settings import ServiceSettings
from aml_ray.store.models import Job

#: The conditions every attempt runs under (CAMBench: relevant and noisy; two scored attempts per task).
CONDITIONS = ("relevant", "noisy")
#: The Coding track's suite identity in facts and on the board.
SUITE = "cambench@2026.1-draft.1"
#: The board's dataset key of the Coding track.
DATASET = "cambench"
#: The locked model of the coding agent.
LOCKED_AGENT_MODEL = "gpt-4o-mini"
#: Search Top K of the formal run.
TOP_K = 100


def load_task_file(path: Path):
    """The :class:`aml_ray.coding.task.CodingBench` of a CAMBench file, or of a folder holding
    ``cambench.jsonl`` (preferred) or ``bench.json``.

    Raises:
        FileNotFoundError / ValueError: as :func:`aml_ray.coding.cambench.load_cambench` and
            :func:`aml_ray.coding.bench.load_bench` raise them (the message names the file and field).
    """
    from aml_ray.coding.bench import BENCH_FILE, load_bench
    from aml_ray.coding.cambench import CAMBENCH_FILE, load_cambench

    path = Path(path)
    if path.is_dir() and not (path / CAMBENCH_FILE).is_file() and (path / BENCH_FILE).is_file():
        return load_bench(path)
    return load_cambench(path)


def _task_limit(settings: ServiceSettings, mode: str) -> int | None:
    return settings.smoke_limit_samples if mode == "smoke" else settings.full_limit_samples


def run_coding_job(settings: ServiceSettings, bench_path: Path, out_dir: Path, spec: ParticipantSpec, *, mode: str,
                   run_label: str, label: str,
                   on_progress: Callable[[str, dict[str, int]], None]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run, resume or read back a Coding job's evaluation.

    Args:
        settings: the service settings (answer model, sandbox limits, task limits, CPUs).
        bench_path: the task file or folder.
        out_dir: the run directory (``<job run dir>/cambench``).
        spec: the participant (secret decrypted, addresses pinned).
        mode: ``smoke`` | ``full``.
        run_label / label: recorded in run.json.
        on_progress: ``("totals" | "done", {"attempts": n})``.

    Returns:
        ``(rate rows, run.json)``; the rows are :func:`aml_ray.coding.scoring.resolved_rates`'s.

    Raises:
        SandboxUnavailable: the host cannot isolate the tests (nothing ran).
        CodingRunFailed: a contract error or non-retryable participant status stopped the run.
    """
    from aml_ray.coding.runner import CodingRunConfig, run_coding
    from aml_ray.coding.sandbox import SandboxConfig, SubprocessSandbox

    run_json = out_dir / "run.json"
    if run_json.exists():
        info = json.loads(run_json.read_text(encoding="utf-8"))
        if info.get("status") == "completed":  # finished before an interruption: read back, not rerun
            return json.loads((out_dir / "results.json").read_text(encoding="utf-8"))["rates"], info
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = CodingRunConfig(bench=load_task_file(bench_path), participant=spec, answer=settings.model("answer"),
                          out_dir=out_dir, conditions=CONDITIONS, top_k=TOP_K,
                          sandbox=SubprocessSandbox(settings.coding_sandbox or SandboxConfig()),
                          run_label=run_label, participant_label=label, limit_tasks=_task_limit(settings, mode),
                          resume=run_json.exists())
    result = run_coding(cfg, num_cpus=settings.num_cpus, on_progress=on_progress)
    return result.rates.to_dicts(), result.run_info


def _overall(rates: list[dict[str, Any]], condition: str) -> dict[str, Any] | None:
    return next((r for r in rates if r["repo"] == "overall" and r["condition"] == condition), None)


def coding_summary(rates: list[dict[str, Any]], run_info: dict[str, Any]) -> tuple[float | None, float | None,
                                                                                    dict[str, Any]]:
    """``(overall, coverage, per_dataset)`` of a Coding run for the result row and the board.

    Overall is the resolved rate with relevant memory; coverage is scored / attempted over both
    conditions; ``per_dataset["cambench"]`` holds ``accuracy`` (= Overall, the board's column),
    ``resolved_rate``, ``noisy_resolved_rate``, ``memory_gain`` (relevant - noisy; None when a side
    did not run), ``coverage`` and ``n_total`` (attempts).
    """
    relevant, noisy = _overall(rates, "relevant"), _overall(rates, "noisy")
    rows = [r for r in (relevant, noisy) if r]
    attempted = sum(r["n_attempted"] for r in rows)
    coverage = sum(r["n_scored"] for r in rows) / attempted if attempted else None
    rate = relevant["resolved_rate"] if relevant else None
    gain = (run_info.get("summary") or {}).get("gain_vs_noisy")
    per = {DATASET: {"accuracy": rate, "resolved_rate": rate, "noisy_resolved_rate": noisy["resolved_rate"] if noisy
                     else None, "memory_gain": gain, "coverage": coverage, "n_total": attempted}}
    return rate, coverage, per


@lru_cache(maxsize=8)
def _task_file_facts(path: str, mtime_ns: int, limit: int | None) -> dict[str, Any]:
    from aml_ray.suite import path_sha256

    bench = load_task_file(Path(path))
    root = Path(bench.root) if bench.root else Path(path)
    tasks = bench.tasks[:limit] if limit else bench.tasks
    return {"sha256": path_sha256(root), "tasks": len(tasks)}


def task_file_facts(path: Path, limit: int | None) -> dict[str, Any]:
    """``{"sha256", "tasks"}`` of a task file: the hash of its folder (task file, trajectories, snapshots,
    :func:`aml_ray.suite.path_sha256`) and the tasks a run with ``limit`` takes (cached per file version)."""
    path = Path(path)
    return _task_file_facts(str(path.resolve()), path.stat().st_mtime_ns, limit)


def coding_facts(run_info: dict[str, Any], *, bench_path: Path, limit: int | None,
                 pipeline_code_sha256: str) -> dict[str, Any]:
    """The secret-free facts of a Coding run that the gate and the participant see.

    Args:
        run_info: the run's run.json.
        bench_path: the task file the run read.
        limit: the run's task limit.
        pipeline_code_sha256: :func:`aml_ray.run.provenance.pipeline_code_hash` when the job ran.
    """
    answer = run_info["models"]["answer"]
    return {"run_id": run_info["run_id"], "suite": SUITE, "offline_models": bool(answer.get("offline")),
            "models": {"answer": {"model": answer["model"], "offline": bool(answer.get("offline"))}},
            "prompts": {p["name"]: p["sha256"] for p in run_info["prompts"].values()},
            "top_k": run_info["top_k"], "conditions": run_info["conditions"],
            "pipeline_code_sha256": pipeline_code_sha256,
            "datasets": {DATASET: {**task_file_facts(bench_path, limit), "attempts": run_info["attempts"],
                                   "without_snapshot": run_info["bench"]["without_snapshot"]}},
            "statuses": run_info.get("statuses", {}), "sandbox": run_info["sandbox"].get("isolation"),
            "summary": run_info.get("summary"), "limit_samples": limit, "wall_s": run_info.get("wall_s")}


def coding_baseline(settings: ServiceSettings, bench_path: Path) -> dict[str, Any]:
    """What a publishable Coding run must match: suite, locked agent model, agent prompts, Top K,
    conditions, pipeline hash and the deployment's task file (hash, tasks at ``full_limit_samples``)."""
    from aml_ray.coding.agent import AGENT_PROMPT, AGENT_SYSTEM_PROMPT
    from aml_ray.prompts import load_prompt
    from aml_ray.run.provenance import pipeline_code_hash

    return {"suite": SUITE, "answer_model": LOCKED_AGENT_MODEL, "top_k": TOP_K, "conditions": list(CONDITIONS),
            "prompts": {p.name: p.sha256 for p in (load_prompt(AGENT_PROMPT), load_prompt(AGENT_SYSTEM_PROMPT))},
            "pipeline_code_sha256": pipeline_code_hash(),
            "datasets": {DATASET: task_file_facts(bench_path, settings.full_limit_samples)}}


def coding_gate(session: Session, job: Job, facts: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """The publication gate of a completed full Coding job (the items of
    :func:`aml_ray.serve_app.gate.publication_gate`, read for the Coding track).

    ``all_tasks_succeeded``: every attempt's status is ``scored`` (no Add, Search, model or sandbox error,
    no task without a snapshot); ``task_counts``: the tasks and attempts (tasks x conditions) of the
    deployment's file; ``sandbox_isolated``: the tests ran in namespaces, never unsandboxed.

    Returns:
        ``{"passed": bool, "checks": {name: {"ok": bool, "detail": str}}}``.
    """
    from aml_ray.serve_app.gate import check, unique_check

    ds, base = facts["datasets"][DATASET], baseline["datasets"][DATASET]
    statuses = facts["statuses"]
    not_scored = {k: v for k, v in statuses.items() if k != "scored"}
    model = facts["models"]["answer"]["model"]
    isolation = facts.get("sandbox") or ""
    checks = {
        "full_run_completed": check(job.mode == "full" and job.status == "completed",
                                    f"mode {job.mode}, status {job.status}"),
        "all_tasks_succeeded": check(not not_scored and statuses.get("scored", 0) == ds["attempts"],
                                     f"{statuses.get('scored', 0)} of {ds['attempts']} attempts scored"
                                     + (f"; {not_scored}" if not_scored else "")),
        "locked_models": check(not facts["offline_models"] and model == baseline["answer_model"],
                               f"agent {model!r} vs locked {baseline['answer_model']!r}"),
        "suite": check(facts["suite"] == baseline["suite"], f"{facts['suite']} vs {baseline['suite']}"),
        "evaluation_contract": check(facts["prompts"] == baseline["prompts"] and facts["top_k"] == baseline["top_k"]
                                     and facts["conditions"] == baseline["conditions"],
                                     f"agent prompts, top_k {facts['top_k']}, conditions {facts['conditions']}"),
        "pipeline_code_hash": check(facts["pipeline_code_sha256"] == baseline["pipeline_code_sha256"],
                                    facts["pipeline_code_sha256"][:12]),
        "dataset_bundle_hashes": check(ds["sha256"] == base["sha256"], f"{DATASET}:{ds['sha256'][:12]}"),
        "task_counts": check(ds["tasks"] == base["tasks"] and ds["attempts"] == base["tasks"] * len(CONDITIONS),
                             f"{ds['tasks']} tasks, {ds['attempts']} attempts vs {base['tasks']} tasks"),
        "sandbox_isolated": check(isolation.startswith("namespaces") or isolation.startswith("container"),
                                  f"isolation {isolation or 'unknown'}"),
        "unique": unique_check(session, job),
    }
    return {"passed": all(c["ok"] for c in checks.values()), "checks": checks}
