"""A suite's bundles at once: each bundle's :func:`~aml_ray.run.evaluation.evaluate` in a Ray actor of its own.

One bundle alone leaves the models idle at its start (its first samples' Adds and Searches) and at its end
(the last judge calls after the last answer), and the participant idle while its last questions are answered
and judged. Run one after another, a suite pays those waits once per bundle; run at once, one bundle's Adds
and Searches go while another's answers and judgements do. Each bundle runs in a :class:`BundleRunner` actor
(a process of its own: a pipeline's Ctrl-C, signals and Ray Data executor belong to one process, and the
memory a bundle's run holds grows with its corpus, its isolation index and its scoring, which the driver
then does not hold: docs/benchmarks.md), on the driver's node, since its run directory is written there. The
bundle's Ingest stage runs in the runner's process too (:mod:`aml_ray.run.local_ingest`): no Ingest actor per
bundle.
The bundles' runs share the participant version's client and each model endpoint's client through the
cluster's client registry (:mod:`aml_ray.actors.shared`; a process that did not start the cluster leases
them there), so the participant's declared capacity and each model's declared limits hold across the bundles, whose requests
take the slots round-robin (:mod:`aml_ray.actors.fair`).

The driver (:func:`run_at_once`) polls each runner's progress and hands it on, and reports each bundle's
outcome as it ends. A Ctrl-C there kills the runners (their pipelines' actors end with them) and marks
each unfinished bundle's run.json ``interrupted``, which ``aml-ray run --resume <bundle dir>`` continues.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray

from aml_ray.run.evaluation import EvaluationConfig, mark_interrupted, process_alive
from aml_ray.run.evidence import RunDir
from aml_ray.run.ray_runtime import on_this_node
from aml_ray.run.suite_run import BundleOutcome, Planned, run_bundle

log = logging.getLogger("aml_ray.run.bundle_runner")

#: Seconds between the driver's polls of the runners' progress.
POLL_S = 0.5
#: Seconds a Ctrl-C waits for the killed runners' processes to end, to mark their runs ``interrupted``.
KILL_WAIT_S = 30.0


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0, max_concurrency=2)
class BundleRunner:
    """Runs one bundle (:func:`aml_ray.run.suite_run.run_bundle`) and keeps its progress for the driver.

    ``max_concurrency=2``: :meth:`progress` answers while :meth:`run` runs.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals: dict[str, int] | None = None
        self._done: dict[str, int] = {}

    def _on_progress(self, kind: str, values: dict[str, int]) -> None:
        with self._lock:
            if kind == "totals":
                self._totals = dict(values)
            else:
                self._done.update(values)

    def run(self, outcome: BundleOutcome, suite: Any, bundle: Any, cfg: EvaluationConfig) -> BundleOutcome:
        """The bundle's outcome (:func:`~aml_ray.run.suite_run.run_bundle`); its errors are in the outcome."""
        return run_bundle(outcome, suite, bundle, cfg, on_progress=self._on_progress)

    def progress(self) -> tuple[dict[str, int] | None, dict[str, int]]:
        """``(totals, done)``: the run's totals per stage (None before they are known) and what is done."""
        with self._lock:
            return (dict(self._totals) if self._totals is not None else None), dict(self._done)


@dataclass
class _Running:
    plan: Planned
    runner: Any
    ref: Any
    started: float
    totals_sent: bool = False
    done_sent: dict[str, int] | None = None


