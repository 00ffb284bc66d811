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
from aml_ray.datasets.fetch import sha256_file
from aml_ray.datasets.registry import get_dataset
from aml_ray.evidence import RunDir, read_adds, write_json_atomic, write_parquet_atomic
from aml_ray.ids import IdScheme, new_run_id
from aml_ray.pipeline import PipelineOptions, StageFailed, build_inputs, run_pipeline
from aml_ray.prompts import load_prompt
from aml_ray.ray_runtime import init_ray
from aml_ray.scoring import aggregate, latency_summary


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
    if cfg.limit_samples is not None:
        if cfg.limit_samples < 1:
            raise ValueError(f"limit_samples must be >= 1, got {cfg.limit_samples}")
        samples = samples[: cfg.limit_samples]
    inputs = build_inputs(samples, IdScheme(cfg.run_id, spec.name))
    prompts = {p.name: {"sha256": p.sha256, "path": p.path}
               for p in (load_prompt(spec.answer_prompt), load_prompt(spec.judge_prompt))}
    info: dict[str, Any] = {
        "run_id": cfg.run_id, "run_label": cfg.run_label, "status": "running",
        "started_at": datetime.now(timezone.utc).isoformat(),
        "dataset": {"name": spec.name, "track": spec.track, "file": str(data_file),
                    "sha256": sha256_file(data_file), "hash_mismatch_allowed": cfg.allow_hash_mismatch,
                    "samples": len(samples), "chunks": inputs.n_chunks, "messages": inputs.n_messages,
                    "questions": inputs.n_questions, "scorable_questions": inputs.n_scorable,
                    "excluded_questions": len(inputs.excluded_rows),
                    "questions_by_category": dict(sorted(inputs.by_category.items()))},
        "participant": {"label": cfg.participant_label, **cfg.participant.describe()},
        "models": {"answer": cfg.answer.describe(), "judge": cfg.judge.describe()},
        "offline_models": cfg.answer.offline or cfg.judge.offline,
        "prompts": prompts, "top_k": cfg.top_k, "limit_samples": cfg.limit_samples,
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
            answer_prompt=spec.answer_prompt, judge_prompt=spec.judge_prompt, f1_rule=spec.f1_rule,
            top_k=cfg.top_k, options=cfg.options,
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
              "latency_ms": latency_summary(adds.filter(pl.col("status") == "ok")["latency_ms"])},
        search={"latency_ms": latency_summary(search_lat),
                "retried": int((questions["search_attempts"].fill_null(0) > 1).sum())},
        tokens={"prompt": int(questions["prompt_tokens"].fill_null(0).sum()),
                "completion": int(questions["completion_tokens"].fill_null(0).sum())},
    )
    write_json_atomic({"run_id": cfg.run_id, "offline_models": info["offline_models"],
                       "models": info["models"], "table": table.to_dicts()}, run_dir.results_json)
    write_json_atomic(info, run_dir.run_json)
    return EvaluationResult(run_dir=run_dir, table=table, run_info=info, questions=questions)
