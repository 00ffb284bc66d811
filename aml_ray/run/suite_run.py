"""A participant on every present bundle of a suite: :func:`evaluate_suite` runs :func:`evaluate` per bundle,
all bundles at once (:mod:`aml_ray.run.bundle_runner`) or one after another, then Overall by the suite's
rule (:func:`overall_of`).

One bundle's failure is that bundle's outcome: the suite goes on with the next bundle, and Overall names
the bundles it lacks, so a leak found in one dataset or a participant that stops answering during one
bundle never hides the scores of the others.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import ModelEndpoint
from aml_ray.ids import new_run_id
from aml_ray.run.evaluation import EvaluationConfig, EvaluationResult, evaluate
from aml_ray.run.evidence import read_questions, write_json_atomic
from aml_ray.run.options import PipelineOptions
from aml_ray.run.outcome import StageFailed
from aml_ray.run.pipeline import error_cause
from aml_ray.run.ray_runtime import init_ray, shutdown_ray

if TYPE_CHECKING:
    import polars as pl

log = logging.getLogger("aml_ray.run.suite_run")

#: How a skip reason starts when the bundle's substitute is not needed (its primary is present).
STANDS_IN = "stands in for"
#: Longest reason a failed bundle carries (one line; the run's own run.json has the whole summary).
MAX_REASON_CHARS = 400


def one_line(text: str, limit: int = MAX_REASON_CHARS) -> str:
    r"""``text`` as one line of at most ``limit`` characters (whitespace runs folded, an ellipsis when cut).

    Examples:
        >>> one_line("stopped:\n  the participant\tis gone", 40)
        'stopped: the participant is gone'
        >>> one_line("x" * 10, 5)
        'xxxx…'
    """
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


@dataclass
class SuiteConfig:
    """One participant on every bundle of a suite that is present under the datasets directory.

    Attributes:
        participant / answer / judge / participant_label / run_label / options: as in
            :class:`EvaluationConfig`, shared by every bundle.
        out_dir: the suite run directory: ``suite.json`` plus one run directory per bundle.
        suite: the suite name or file (:func:`aml_ray.suite.load_suite`).
        datasets_dir: the datasets directory (default :func:`aml_ray.suite.datasets_dir`).
        top_k / context_budget_tokens / judge_runs: None takes the suite's value; another value runs
            and is reported as a deviation from the release baseline.
        limit_samples: the first N samples of each bundle (smoke-sized runs; a deviation).
        allow_hash_mismatch: run bundles whose files differ from their pins (a deviation).
        bundles: run only these bundles (default: all of the suite's).
        run_id: one id for every bundle (ids stay unique: they hold the dataset name).
        bundles_at_once: how many bundles run at a time (:mod:`aml_ray.run.bundle_runner`); None: all of
            them. 1 runs them one after another in this process.
    """

    participant: ParticipantSpec
    answer: ModelEndpoint
    judge: ModelEndpoint
    out_dir: Path
    suite: str = "textual"
    datasets_dir: Path | None = None
    top_k: int | None = None
    context_budget_tokens: int | None = None
    judge_runs: int | None = None
    limit_samples: int | None = None
    allow_hash_mismatch: bool = False
    bundles: list[str] | None = None
    run_id: str = field(default_factory=new_run_id)
    run_label: str | None = None
    participant_label: str = "participant"
    options: PipelineOptions = field(default_factory=PipelineOptions)
    bundles_at_once: int | None = None


@dataclass
class BundleOutcome:
    """What happened to one bundle of a suite run.

    Attributes:
        name / dataset / title: the bundle.
        status: ``ran``, ``skipped`` (absent, no adapter, a missing operator input, or a substitute
            whose primary is present) or ``failed`` (refused by hash or counts, or stopped).
        reason: one line saying why, for ``skipped`` and ``failed``.
        result: the dataset's :class:`EvaluationResult` when it ran.
        score / score_se / coverage / n_total / n_scored: the dataset row of Overall.
        task_averages: secondary metrics (name -> value), task averages then subsets
            (:func:`aml_ray.suite.secondary_metrics`), e.g. LongMemEval's task-averaged and abstention accuracy.
        substitute_for: the primary bundle this one stands in for, if any.
        deviations: how the run differs from the release baseline.
        credits: the per-question credits behind ``score`` (non-excluded questions, errors 0), for the
            Overall's bootstrap interval; None reads them from ``result``'s evidence when needed.
        wall_s: seconds the bundle's run took (from its start to its outcome; 0 for a bundle that did not run).
    """

    name: str
    dataset: str
    title: str
    status: str
    reason: str | None = None
    result: EvaluationResult | None = None
    score: float | None = None
    score_se: float | None = None
    coverage: float | None = None
    n_total: int = 0
    n_scored: int = 0
    task_averages: dict[str, float | None] = field(default_factory=dict)
    substitute_for: str | None = None
    deviations: list[str] = field(default_factory=list)
    credits: list[float] | None = field(default=None, repr=False)
    wall_s: float = 0.0

    def question_credits(self) -> list[float] | None:
        """The per-question credits behind ``score`` (:func:`aml_ray.scoring.aggregate.with_credit`, excluded
        questions left out): ``credits`` when set, else read from the run's evidence; None when it did not run."""
        if self.credits is None and self.result is not None:
            import polars as pl

            from aml_ray.scoring.aggregate import with_credit

            rows = read_questions(self.result.run_dir, columns=("excluded", "status", "verdict", "score"))
            self.credits = with_credit(rows).filter(~pl.col("excluded"))["credit"].to_list()
        return self.credits

    @property
    def score_ci(self) -> tuple[float | None, float | None]:
        """The 95 % bootstrap interval of ``score``: the dataset row's ``accuracy_ci_low`` / ``_high`` of the
        result table (:func:`aml_ray.scoring.aggregate`); ``(None, None)`` when it did not run."""
        row = _dataset_row(self.result.table) if self.result is not None else {}
        return row.get("accuracy_ci_low"), row.get("accuracy_ci_high")

    def describe(self) -> dict[str, Any]:
        """The outcome for suite.json (no table, no evidence)."""
        return {k: getattr(self, k) for k in ("name", "dataset", "title", "status", "reason", "score", "score_se",
                                               "coverage", "n_total", "n_scored", "task_averages", "substitute_for",
                                               "deviations", "wall_s")} | (
            {"score_ci_low": self.score_ci[0], "score_ci_high": self.score_ci[1],
             "run_dir": str(self.result.run_dir.root)} if self.result else {})


@dataclass
class SuiteResult:
    """A finished suite run: per-bundle outcomes, the Overall row and what was written to suite.json."""

    suite: Any
    outcomes: list[BundleOutcome]
    overall: dict[str, Any]
    info: dict[str, Any]


def overall_of(outcomes: list[BundleOutcome]) -> dict[str, Any]:
    """Overall by the suite rule: the unweighted mean of the dataset scores of the bundles that ran.

    Its 95 % interval is the stratified percentile bootstrap of that mean
    (:func:`aml_ray.scoring.bootstrap.mean_of_means_ci`): each dataset's questions are resampled within the
    dataset, the resampled dataset scores are averaged without weights, bundles taken in suite order.

    Examples:
        >>> a = BundleOutcome("a", "a", "A", "ran", score=0.5, coverage=1.0, n_total=10, n_scored=10,
        ...                   credits=[1.0] * 5 + [0.0] * 5)
        >>> b = BundleOutcome("b", "b", "B", "ran", score=0.9, coverage=0.5, n_total=30, n_scored=15,
        ...                   credits=[1.0] * 27 + [0.0] * 3)
        >>> o = overall_of([a, b, BundleOutcome("c", "c", "C", "skipped", reason="absent: c.json not found"),
        ...                 BundleOutcome("d", "d", "D", "failed", reason="stopped: isolation"),
        ...                 BundleOutcome("e", "e", "E", "skipped", reason="stands in for a, which is present")])
        >>> round(o["score"], 3), round(o["coverage"], 4), o["datasets"]
        (0.7, 0.625, 2)
        >>> o["score_ci_low"] < 0.7 < o["score_ci_high"]
        True
        >>> o["complete"], o["lacks"]
        (False, ['c', 'd'])
        >>> s = BundleOutcome("s", "s", "S", "ran", score=0.5, n_total=2, n_scored=2, credits=[1.0, 0.0],
        ...                   substitute_for="p")
        >>> overall_of([BundleOutcome("p", "p", "P", "skipped", reason="absent: p.json not found"), s])["lacks"]
        []

    Returns:
        ``{"score", "score_ci_low", "score_ci_high", "coverage", "n_total", "n_scored", "datasets",
        "complete", "lacks"}``: score and its interval are None when nothing ran (the interval also when a
        bundle's credits are unknown); coverage = scored questions / non-excluded questions summed over the
        bundles that ran; ``lacks`` names the bundles that failed or were skipped (a substitute whose
        primary is present is not lacking, nor a primary whose substitute ran), ``complete`` is True when it
        names none.
    """
    from aml_ray.scoring.bootstrap import mean_of_means_ci

    ran = [o for o in outcomes if o.status == "ran" and o.score is not None]
    stood_in = {o.substitute_for for o in ran if o.substitute_for}  # an absent primary its substitute replaced
    lacks = [o.name for o in outcomes if o.status != "ran" and o.name not in stood_in
             and not (o.reason or "").startswith(STANDS_IN)]
    n_total = sum(o.n_total for o in ran)
    n_scored = sum(o.n_scored for o in ran)
    credits = [o.question_credits() for o in ran]
    low, high = mean_of_means_ci(credits) if ran and all(credits) else (None, None)
    return {"score": sum(o.score for o in ran) / len(ran) if ran else None, "score_ci_low": low,
            "score_ci_high": high, "coverage": n_scored / n_total if n_total else None, "n_total": n_total,
            "n_scored": n_scored, "datasets": len(ran), "complete": not lacks, "lacks": lacks}


def _dataset_row(table: pl.DataFrame) -> dict[str, Any]:
    import polars as pl

    row = table.filter(pl.col("category") == "overall").to_dicts()
    return row[0] if row else {}


def not_run(outcome: BundleOutcome, exc: Exception, *, log_traceback: bool = True) -> None:
    """Set ``outcome``'s status and one-line reason for the exception :func:`evaluate` raised on its bundle.

    A missing operator input (``FileNotFoundError``) skips the bundle; a refused dataset (``DatasetError``,
    ``ValueError``) and a stopped run (:class:`StageFailed`: contract error, leak, failure budget, the
    participant gone) fail it, as does any other error (logged with its traceback unless ``log_traceback``
    is False: the service, whose tracebacks could hold a decrypted secret, logs the type only).
    """
    from aml_ray.datasets.fetch import DatasetError

    if isinstance(exc, FileNotFoundError):
        outcome.status, outcome.reason = "skipped", f"input missing: {exc}"
    elif isinstance(exc, (DatasetError, ValueError)):
        outcome.status, outcome.reason = "failed", f"refused: {exc}"
    elif isinstance(exc, StageFailed):
        outcome.status, outcome.reason = "failed", one_line(f"stopped: {exc.summary}")
    else:
        log.error("bundle %s failed: %s", outcome.name, type(exc).__name__, exc_info=exc if log_traceback else None)
        outcome.status, outcome.reason = "failed", one_line(f"error: {error_cause(exc)}")


def ran(outcome: BundleOutcome, suite: Any, bundle: Any, result: EvaluationResult) -> None:
    """Fill ``outcome`` from its bundle's finished run: the dataset row of the result table (score, interval,
    coverage, counts), the bundle's secondary metrics and how the run differs from the release baseline.

    Args:
        outcome: the bundle's outcome (status becomes ``ran``).
        suite / bundle: the :class:`aml_ray.suite.Suite` and its bundle.
        result: what :func:`evaluate` returned for the bundle.
    """
    from aml_ray.suite import baseline_deviations, secondary_metrics

    row = _dataset_row(result.table)
    outcome.status, outcome.result = "ran", result
    outcome.score, outcome.score_se = row.get("accuracy"), row.get("accuracy_se")
    outcome.coverage, outcome.n_total, outcome.n_scored = row.get("coverage"), row.get("n_total", 0), row.get("n_scored", 0)
    outcome.task_averages = secondary_metrics(bundle, result.questions)  # task averages, subsets
    outcome.deviations = baseline_deviations(suite, bundle, result.run_info)
    if result.run_info["status"] != "completed":  # partial: fewer Adds or questions than the bundle
        outcome.deviations.append(f"run {result.run_info['status']}: {result.run_info.get('error')}")
    if bundle.substitute_for:
        outcome.deviations.append(f"stands in for {bundle.substitute_for}, which is absent")


@dataclass
class Planned:
    """A bundle that runs: its outcome (filled when it ends), the suite, the bundle and its run's config."""

    outcome: BundleOutcome
    suite: Any
    bundle: Any
    cfg: EvaluationConfig


def _bundle_config(cfg: SuiteConfig, suite: Any, bundle: Any, data_path: Path, out: Path) -> EvaluationConfig:
    """The :class:`EvaluationConfig` of one bundle's run: the suite run's settings, the bundle's file and pinned
    prompts, the suite's Top K, context budget and judge runs unless the suite run sets its own."""
    prompts = {role: pin for role, pin in bundle.prompts.items() if pin.sha256}
    return EvaluationConfig(
        dataset=bundle.dataset, participant=cfg.participant, answer=cfg.answer, judge=cfg.judge,
        out_dir=out / bundle.name, data_path=data_path, allow_hash_mismatch=cfg.allow_hash_mismatch,
        top_k=cfg.top_k or suite.top_k, limit_samples=cfg.limit_samples, run_id=cfg.run_id,
        run_label=cfg.run_label, participant_label=cfg.participant_label, options=cfg.options,
        answer_prompt=prompts["answer"].name if "answer" in prompts else None,
        answer_prompt_sha256=prompts["answer"].sha256 if "answer" in prompts else None,
        judge_prompt=prompts["judge"].name if "judge" in prompts else None,
        judge_prompt_sha256=prompts["judge"].sha256 if "judge" in prompts else None,
        context_budget_tokens=cfg.context_budget_tokens or suite.context_budget_tokens,
        judge_runs=cfg.judge_runs or suite.judge_runs, suite=cfg.suite)


def run_bundle(outcome: BundleOutcome, suite: Any, bundle: Any, cfg: EvaluationConfig, *,
               on_progress: Callable[[str, dict[str, int]], None] | None = None,
               own_cluster: bool = False) -> BundleOutcome:
    """Run one bundle with :func:`evaluate` and fill ``outcome`` (:func:`ran`, or :func:`not_run` with the error
    it raised: one bundle's failure is that bundle's outcome) and its ``wall_s``.

    Args:
        outcome: the bundle's outcome (filled and returned).
        suite / bundle: the :class:`aml_ray.suite.Suite` and its bundle.
        cfg: the bundle's run (:func:`_bundle_config`).
        on_progress / own_cluster: as :func:`evaluate`'s.

    Returns:
        ``outcome``.

    Raises:
        KeyboardInterrupt: a Ctrl-C (run.json says ``interrupted``: :func:`evaluate`).
    """
    t_bundle = time.perf_counter()
    try:
        result = evaluate(cfg, on_progress=on_progress, own_cluster=own_cluster)
    except Exception as exc:  # noqa: BLE001 - one bundle's failure is that bundle's outcome
        not_run(outcome, exc)
    else:
        ran(outcome, suite, bundle, result)
    finally:
        outcome.wall_s = round(time.perf_counter() - t_bundle, 3)
    return outcome


def _operator_input_missing(bundle: Any, data_path: Path, allow_hash_mismatch: bool) -> str | None:
    """Why a bundle whose data is the operator's own (:attr:`~aml_ray.datasets.registry.DatasetSpec.operator_input`)
    cannot run, its adapter's ``FileNotFoundError`` (e.g. ScriptMem's published placeholder); None when the
    input is there, or the bundle's dataset is a published one (its run resolves it)."""
    from aml_ray.config import cache_dir
    from aml_ray.datasets.registry import DATASETS

    spec = DATASETS[bundle.dataset]
    if not spec.operator_input:
        return None
    try:
        spec.resolve(data_path, cache_dir(), allow_hash_mismatch)
    except FileNotFoundError as exc:
        return str(exc)
    return None


def evaluate_suite(cfg: SuiteConfig, *,
                   on_bundle: Callable[[str, BundleOutcome | dict[str, Any]], None] | None = None,
                   on_progress: Callable[[str, str, dict[str, int]], None] | None = None,
                   num_cpus: int | None = None) -> SuiteResult:
    """Run every present bundle of a suite with :func:`evaluate`, then Overall by the suite's rule.

    Bundles are taken in suite order. A bundle is skipped, with a reason, when its files are absent, no
    adapter is registered for it, its adapter reports a missing input (``FileNotFoundError``, e.g.
    ScriptMem's unpublished scripts: found while the suite plans for a dataset whose data is the
    operator's own, else when its run starts), or it is a ``substitute_for`` bundle whose primary is present. A
    bundle whose files or counts differ from the suite is refused (``failed``), unless hash mismatches
    are allowed. A bundle that fails (a contract error, a leak, the participant gone, an internal error) is
    that bundle's outcome, ``failed`` with a one-line reason; the other bundles go on, and Overall names the
    bundles it lacks (:func:`overall_of`). Ray is started once, when a bundle runs. The bundles that run go
    ``cfg.bundles_at_once`` at a time, each in an actor of its own (:mod:`aml_ray.run.bundle_runner`: their
    runs share the participant's and the models' clients, so the declared limits hold across them); with
    1, one after another in this process.

    Args:
        cfg: the suite run's configuration.
        on_bundle: called with ``("done", outcome)`` for each bundle that does not run (skipped, refused)
            first, then ``("start", {"name", "title", "path"})`` as a bundle starts and ``("done", outcome)``
            as it ends (ran or failed), in the order they end.
        on_progress: called with ``(bundle, kind, values)`` as :func:`evaluate`'s ``on_progress``.
        num_cpus: CPUs for a local Ray cluster started here.

    Returns:
        The :class:`SuiteResult`; ``<out_dir>/suite.json`` holds the same facts.

    Raises:
        FileExistsError: ``out_dir`` already holds a suite.json.
        KeyboardInterrupt: a Ctrl-C; each unfinished bundle's run.json says ``interrupted``.
    """
    from aml_ray.datasets.registry import DATASETS
    from aml_ray.suite import check_bundle, datasets_dir, load_suite, release_baseline

    suite = load_suite(cfg.suite)
    root = datasets_dir(cfg.datasets_dir)
    out = Path(cfg.out_dir)
    if (out / "suite.json").exists():
        raise FileExistsError(f"{out / 'suite.json'} exists: choose a new --out directory (runs are never overwritten)")
    wanted = cfg.bundles or [b.name for b in suite.bundles]
    for name in wanted:
        suite.bundle(name)  # unknown names fail before anything runs
    checks = {b.name: check_bundle(b, root=root) for b in suite.bundles}
    outcomes: list[BundleOutcome] = []
    plans: list[Planned] = []
    started = datetime.now(timezone.utc).isoformat()
    t0 = time.perf_counter()
    for bundle in suite.bundles:
        if bundle.name not in wanted:
            continue
        outcome = BundleOutcome(bundle.name, bundle.dataset, bundle.title, "skipped",
                                substitute_for=bundle.substitute_for)
        outcomes.append(outcome)
        check = checks[bundle.name]
        primary = checks.get(bundle.substitute_for) if bundle.substitute_for else None
        if bundle.dataset not in DATASETS:
            outcome.reason = f"no adapter is registered for dataset {bundle.dataset!r}"
        elif primary is not None and primary.present and bundle.substitute_for in wanted:
            outcome.reason = f"{STANDS_IN} {bundle.substitute_for}, which is present"
        elif check.status == "missing":
            outcome.reason = f"absent: {check.data_path} not found (aml-ray datasets fetch {bundle.name})"
        elif check.status == "incomplete":
            outcome.reason = check.summary()
        elif check.status == "mismatch" and not cfg.allow_hash_mismatch:
            outcome.status, outcome.reason = "failed", f"refused: {check.summary()}"
        elif (missing := _operator_input_missing(bundle, check.data_path, cfg.allow_hash_mismatch)) is not None:
            outcome.reason = f"input missing: {missing}"
        else:
            plans.append(Planned(outcome, suite, bundle, _bundle_config(cfg, suite, bundle, check.data_path, out)))
            continue
        if on_bundle:
            on_bundle("done", outcome)

    def start(plan: Planned) -> None:
        if on_bundle:
            on_bundle("start", {"name": plan.bundle.name, "title": plan.bundle.title, "path": str(plan.cfg.data_path)})

    def done(outcome: BundleOutcome) -> None:
        if on_bundle:
            on_bundle("done", outcome)

    started_ray = False  # Ray starts only when a bundle runs (a run where every bundle is skipped needs none)
    try:
        if plans:
            started_ray = init_ray(num_cpus=num_cpus)
        at_once = min(cfg.bundles_at_once or len(plans), len(plans))
        if at_once > 1:
            from aml_ray.run.bundle_runner import run_at_once

            ran_outcomes = run_at_once(plans, at_once=at_once, on_start=start, on_done=done, on_progress=on_progress)
            by_name = {o.name: o for o in ran_outcomes}
            outcomes = [by_name.get(o.name, o) for o in outcomes]
        else:
            for plan in plans:
                start(plan)
                progress = (lambda kind, values, _n=plan.bundle.name: on_progress(_n, kind, values)) \
                    if on_progress else None
                done(run_bundle(plan.outcome, suite, plan.bundle, plan.cfg, on_progress=progress,
                                own_cluster=started_ray))
    finally:
        if started_ray:
            shutdown_ray()
    overall = overall_of(outcomes)
    not_comparable = [f"{o.name}: {o.status}" + (f" ({o.reason})" if o.reason else "")
                      for o in outcomes if o.status != "ran"]
    not_comparable += [f"{o.name}: {d}" for o in outcomes for d in o.deviations]
    info = {"suite": suite.name, "suite_version": suite.version, "run_id": cfg.run_id, "run_label": cfg.run_label,
            "participant": {"label": cfg.participant_label, **cfg.participant.describe()},
            "datasets_dir": str(root), "started_at": started, "finished_at": datetime.now(timezone.utc).isoformat(),
            "wall_s": round(time.perf_counter() - t0, 3), "aggregation_rule": suite.aggregation.rule,
            "bundles": [o.describe() for o in outcomes], "overall": overall,
            "comparable_with_release_baseline": not not_comparable, "differences_from_release_baseline": not_comparable,
            "release_baseline": release_baseline(suite)}
    write_json_atomic(info, out / "suite.json")
    return SuiteResult(suite=suite, outcomes=outcomes, overall=overall, info=info)
