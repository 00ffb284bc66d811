"""The publication gate: a completed full job's facts against the release baseline.

Source: the seed's "Evaluation & results": the result must come from a successful full run on the fixed
suite; every evaluation task must succeed; the Answer model, evaluation contract, pipeline code hash,
dataset bundle hashes and question counts must be complete and match the current release baseline; and
the result must be unique. The gate only records checks; an admin still approves or rejects.

The locked models are the suite's (``models`` of :mod:`aml_ray.suite`'s release baseline), never the
deployment's environment: a run of the offline answerer or judge (:mod:`aml_ray.models.offline`, which
only exists so that the pipeline runs without a hosted model) is refused by ``locked_models``, whatever
the suite names.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from aml_ray.run.provenance import pipeline_code_hash
from aml_ray.serve_app.settings import ServiceSettings
from aml_ray.store.models import Job, PublicSubmission, Review


def run_facts(run_info: dict[str, Any]) -> dict[str, Any]:
    """The secret-free facts of one run.json that the gate and the participant need (no server paths).

    Args:
        run_info: the content of run.json.

    Returns:
        Models, prompts (sha256), Top K, pipeline hash, dataset hash, whether its files match the suite's
        pins, and counts, Add outcomes, the sample limit, wall time.
    """
    ds = run_info["dataset"]
    return {
        "run_id": run_info["run_id"], "offline_models": run_info["offline_models"],
        "models": {role: {"model": m["model"], "offline": m["offline"]} for role, m in run_info["models"].items()},
        "prompts": {p.get("name", key): p["sha256"] for key, p in run_info["prompts"].items()},
        "top_k": run_info["top_k"], "pipeline_code_sha256": run_info["pipeline_code_sha256"],
        "datasets": {ds["name"]: {"sha256": ds["sha256"], "hash_mismatch_allowed": ds["hash_mismatch_allowed"],
                                  "files_match": bool((run_info.get("bundle") or {}).get("files_match")),
                                  "samples": ds["samples"], "questions": ds["questions"],
                                  "scorable_questions": ds["scorable_questions"]}},
        "adds": {"ok": run_info["adds"]["ok"], "failed": run_info["adds"]["failed"]},
        "limit_samples": run_info["limit_samples"], "wall_s": run_info["wall_s"],
    }


def suite_facts(per_bundle: list[dict[str, Any]], *, suite: str) -> dict[str, Any]:
    """One job's facts from its bundles' :func:`run_facts`: datasets and prompts united, Adds and wall time
    summed, ``offline_models`` true when any bundle used an offline model, models of the first bundle (every
    bundle of a job calls the same endpoints), ``suite`` as ``name@version``.

    Raises:
        ValueError: no bundle.
    """
    if not per_bundle:
        raise ValueError("suite_facts needs the facts of at least one bundle")
    first = per_bundle[0]
    return {**first, "suite": suite, "run_ids": [f["run_id"] for f in per_bundle],
            "offline_models": any(f["offline_models"] for f in per_bundle),
            "prompts": {k: v for f in per_bundle for k, v in f["prompts"].items()},
            "datasets": {k: v for f in per_bundle for k, v in f["datasets"].items()},
            "adds": {k: sum(f["adds"][k] for f in per_bundle) for k in ("ok", "failed")},
            "wall_s": round(sum(f["wall_s"] for f in per_bundle), 3)}


def release_baseline(settings: ServiceSettings, track: str) -> dict[str, Any]:
    """What a publishable full run of ``track`` must match: the pins of the track's suite file, never what
    this deployment happens to run (its bundles present, its ``AML_FULL_SAMPLES``).

    Args:
        settings: the service settings (which suite file the track uses).
        track: the track.

    Returns:
        ``{"suite", "answer_model", "judge_model", "prompts": {name: pinned sha256}, "top_k",
        "pipeline_code_sha256", "datasets": {dataset: {"bundle", "pinned", "questions"}}}`` over the suite's
        primary bundles (a bundle marked ``substitute_for`` is not part of the release); ``questions`` is
        the suite's expected total (None when the suite does not know it).
    """
    from aml_ray.serve_app.tracks import track_suite

    suite = track_suite(settings, track)
    primaries = [b for b in suite.bundles if b.substitute_for is None]
    return {"suite": f"{suite.name}@{suite.version}", "answer_model": suite.models.answer,
            "judge_model": suite.models.judge,
            "prompts": {p.name: p.sha256 for b in primaries for p in b.prompts.values()},
            "top_k": suite.top_k, "pipeline_code_sha256": pipeline_code_hash(),
            "datasets": {b.dataset: {"bundle": b.name, "pinned": b.pinned, "questions": b.expected.total}
                         for b in primaries}}


def check(ok: bool, detail: str) -> dict[str, Any]:
    """One gate check: ``{"ok": bool, "detail": str}``."""
    return {"ok": bool(ok), "detail": detail}


def unique_check(session: Session, job: Job) -> dict[str, Any]:
    """The ``unique`` check: no publication and no other pending or approved review of the job's version
    on its track (seed: "the result must be unique")."""
    duplicate = session.scalar(select(PublicSubmission.id).where(PublicSubmission.version_id == job.version_id,
                                                                 PublicSubmission.track == job.track))
    other_review = session.scalar(select(Review.id).join(Job, Review.job_id == Job.id).where(
        Job.version_id == job.version_id, Job.track == job.track, Job.id != job.id,
        Review.status.in_(("pending", "approved"))))
    ok = duplicate is None and other_review is None
    return check(ok, "no other publication of this version" if ok
                 else "this version already has a publication or open review on the track")


def publication_gate(session: Session, job: Job, table: list[dict[str, Any]], facts: dict[str, Any],
                     baseline: dict[str, Any]) -> dict[str, Any]:
    """Check a completed job for publication.

    Args:
        session: an open session.
        job: the job.
        table: its aggregate rows.
        facts: :func:`run_facts` of its run.
        baseline: :func:`release_baseline` of its track (the suite file's pins).

    Returns:
        ``{"passed": bool, "checks": {name: {"ok": bool, "detail": str}}}``.
    """
    overall_rows = [r for r in table if r["category"] == "overall"]
    errors = sum(r["n_errors"] for r in overall_rows)
    answer_model = facts["models"]["answer"]["model"]
    ds_facts, ds_base = facts["datasets"], baseline["datasets"]
    missing, extra = sorted(set(ds_base) - set(ds_facts)), sorted(set(ds_facts) - set(ds_base))
    bundles_detail = (f"ran {len(set(ds_facts) & set(ds_base))} of the suite's {len(ds_base)} bundles"
                      + (f"; missing: {', '.join(missing)}" if missing else "")
                      + (f"; not in the suite: {', '.join(extra)}" if extra else ""))
    bad_files = [d for d in ds_base if d in ds_facts and not (ds_base[d]["pinned"] and ds_facts[d].get("files_match")
                                                                and not ds_facts[d]["hash_mismatch_allowed"])]
    hashes_ok = not missing and not extra and not bad_files
    short_counts = [f"{d}: {ds_facts[d]['questions']} of {ds_base[d]['questions']}" for d in ds_base
                    if d in ds_facts and ds_facts[d]["questions"] != ds_base[d]["questions"]]
    counts_ok = not missing and not extra and not short_counts and all(
        v["questions"] is not None for v in ds_base.values())
    limit = facts.get("limit_samples")
    checks = {
        "full_run_completed": check(job.mode == "full" and job.status == "completed",
                                    f"mode {job.mode}, status {job.status}"),
        "all_tasks_succeeded": check(facts["adds"]["failed"] == 0 and errors == 0,
                                     f"{facts['adds']['failed']} failed Adds, {errors} question errors"),
        "locked_models": check(not facts["offline_models"] and answer_model == baseline["answer_model"]
                               and facts["models"]["judge"]["model"] == baseline["judge_model"],
                               "offline answerer/judge: never published" if facts["offline_models"] else
                               f"answer {answer_model!r}, judge {facts['models']['judge']['model']!r} vs locked "
                               f"{baseline['answer_model']!r}, {baseline['judge_model']!r}"),
        "suite": check(facts.get("suite") == baseline["suite"], f"{facts.get('suite')} vs {baseline['suite']}"),
        "evaluation_contract": check(facts["prompts"] == baseline["prompts"]
                                     and facts["top_k"] == baseline["top_k"],
                                     f"judge {facts['models']['judge']['model']!r}, top_k {facts['top_k']}"),
        "pipeline_code_hash": check(facts["pipeline_code_sha256"] == baseline["pipeline_code_sha256"],
                                    facts["pipeline_code_sha256"][:12]),
        "suite_bundles": check(not missing and not extra, bundles_detail),
        "dataset_bundle_hashes": check(hashes_ok, "every bundle's files match the suite's sha256 pins" if hashes_ok
                                       else "files differ from the suite's pins (or are not pinned): "
                                            + ", ".join(bad_files or missing or extra)),
        "question_counts": check(counts_ok, ", ".join(f"{d}:{v['questions']}" for d, v in ds_facts.items())
                                 if counts_ok else "questions differ from the suite's: "
                                 + "; ".join(short_counts or [f"{d}: not run" for d in missing] or ["unknown totals"])),
        "all_samples": check(limit is None, "every sample of every bundle" if limit is None else
                             f"limited to {limit} sample(s) per bundle (AML_FULL_SAMPLES): never publishable"),
        "unique": unique_check(session, job),
    }
    return {"passed": all(c["ok"] for c in checks.values()), "checks": checks}
