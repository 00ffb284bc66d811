"""The background job worker: runs queued jobs through :func:`aml_ray.evaluation.evaluate`.

``settings.max_concurrent_jobs`` daemon threads (``AML_MAX_CONCURRENT_JOBS``, default 2) take job ids
from one queue, so that many jobs run at once (jobs queued before a restart are picked up again; jobs
left ``running`` are marked failed). Ray Data runs each job's dataset from its own thread of this one
driver process, and the jobs share each participant version's and each model endpoint's client actor
(:mod:`aml_ray.actors.shared`): every version and endpoint keeps its declared limits however many jobs
use it, and a model endpoint's slots go round-robin across jobs (:mod:`aml_ray.actors.fair`). For each
job a thread re-validates the version's endpoints (DNS may have changed since submission), decrypts the
Memory System Key into the in-memory ``ParticipantSpec`` only, runs the evaluation, stores the result
and, for a full job, opens its review with the publication gate.

Error summaries are redacted: the decrypted secret is replaced wherever it could appear.
"""

from __future__ import annotations

import json

import logging
import queue
import threading
import time
from pathlib import Path

from pydantic import SecretStr

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import model_endpoint_from_env
from aml_ray.security import EndpointRejected, validate_endpoint_url
from aml_ray.serve_app.gate import publication_gate, release_baseline, run_facts
from aml_ray.serve_app.settings import TRACK_DATASETS
from aml_ray.store.jobs import fail_interrupted, get_job, mark_completed, mark_failed, mark_running, \
    queued_job_ids, record_progress
from aml_ray.store.keys import load_secret
from aml_ray.store.models import Version
from aml_ray.store.results import open_review, save_result

log = logging.getLogger("aml_ray.serve_app.worker")
#: Seconds between progress writes to the database (totals and the final snapshot are always written).
PROGRESS_INTERVAL_S = 0.5


def redact(text: str, secret: SecretStr | None) -> str:
    """``text`` with the secret's value replaced by ``***``."""
    if secret is not None and secret.get_secret_value():
        text = text.replace(secret.get_secret_value(), "***")
    return text