def run_at_once(plans: list[Planned], *, at_once: int,
                on_start: Callable[[Planned], None] | None = None,
                on_done: Callable[[BundleOutcome], None] | None = None,
                on_progress: Callable[[str, str, dict[str, int]], None] | None = None) -> list[BundleOutcome]:
    """Run ``plans`` in :class:`BundleRunner` actors, at most ``at_once`` at a time, in the order given.

    Args:
        plans: the bundles to run (Ray is running).
        at_once: how many bundles run at a time (>= 1).
        on_start: called with each plan as its runner starts.
        on_done: called with each bundle's outcome as it ends (in the order they end).
        on_progress: called with ``(bundle, "totals", {...})`` once, then ``(bundle, "done", {stage: n})``
            when it changes, as :func:`~aml_ray.run.evaluation.evaluate`'s ``on_progress`` with the bundle's name.

    Returns:
        The outcomes, in the order of ``plans``. A runner that died (its node lost, killed) makes its bundle
        ``failed`` with the cause.

    Raises:
        KeyboardInterrupt: a Ctrl-C: the runners are killed and each unfinished bundle's run.json says
            ``interrupted`` (:func:`~aml_ray.run.evaluation.mark_interrupted`) first.
    """
    from aml_ray.run.suite_run import not_run

    if at_once < 1:
        raise ValueError(f"bundles at once: {at_once}; give 1 or more")
    waiting, running, ended = list(plans), {}, {}
    try:
        while waiting or running:
            while waiting and len(running) < at_once:
                plan = waiting.pop(0)
                if on_start:
                    on_start(plan)
                runner = BundleRunner.options(scheduling_strategy=on_this_node()).remote()
                ref = runner.run.remote(plan.outcome, plan.suite, plan.bundle, plan.cfg)
                running[ref] = _Running(plan, runner, ref, time.time())
            ready, _ = ray.wait(list(running), num_returns=1, timeout=POLL_S)
            if on_progress:
                _hand_on_progress(list(running.values()), on_progress)
            for ref in ready:
                item = running.pop(ref)
                try:
                    outcome = ray.get(ref)
                except ray.exceptions.RayError as exc:  # the runner died: the bundle's outcome, not the suite's
                    outcome = item.plan.outcome
                    not_run(outcome, exc)
                    outcome.wall_s = round(time.time() - item.started, 3)
                ended[item.plan.outcome.name] = outcome
                if on_done:
                    on_done(outcome)
    except KeyboardInterrupt:
        for item in running.values():
            ray.kill(item.runner, no_restart=True)
        _mark_interrupted(list(running.values()))
        raise
    return [ended[p.outcome.name] for p in plans]


def _mark_interrupted(items: list[_Running]) -> None:
    """Mark each killed runner's run ``interrupted`` once its process is gone (a run.json is marked only by the
    process that wrote it, or when that process no longer runs: ``ray.kill`` returns before the process ends),
    waiting at most :data:`KILL_WAIT_S` in all; a run whose runner wrote no run.json yet has nothing to mark."""
    deadline = time.monotonic() + KILL_WAIT_S
    while items:
        items = [item for item in items if not mark_interrupted(RunDir(item.plan.cfg.out_dir), item.plan.cfg.run_id,
                                                                wall_s=round(time.time() - item.started, 3))
                 and _running_there(RunDir(item.plan.cfg.out_dir))]
        if items and time.monotonic() < deadline:
            time.sleep(0.1)
        elif items:
            log.warning("runs still marked running after their runners were killed: %s",
                        [str(item.plan.cfg.out_dir) for item in items])
            return


def _running_there(run_dir: RunDir) -> bool:
    """Whether ``run_dir``'s run.json says ``running`` and the process it names still runs."""
    try:
        info = json.loads(run_dir.run_json.read_text())
    except (OSError, ValueError):
        return False
    return info.get("status") == "running" and process_alive(info.get("process"))


def _hand_on_progress(items: list[_Running], on_progress: Callable[[str, str, dict[str, int]], None]) -> None:
    """Ask every runner for its progress and hand on what changed (a runner that does not answer within
    :data:`POLL_S` is asked again at the next poll)."""
    refs = [item.runner.progress.remote() for item in items]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=POLL_S)
    answered = set(ready)
    for item, ref in zip(items, refs):
        if ref not in answered:
            continue
        try:
            totals, done = ray.get(ref)
        except ray.exceptions.RayError:  # the runner ended meanwhile: its outcome says how
            continue
        name = item.plan.outcome.name
        if totals is not None and not item.totals_sent:
            on_progress(name, "totals", totals)
            item.totals_sent = True
        if item.totals_sent and done != item.done_sent:
            on_progress(name, "done", done)
            item.done_sent = done
