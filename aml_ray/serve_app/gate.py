"""The publication gate: a completed full job's facts against the release baseline.

Source: the seed's "Evaluation & results": the result must come from a successful full run on the fixed
suite; every evaluation task must succeed; the Answer model, evaluation contract, pipeline code hash,
dataset bundle hashes and question counts must be complete and match the current release baseline; and
the result must be unique. The gate only records checks; an admin still approves or rejects.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from aml_ray.config import cache_dir, model_endpoint_from_env
from aml_ray.datasets.registry import get_dataset
from aml_ray.evaluation import pipeline_code_hash
from aml_ray.prompts import load_prompt
from aml_ray.serve_app.settings import TRACK_DATASETS, ServiceSettings
from aml_ray.store.models import Job, PublicSubmission, Review

#: Formal Top K (seed: "formal external evaluations use 100").
FORMAL_TOP_K = 100


def run_facts(run_info: dict[str, Any]) -> dict[str, Any]:
    """The secret-free facts of one run.json that the gate and the participant need (no server paths).

    Args:
        run_info: the content of run.json.

    Returns:
        Models, prompts (sha256), Top K, pipeline hash, dataset hash and counts, Add outcomes, wall time.
    """
    ds = run_info["dataset"]
    return {
        "run_id": run_info["run_id"], "offline_models": run_info["offline_models"],
        "models": {role: {"model": m["model"], "offline": m["offline"]} for role, m in run_info["models"].items()},
        "prompts": {p.get("name", key): p["sha256"] for key, p in run_info["prompts"].items()},
        "top_k": run_info["top_k"], "pipeline_code_sha256": run_info["pipeline_code_sha256"],
        "datasets": {ds["name"]: {"sha256": ds["sha256"], "hash_mismatch_allowed": ds["hash_mismatch_allowed"],
                                  "samples": ds["samples"], "questions": ds["questions"],
                                  "scorable_questions": ds["scorable_questions"]}},
        "adds": {"ok": run_info["adds"]["ok"], "failed": run_info["adds"]["failed"]},
        "limit_samples": run_info["limit_samples"], "wall_s": run_info["wall_s"],
    }


def release_baseline(settings: ServiceSettings, track: str) -> dict[str, Any]:
    """What a publishable run of ``track`` must match on this deployment.

    Args:
        settings: the service settings (dataset files, full-run sample limit).
        track: the track.

    Returns:
        ``{"answer_model", "judge_model", "prompts", "top_k", "pipeline_code_sha256", "datasets"}``.
    """
    answer, judge = model_endpoint_from_env("answer"), model_endpoint_from_env("judge")
    datasets, prompts = {}, {}
    for name in TRACK_DATASETS[track]:
        path = settings.dataset_paths.get(name)
        datasets[name] = _dataset_baseline(name, str(path) if path else None, settings.full_limit_samples)
        spec = get_dataset(name)
        for prompt in (spec.answer_prompt, spec.judge_prompt):
            prompts[prompt] = load_prompt(prompt).sha256
    return {"answer_model": answer.model, "judge_model": judge.model, "prompts": prompts,
            "top_k": FORMAL_TOP_K, "pipeline_code_sha256": pipeline_code_hash(), "datasets": datasets}


@lru_cache(maxsize=16)
def _dataset_baseline(name: str, path: str | None, limit: int | None) -> dict[str, Any]:
    from pathlib import Path

    from aml_ray.datasets.fetch import sha256_file

    spec = get_dataset(name)
    file = spec.resolve(Path(path) if path else None, cache_dir(), False)
    samples = spec.load(file)[:limit] if limit else spec.load(file)
    return {"sha256": sha256_file(file), "questions": sum(len(s.questions) for s in samples)}


def publication_gate(session: Session, job: Job, table: list[dict[str, Any]], facts: dict[str, Any],
                     baseline: dict[str, Any]) -> dict[str, Any]:
    """Check a completed job for publication.

    Args:
        session: an open session.
        job: the job.
        table: its aggregate rows.
        facts: :func:`run_facts` of its run.
        baseline: :func:`release_baseline` of its track.

    Returns:
        ``{"passed": bool, "checks": {name: {"ok": bool, "detail": str}}}``.
    """
    def check(ok: bool, detail: str) -> dict[str, Any]:
        return {"ok": bool(ok), "detail": detail}

    overall_rows = [r for r in table if r["category"] == "overall"]
    errors = sum(r["n_errors"] for r in overall_rows)
    answer_model = facts["models"]["answer"]["model"]
    ds_facts, ds_base = facts["datasets"], baseline["datasets"]
    hashes_ok = set(ds_facts) == set(ds_base) and all(
        ds_facts[d]["sha256"] == ds_base[d]["sha256"] and not ds_facts[d]["hash_mismatch_allowed"] for d in ds_base)
    counts_ok = set(ds_facts) == set(ds_base) and all(
        ds_facts[d]["questions"] == ds_base[d]["questions"] for d in ds_base)
    duplicate = session.scalar(select(PublicSubmission.id).where(PublicSubmission.version_id == job.version_id,
                                                                 PublicSubmission.track == job.track))
    other_review = session.scalar(select(Review.id).join(Job, Review.job_id == Job.id).where(
        Job.version_id == job.version_id, Job.track == job.track, Job.id != job.id,
        Review.status.in_(("pending", "approved"))))
    checks = {
        "full_run_completed": check(job.mode == "full" and job.status == "completed",
                                    f"mode {job.mode}, status {job.status}"),
        "all_tasks_succeeded": check(facts["adds"]["failed"] == 0 and errors == 0,
                                     f"{facts['adds']['failed']} failed Adds, {errors} question errors"),
        "answer_model": check(answer_model == baseline["answer_model"],
                              f"{answer_model!r} vs baseline {baseline['answer_model']!r}"),
        "evaluation_contract": check(facts["models"]["judge"]["model"] == baseline["judge_model"]
                                     and facts["prompts"] == baseline["prompts"]
                                     and facts["top_k"] == baseline["top_k"],
                                     f"judge {facts['models']['judge']['model']!r}, top_k {facts['top_k']}"),
        "pipeline_code_hash": check(facts["pipeline_code_sha256"] == baseline["pipeline_code_sha256"],
                                    facts["pipeline_code_sha256"][:12]),
        "dataset_bundle_hashes": check(hashes_ok, ", ".join(f"{d}:{v['sha256'][:12]}" for d, v in ds_facts.items())),
        "question_counts": check(counts_ok, ", ".join(f"{d}:{v['questions']}" for d, v in ds_facts.items())),
        "unique": check(duplicate is None and other_review is None,
                        "no other publication of this version" if duplicate is None and other_review is None
                        else "this version already has a publication or open review on the track"),
    }
    return {"passed": all(c["ok"] for c in checks.values()), "checks": checks}
