"""Re-score a finished run with another judge, without touching the original evidence.

``aml-ray rejudge RUN_DIR`` reads the run's question evidence, judges every answered question again with
the judge configured now (``JUDGE_*`` variables, or the offline lexical judge), and writes a new folder
``RUN_DIR/rejudge/<label>/`` holding ``questions.parquet``, ``results.json`` and ``rejudge.json``
(judge model, prompt hash, source run, and the errata applied with ``--errata``). Answers are never regenerated, so the answer model is not paid
again; the judge's own replies are cached by (model, prompt hash, input hash).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import polars as pl

from aml_ray.actors.model import ModelClient
from aml_ray.config import ModelEndpoint
from aml_ray.datasets.registry import get_dataset
from aml_ray.run.evidence import QUESTION_SCHEMA, RunDir, read_questions, to_table, write_json_atomic, write_parquet_atomic
from aml_ray.prompts import load_prompt
from aml_ray.scoring.aggregate import aggregate
from aml_ray.stages.scorers import get_scorer

JUDGE_COLUMNS = ("verdict", "judge_raw", "judge_raw_all", "judge_status", "judge_error", "judge_attempts", "judge_verdicts",
                 "score", "score_detail", "f1", "bleu1", "status")


@dataclass
class RejudgeResult:
    """Where the re-judged run went and its score table."""

    out_dir: Path
    table: pl.DataFrame


def completed_run_info(run_dir: RunDir) -> dict:
    """The run.json of a completed run, the only kind that can be re-judged.

    Raises:
        FileNotFoundError: no run.json; ValueError: the run did not complete.
    """
    if not run_dir.run_json.is_file():
        raise FileNotFoundError(f"{run_dir.run_json} not found: pass a run directory made by 'aml-ray run'")
    info = json.loads(run_dir.run_json.read_text())
    if info.get("status") != "completed":
        raise ValueError(f"run {info.get('run_id')} ({run_dir.root}) has status {info.get('status')!r}; only "
                         "completed runs can be re-judged")
    return info


def rejudge(run_root: Path, judge: ModelEndpoint, *, label: str | None = None, prompt: str | None = None,
            prompt_sha256: str | None = None, batch_size: int = 64, errata: Path | None = None) -> RejudgeResult:
    """Judge a finished run's answers again.

    Args:
        run_root: the run directory (must hold a completed run.json and question evidence).
        judge: the new judge endpoint.
        label: folder name under ``rejudge/`` (default: a UTC timestamp).
        prompt / prompt_sha256: judge prompt override (default: the dataset's).
        batch_size: questions per concurrent batch.
        errata: an errata file (:mod:`aml_ray.errata`) applied to the gold answers first; its bundle, version,
            sha256 and what it changed are recorded in rejudge.json and results.json.

    Raises:
        FileNotFoundError: no run.json, or no errata file; ValueError: the run did not complete, the label
            exists, or the errata are bad or another bundle's.
    """
    run_dir = RunDir(run_root)
    info = completed_run_info(run_dir)
    spec = get_dataset(info["dataset"]["name"])
    judge_prompt = load_prompt(prompt or spec.judge_prompt, prompt_sha256)
    label = label or datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = run_dir.root / "rejudge" / label
    if out.exists():
        raise ValueError(f"{out} exists: choose another --label")
    scorer = get_scorer(spec.scorer)
    rows = read_questions(run_dir).to_dicts()
    applied = None
    if errata is not None:
        from aml_ray.errata import apply_errata, load_errata

        loaded = load_errata(errata)
        applied = {**loaded.describe(), **apply_errata(rows, loaded, dataset=spec.name,
                                                       dataset_sha256=info["dataset"].get("sha256"))}
    for r in rows:
        if not r["excluded"]:
            r.update({c: None for c in JUDGE_COLUMNS})

    async def run() -> None:
        model = None if judge.offline else ModelClient(judge)
        try:
            todo = [r for r in rows if not r["excluded"]]
            for i in range(0, len(todo), batch_size):
                await scorer(todo[i:i + batch_size], endpoint=judge, model=model, prompt=judge_prompt,
                             f1_rule=spec.f1_rule, max_parse_retries=2, judge_runs=info.get("judge_runs", 1))
        finally:
            if model is not None:
                await model.aclose()

    asyncio.run(run())
    table = aggregate(pl.from_arrow(to_table(rows, QUESTION_SCHEMA)).with_columns(pl.lit(spec.name).alias("dataset")))
    write_parquet_atomic(to_table(rows, QUESTION_SCHEMA), out / "questions.parquet")
    write_json_atomic({"source_run_id": info["run_id"], "judge": judge.describe(),
                       "judge_prompt": {"name": judge_prompt.name, "sha256": judge_prompt.sha256},
                       **({"errata": applied} if applied else {}),
                       "finished_at": datetime.now(timezone.utc).isoformat()}, out / "rejudge.json")
    write_json_atomic({"run_id": info["run_id"], "judge": judge.describe(), **({"errata": applied} if applied else {}),
                       "table": table.to_dicts()}, out / "results.json")
    return RejudgeResult(out_dir=out, table=table)