class JobWorker:
    """Runs up to ``settings.max_concurrent_jobs`` jobs at once, each in its own daemon thread.

    Args:
        service: the :class:`aml_ray.serve_app.deps.Service` (settings, sessions, secret box).

    Attributes:
        idle: set while no job is queued or running.
    """

    def __init__(self, service):
        self.service = service
        self.n_threads = service.settings.max_concurrent_jobs
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._pending = 0  # submitted and not finished
        self._running: set[str] = set()
        self.idle = threading.Event()
        self.idle.set()

    def start(self) -> None:
        """Fail jobs interrupted by a restart, requeue queued ones, start the threads."""
        with self.service.sessions.begin() as session:
            n = fail_interrupted(session)
            pending = queued_job_ids(session)
        if n:
            log.warning("marked %d interrupted job(s) failed", n)
        for job_id in pending:
            self.submit(job_id)
        for i in range(self.n_threads):
            thread = threading.Thread(target=self._loop, name=f"aml-job-worker-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        """Ask every thread to stop after its current job; wait up to ``timeout`` seconds in all."""
        for _ in self._threads:
            self._queue.put(None)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def submit(self, job_id: str) -> None:
        """Queue a job id."""
        with self._lock:
            self._pending += 1
            self.idle.clear()
        self._queue.put(job_id)

    def running_jobs(self) -> set[str]:
        """A copy of the ids of the jobs running now."""
        with self._lock:
            return set(self._running)

    def wait_idle(self, timeout: float) -> bool:
        """Block until no job is queued or running (tests); returns False on timeout."""
        return self.idle.wait(timeout)

    def _loop(self) -> None:
        while True:
            job_id = self._queue.get()
            if job_id is None:
                return
            # the same id queued twice (requeued at start, then submitted) never runs twice at once, and
            # run_job skips a job that is no longer queued
            with self._lock:
                duplicate = job_id in self._running
                self._running.add(job_id)
            try:
                if not duplicate:
                    self.run_job(job_id)
            except Exception:  # the worker must survive any job; the job is marked failed in run_job
                log.exception("job %s: worker error", job_id)
            finally:
                with self._lock:
                    if not duplicate:
                        self._running.discard(job_id)
                    self._pending -= 1
                    if self._pending == 0:
                        self.idle.set()

    def run_job(self, job_id: str) -> None:
        """Run one job to completion or failure (status, result and review written to the store)."""
        from aml_ray.evaluation import EvaluationConfig, evaluate
        from aml_ray.pipeline import StageFailed

        settings = self.service.settings
        secret: SecretStr | None = None
        sessions = self.service.sessions
        with sessions.begin() as session:
            job = get_job(session, job_id)
            if job.status != "queued":
                return
            version = session.get(Version, job.version_id)
            label = f"{version.system.name}/{version.label}"
            try:
                spec, secret = self._participant(session, version)
            except EndpointRejected as exc:
                mark_failed(job, f"endpoint rejected at job start: {exc}")
                return
            run_dir = Path(settings.runs_dir) / job.id
            mark_running(job, str(run_dir))
            mode, track, run_label = job.mode, job.track, job.run_label
        dataset = TRACK_DATASETS[track][0]
        last_write = [0.0]
        if mode == "smoke" and not self._smoke_conformance(job_id, spec, secret):
            return

        latest: dict[str, int] = {}  # the newest "done" counts: written at the end even when throttled

        def on_progress(kind: str, values: dict[str, int]) -> None:
            now = time.monotonic()
            if kind != "totals":
                latest.update(values)
                if now - last_write[0] < PROGRESS_INTERVAL_S:
                    return
            last_write[0] = now
            with sessions.begin() as s:
                record_progress(get_job(s, job_id), kind, values)

        def final_progress() -> None:
            if latest:
                with sessions.begin() as s:
                    record_progress(get_job(s, job_id), "done", latest)

        cfg = EvaluationConfig(
            dataset=dataset, participant=spec, answer=model_endpoint_from_env("answer"),
            judge=model_endpoint_from_env("judge"), out_dir=run_dir, data_path=settings.dataset_paths.get(dataset),
            limit_samples=settings.smoke_limit_samples if mode == "smoke" else settings.full_limit_samples,
            run_label=run_label, participant_label=label)
        try:
            result = evaluate(cfg, on_progress=on_progress, num_cpus=settings.num_cpus)
        except StageFailed as exc:
            final_progress()
            self._fail(job_id, redact(exc.summary, secret))
            return
        except Exception as exc:  # dataset missing, Ray failure...: summarised, secret redacted
            log.error("job %s failed: %s", job_id, type(exc).__name__)
            self._fail(job_id, redact(f"{type(exc).__name__}: {exc}", secret))
            return
        final_progress()
        table = result.table.to_dicts()
        facts = run_facts(result.run_info)
        status = result.run_info["status"]  # derived from the evidence (aml_ray.outcome), never assumed
        with sessions.begin() as session:
            job = get_job(session, job_id)
            save_result(session, job, table, facts)
            if status != "completed":  # partial: the result is kept for the participant; no review, quota back
                mark_failed(job, redact(result.run_info.get("error") or status, secret), status=status)
                log.info("job %s ended %s", job_id, status)
                return
            record_progress(job, "done", {s.stage: s.total for s in job.stages})  # every unit finished
            mark_completed(session, job)
            if mode == "full":
                gate = publication_gate(session, job, table, facts, release_baseline(settings, track))
                open_review(session, job, gate)
        log.info("job %s completed", job_id)

    def _smoke_conformance(self, job_id: str, spec: ParticipantSpec, secret: SecretStr | None) -> bool:
        """Run the conformance battery (aml_ray.conformance) first in a smoke job and store its report.

        Issue 8 / seed workflow: a smoke whose required checks fail stops there, with the failing
        checks as its error summary.

        Returns:
            True when every required check passed and the evaluation may start.
        """
        from aml_ray.conformance.runner import exit_code, run_checks_sync, summary

        results = run_checks_sync(spec)
        report = {"summary": summary(results), "checks": [r.to_dict() for r in results]}
        report = json.loads(redact(json.dumps(report), secret))
        with self.service.sessions.begin() as session:
            get_job(session, job_id).conformance = report
        if exit_code(results) == 0:
            return True
        failing = [f"{r.name} [{r.field}]: {r.message}" for r in results if r.blocking]
        self._fail(job_id, redact("conformance checks failed: " + "; ".join(failing), secret))
        return False

    def _fail(self, job_id: str, summary: str) -> None:
        with self.service.sessions.begin() as session:
            mark_failed(get_job(session, job_id), summary)

    def _participant(self, session, version: Version) -> tuple[ParticipantSpec, SecretStr | None]:
        allow = self.service.settings.allow_loopback
        for url in (version.add_url, version.search_url, version.health_url):
            if url:
                validate_endpoint_url(url, allow_loopback=allow)
        secret = load_secret(session, self.service.box, version.credential_id) if version.credential_id else None
        spec = ParticipantSpec(add_url=version.add_url, search_url=version.search_url, health_url=version.health_url,
                               add_status_url=version.add_status_url, auth=version.auth_scheme, secret=secret,
                               max_in_flight=version.max_in_flight, requests_per_s=version.requests_per_s,
                               timeout_s=version.timeout_s)
        return spec, secret
