"""One evaluation, end to end: resolve and verify the dataset, run the Ray pipeline, score, record.

:func:`evaluate` is what ``aml-ray run`` calls; it writes ``run.json`` (what ran), the evidence, and
``results.json`` / ``results.parquet`` (the score table), and returns an :class:`EvaluationResult`.
"""

from __future__ import annotations

import hashlib
import platform
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

import aml_ray
from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import ModelEndpoint, cache_dir
from aml_ray.datasets.registry import get_dataset
from aml_ray.evidence import RunDir, read_adds, write_json_atomic, write_parquet_atomic
from aml_ray.ids import IdScheme, new_run_id
from aml_ray.pipeline import PipelineOptions, StageFailed, build_inputs, run_pipeline
from aml_ray.prompts import load_prompt
from aml_ray.ray_runtime import init_ray
from aml_ray.scoring import aggregate, latency_summary
from aml_ray.stages.answer import DEFAULT_CONTEXT_BUDGET
from aml_ray.suite import path_sha256, verify_loaded_bundle


@dataclass
class EvaluationConfig:
    """Everything one evaluation needs.

    Attributes:
        dataset: dataset name (``"locomo"``).
        participant: the participant version's spec.
        answer / judge: model endpoints (offline when they have no base_url).
        out_dir: the run directory (created; must not already hold a run).
        data_path: local dataset file; None downloads into the cache and verifies its sha256.
        allow_hash_mismatch: accept a dataset file whose sha256 differs from the pin (recorded).
        top_k: Top K for Search (formal: 100).
        limit_samples: evaluate only the first N samples (smoke-sized runs); None for all.
        run_id: the run's id (default: a fresh random one).
        run_label: a human label recorded in run.json.
        participant_label: how the participant is named in outputs (never holds a secret).
        options: pipeline throughput knobs.
        answer_prompt / judge_prompt: override the dataset's prompts (shipped name, path or URL).
        answer_prompt_sha256 / judge_prompt_sha256: pins for the overrides (required for URLs).
        context_budget_tokens: token budget of the answer context.
        judge_runs: how many times each answer is judged (mean and std reported when > 1).
    """

    dataset: str
    participant: ParticipantSpec
    answer: ModelEndpoint
    judge: ModelEndpoint
    out_dir: Path
    data_path: Path | None = None
    allow_hash_mismatch: bool = False
    top_k: int = 100
    limit_samples: int | None = None
    run_id: str = field(default_factory=new_run_id)
    run_label: str | None = None
    participant_label: str = "participant"
    options: PipelineOptions = field(default_factory=PipelineOptions)
    answer_prompt: str | None = None
    judge_prompt: str | None = None
    answer_prompt_sha256: str | None = None
    judge_prompt_sha256: str | None = None
    context_budget_tokens: int = DEFAULT_CONTEXT_BUDGET
    judge_runs: int = 1


@dataclass
class EvaluationResult:
    """What an evaluation produced.

    Attributes:
        run_dir: the run directory.
        table: the aggregated score table (see :func:`aml_ray.scoring.aggregate`).
        run_info: the content of run.json.
        questions: per-question evidence rows.
    """

    run_dir: RunDir
    table: pl.DataFrame
    run_info: dict[str, Any]
    questions: pl.DataFrame


def _git_commit() -> str | None:
    root = Path(aml_ray.__file__).resolve().parents[1]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=True)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def pipeline_code_hash() -> str:
    """sha256 over the package's Python sources (path + bytes, sorted): the "pipeline code hash"."""
    root = Path(aml_ray.__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def retries_by_status(statuses: pl.Series) -> dict[str, int]:
    """Count retried attempts by the status that caused them (``transport`` for timeouts/connection errors).

    Args:
        statuses: a list column of retried statuses per request (0 = transport error).
    """
    flat = statuses.explode().drop_nulls()
    counts = flat.value_counts(sort=True)
    return {("transport" if int(v) == 0 else str(int(v))): int(n) for v, n in counts.iter_rows()}


def usage_summary(questions: pl.DataFrame) -> dict[str, Any]:
    """Context tokens, model token usage, cost and the repeated-judging summary for run.json.

    ``judge_runs_summary``: per judging run, accuracy over the non-excluded questions (errors count as
    wrong); then their mean and sample standard deviation (0 with one run).
    """
    scored = questions.filter(~pl.col("excluded"))
    ctx = scored["context_tokens"].drop_nulls()
    costs = scored["cost_usd"].drop_nulls()
    per_run: list[float] = []
    if scored.height:
        runs = scored["judge_verdicts"].to_list()
        n_runs = max((len(v) for v in runs if v), default=0)
        for i in range(n_runs):
            correct = sum(1 for v in runs if v and len(v) > i and v[i] == "CORRECT")
            per_run.append(correct / scored.height)
    mean = sum(per_run) / len(per_run) if per_run else None
    std = (sum((a - mean) ** 2 for a in per_run) / (len(per_run) - 1)) ** 0.5 if len(per_run) > 1 else 0.0
    return {
        "context_tokens": {"mean": float(ctx.mean()) if ctx.len() else None,
                           "max": int(ctx.max()) if ctx.len() else None,
                           "questions_cut": int((scored["memories_cut"].fill_null(0) > 0).sum())},
        "tokens": {"prompt": int(scored["prompt_tokens"].fill_null(0).sum()),
                   "completion": int(scored["completion_tokens"].fill_null(0).sum()),
                   "answers_from_cache": int(scored["answer_cached"].fill_null(False).sum())},
        "cost_usd_estimate": float(costs.sum()) if costs.len() else None,
        "judge_runs_summary": {"accuracy_per_run": per_run, "mean": mean, "std": std if per_run else None},
    }


def evaluate(cfg: EvaluationConfig, *, on_progress: Callable[[str, dict[str, int]], None] | None = None,
             num_cpus: int | None = None) -> EvaluationResult:
    """Run one evaluation.

    Args:
        cfg: the evaluation's configuration.
        on_progress: called with ``("totals", {...})`` once, then ``("done", {stage: n})`` as work finishes.
        num_cpus: CPUs for a local Ray cluster started here (ignored when Ray is already running).

    Returns:
        The :class:`EvaluationResult`.

    Raises:
        FileExistsError: ``out_dir`` already holds a run.json (never overwritten).
        aml_ray.datasets.fetch.DatasetError: the dataset file is missing, unreachable or has another hash.
        StageFailed: a contract error or non-retryable participant status stopped the run; run.json is
            written with ``status="failed"`` and the error summary first.
    """
    spec = get_dataset(cfg.dataset)
    run_dir = RunDir(cfg.out_dir)
    if run_dir.run_json.exists():
        raise FileExistsError(f"{run_dir.run_json} exists: choose a new --out directory (runs are never "
                              "overwritten)")
    data_file = spec.resolve(cfg.data_path, cache_dir(), cfg.allow_hash_mismatch)
    samples = spec.load(data_file)
    # the suite's count check (aml_ray.suite): refuses a pinned or unpinned bundle whose counts differ
    bundle_info = verify_loaded_bundle(spec.name, cfg.data_path or data_file, samples,
                                       allow_hash_mismatch=cfg.allow_hash_mismatch)
    if cfg.limit_samples is not None:
        if cfg.limit_samples < 1:
            raise ValueError(f"limit_samples must be >= 1, got {cfg.limit_samples}")
        samples = samples[: cfg.limit_samples]
    inputs = build_inputs(samples, IdScheme(cfg.run_id, spec.name))
    answer_prompt = load_prompt(cfg.answer_prompt or spec.answer_prompt, cfg.answer_prompt_sha256)
    judge_prompt = load_prompt(cfg.judge_prompt or spec.judge_prompt, cfg.judge_prompt_sha256)
    prompts = {role: {"name": p.name, "sha256": p.sha256, "source": p.path}
               for role, p in (("answer", answer_prompt), ("judge", judge_prompt))}
    info: dict[str, Any] = {
        "run_id": cfg.run_id, "run_label": cfg.run_label, "status": "running",
        "started_at": datetime.now(timezone.utc).isoformat(),
        "dataset": {"name": spec.name, "track": spec.track, "file": str(data_file),
                    "sha256": path_sha256(data_file), "hash_mismatch_allowed": cfg.allow_hash_mismatch,
                    "samples": len(samples), "chunks": inputs.n_chunks, "messages": inputs.n_messages,
                    "questions": inputs.n_questions, "scorable_questions": inputs.n_scorable,
                    "excluded_questions": len(inputs.excluded_rows),
                    "questions_by_category": dict(sorted(inputs.by_category.items()))},
        "participant": {"label": cfg.participant_label, **cfg.participant.describe()},
        "models": {"answer": cfg.answer.describe(), "judge": cfg.judge.describe()},
        "offline_models": cfg.answer.offline or cfg.judge.offline,
        "bundle": bundle_info, "prompts": prompts, "top_k": cfg.top_k, "limit_samples": cfg.limit_samples,
        "context_budget_tokens": cfg.context_budget_tokens, "judge_runs": cfg.judge_runs,
        "package_version": aml_ray.__version__, "git_commit": _git_commit(),
        "pipeline_code_sha256": pipeline_code_hash(), "python": platform.python_version(),
    }
    write_json_atomic(info, run_dir.run_json)
    if on_progress:
        on_progress("totals", {"add": inputs.n_chunks, "search": inputs.n_scorable,
                               "answer": inputs.n_scorable, "judge": inputs.n_scorable})
    started_ray = init_ray(num_cpus=num_cpus)
    t0 = time.perf_counter()
    try:
        questions = run_pipeline(
            inputs, run_dir=run_dir, participant=cfg.participant, answer=cfg.answer, judge=cfg.judge,
            answer_prompt=answer_prompt, judge_prompt=judge_prompt, f1_rule=spec.f1_rule,
            top_k=cfg.top_k, options=cfg.options, context_budget_tokens=cfg.context_budget_tokens,
            judge_runs=cfg.judge_runs, scorer=spec.scorer,
            on_progress=(lambda snap: on_progress("done", snap)) if on_progress else None)
    except StageFailed as exc:
        info.update(status="failed", error=exc.summary, wall_s=round(time.perf_counter() - t0, 3),
                    finished_at=datetime.now(timezone.utc).isoformat())
        write_json_atomic(info, run_dir.run_json)
        raise
    finally:
        if started_ray:
            import ray

            ray.shutdown()
    wall_s = time.perf_counter() - t0
    adds = read_adds(run_dir)
    table = aggregate(questions.with_columns(pl.lit(spec.name).alias("dataset")))
    write_parquet_atomic(table.to_arrow(), run_dir.results_parquet)
    search_lat = questions.filter(pl.col("search_status") == "ok")["search_latency_ms"]
    info.update(
        status="completed", finished_at=datetime.now(timezone.utc).isoformat(), wall_s=round(wall_s, 3),
        evidence={"add_rows": adds.height, "question_rows": questions.height},
        adds={"ok": int((adds["status"] == "ok").sum()), "failed": int((adds["status"] != "ok").sum()),
              "retried": int((adds["attempts"] > 1).sum()),
              "retries_by_status": retries_by_status(adds["retried_statuses"]),
              "latency_ms": latency_summary(adds.filter(pl.col("status") == "ok")["latency_ms"])},
        search={"latency_ms": latency_summary(search_lat),
                "retried": int((questions["search_attempts"].fill_null(0) > 1).sum()),
                "failed": int((questions["search_status"] == "error").sum()),
                "retries_by_status": retries_by_status(questions["search_retried_statuses"])},
        **usage_summary(questions),
    )
    write_json_atomic({"run_id": cfg.run_id, "offline_models": info["offline_models"], "models": info["models"],
                       "table": table.to_dicts(), "judge_runs": info["judge_runs_summary"]},
                      run_dir.results_json)
    write_json_atomic(info, run_dir.run_json)
    return EvaluationResult(run_dir=run_dir, table=table, run_info=info, questions=questions)
