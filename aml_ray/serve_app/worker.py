"""Running one job: the code a job's Ray actor executes (:mod:`aml_ray.serve_app.job_actor`).

:meth:`JobWorker.run_job` claims the job in the database queue (or checks that the dispatcher's claim is
still its own, :mod:`aml_ray.store.queue`), renews the lease from a heartbeat thread while it runs, and
runs the track's suite bundle by bundle (:func:`aml_ray.serve_app.tracks.job_bundles`), each into
``<run dir>/<bundle>`` with :func:`aml_ray.run.evaluation.evaluate`. A claim after an expired lease (the
previous runner died: node lost, process killed) is a resumption: a bundle whose run.json says
``completed`` is read back from its results.json, a bundle with an unfinished run.json is resumed from its
evidence (``resume``: same run_id, finished Adds and questions skipped), so the job ends with the result an
uninterrupted run would have had. A Coding job runs the track's task file instead
(:mod:`aml_ray.serve_app.coding_jobs`): CAMBench's conditions in the sandbox, its own headline and gate.

For each job the runner re-validates the version's endpoints (DNS may have changed since submission) and
pins the checked addresses into the spec (the participant client connects only to them, never resolving
a name again: :class:`aml_ray.security.PinnedResolver`), decrypts the Memory System Key into the
in-memory ``ParticipantSpec`` only, stores the result and, for a full job, opens its review with the
publication gate. Error summaries are redacted: the decrypted secret is replaced wherever it could appear. A runner that lost its lease writes nothing more.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.security import EndpointRejected, pin_map, validate_endpoint_url
from aml_ray.serve_app.gate import publication_gate, release_baseline, run_facts, suite_facts
from aml_ray.serve_app.tracks import JobBundle, MissingBundles, NoSuite, job_bundles, track_suite
from aml_ray.store import bundles as bundle_entries
from aml_ray.store.bundles import failure_summary
from aml_ray.store.jobs import get_job, mark_completed, mark_failed, mark_running, record_progress
from aml_ray.store.keys import load_secret
from aml_ray.store.models import Version
from aml_ray.store.queue import claim_job, owns, renew_lease
from aml_ray.store.results import open_review, save_result

log = logging.getLogger("aml_ray.serve_app.worker")
#: Seconds between progress writes to the database (totals and the final snapshot are always written).
PROGRESS_INTERVAL_S = 0.5


def redact(text: str, secret: SecretStr | None) -> str:
    """``text`` with the secret's value replaced by ``***``."""
    if secret is not None and secret.get_secret_value():
        text = text.replace(secret.get_secret_value(), "***")
    return text


def new_owner(prefix: str = "run") -> str:
    """A lease owner id: ``<prefix>-`` + 16 random characters (at most 64 characters in all)."""
    return f"{prefix[:40]}-{secrets.token_urlsafe(12)}"


def too_many_attempts(attempts: int) -> str:
    """The error summary of a job whose runner died at every claim."""
    return f"interrupted {attempts - 1} times (its runner died each time); start a new job"


class LeaseLost(RuntimeError):
    """Another runner holds the job now (this one's lease expired): stop without writing."""


class _Heartbeat:
    """Renews ``owner``'s lease every third of ``lease_s`` until stopped; ``lost`` is set when it cannot."""

    def __init__(self, sessions, job_id: str, owner: str, lease_s: float):
        self.sessions, self.job_id, self.owner, self.lease_s = sessions, job_id, owner, lease_s
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"aml-lease-{job_id}", daemon=True)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                with self.sessions.begin() as session:
                    if not renew_lease(session, self.job_id, owner=self.owner, lease_s=self.lease_s):
                        self.lost.set()
                        return
            except Exception:  # a database hiccup: try again next beat; the lease covers two misses
                log.warning("job %s: lease renewal failed", self.job_id, exc_info=True)


class JobWorker:
    """Runs jobs of the service, one :meth:`run_job` call per job.

    Args:
        service: the :class:`aml_ray.serve_app.deps.Service` (settings, sessions, secret box).
    """

    def __init__(self, service):
        self.service = service

    def run_job(self, job_id: str, owner: str | None = None) -> None:
        """Claim (or hold) ``job_id``'s lease and run it to completion, failure or partial end.

        Args:
            job_id: the job.
            owner: the lease owner the dispatcher claimed it as; None claims it here (a queued job, or a
                running one whose lease expired). A job this caller cannot claim or no longer owns is left alone.
        """
        settings, sessions = self.service.settings, self.service.sessions
        with sessions.begin() as session:
            if owner is None:
                owner = new_owner()
                if claim_job(session, owner=owner, lease_s=settings.lease_s, job_id=job_id) is None:
                    return
            elif not renew_lease(session, job_id, owner=owner, lease_s=settings.lease_s):  # renewed at once:
                return  # the claim may be seconds old (actor start-up); a lost one is left to its new owner
            job = get_job(session, job_id)
            if job.attempts > settings.max_attempts:
                mark_failed(job, too_many_attempts(job.attempts))
                return
        with _Heartbeat(sessions, job_id, owner, settings.lease_s) as beat:
            try:
                self._run(job_id, owner, beat)
            except LeaseLost:
                log.warning("job %s: lease lost to another runner; this runner stops", job_id)

    def _run(self, job_id: str, owner: str, beat: _Heartbeat) -> None:
        from aml_ray.run.suite_run import BundleOutcome, not_run, ran

        settings, sessions = self.service.settings, self.service.sessions
        secret: SecretStr | None = None
        with sessions.begin() as session:
            job = get_job(session, job_id)
            version = session.get(Version, job.version_id)
            label = f"{version.system.name}/{version.label}"
            try:
                spec, secret = self._participant(session, version)
            except EndpointRejected as exc:
                mark_failed(job, f"endpoint rejected at job start: {exc}")
                return
            run_dir = Path(job.run_dir or Path(settings.runs_dir) / job.id)
            resuming = job.attempts > 1
            if not resuming:
                mark_running(job, str(run_dir))
            mode, track, run_label, conformance_done = job.mode, job.track, job.run_label, job.conformance is not None
        try:
            bundles = job_bundles(settings, track, mode)
        except (NoSuite, MissingBundles) as exc:
            log.error("job %s: %s", job_id, exc)
            self._fail(job_id, owner, str(exc))
            return
        if mode == "smoke" and not (resuming and conformance_done) and \
                not self._smoke_conformance(job_id, owner, spec, secret):
            return
        if track == "coding":
            self._coding(job_id, owner, bundles[0], run_dir, spec, secret, mode, run_label, label)
            return
        suite = track_suite(settings, track)
        progress = _Progress(sessions, job_id, bundles)
        runs: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []
        names: list[str] = []  # of the bundles in ``runs``
        for bundle in bundles:  # one bundle's failure is that bundle's outcome: the next bundle runs
            if beat.lost.is_set():
                raise LeaseLost(job_id)
            outcome = BundleOutcome(bundle.name, bundle.dataset, suite.bundle(bundle.name).title, "running")
            progress.start(outcome)
            try:
                rows, info, result = self._bundle(bundle, run_dir / bundle.name, spec, mode, track, run_label,
                                                  label, progress)
            except LeaseLost:
                raise
            except Exception as exc:  # stopped, dataset refused, Ray failure...: the cause, secret redacted
                log.error("job %s: bundle %s failed", job_id, bundle.name)
                not_run(outcome, exc, log_traceback=False)
                outcome.reason = redact(outcome.reason or "", secret)
                progress.ended(outcome)
                continue
            if result is not None:
                ran(outcome, suite, suite.bundle(bundle.name), result)
            else:  # read back from an earlier attempt: the dataset row of its results
                row = next((r for r in rows if r.get("category") == "overall"), {})
                outcome.status, outcome.score, outcome.coverage = "ran", row.get("accuracy"), row.get("coverage")
                outcome.n_total, outcome.n_scored = row.get("n_total", 0), row.get("n_scored", 0)
            progress.ended(outcome, info)
            runs.append((rows, info))
            names.append(bundle.name)
        if not runs:
            self._fail(job_id, owner, redact(failure_summary(progress.entries), secret))
            return
        table = [row for rows, _ in runs for row in rows]
        facts = suite_facts([run_facts(info) for _, info in runs], suite=f"{suite.name}@{suite.version}")
        unfinished = [(name, info.get("error") or info["status"]) for name, (_, info) in zip(names, runs)
                      if info["status"] != "completed"]  # derived from the evidence (aml_ray.run.outcome)
        partial = [cause if len(bundles) == 1 else f"bundle {name} {cause}" for name, cause in unfinished]
        if len(runs) < len(bundles):
            partial.insert(0, failure_summary(progress.entries))
        self._finish(job_id, owner, table, facts, partial=redact("; ".join(partial), secret) if partial else None,
                     gate=lambda session, job: publication_gate(session, job, table, facts,
                                                                 release_baseline(settings, track)))

    def _finish(self, job_id: str, owner: str, table: list[dict[str, Any]], facts: dict[str, Any], *,
                gate: Callable[[Any, Any], dict[str, Any]], partial: str | None = None,
                summary: tuple[float | None, float | None, dict[str, Any]] | None = None) -> None:
        """Store the result; complete the job and, for a full job, open its review with ``gate(session, job)``;
        or, with ``partial`` (the error summary), end it partial (no review)."""
        with self.service.sessions.begin() as session:
            if not owns(session, job_id, owner):
                raise LeaseLost(job_id)
            job = get_job(session, job_id)
            save_result(session, job, table, facts, summary)
            if partial is not None:
                mark_failed(job, partial, status="partial")
                log.info("job %s ended partial", job_id)
                return
            record_progress(job, "done", {s.stage: s.total for s in job.stages})  # every unit finished
            mark_completed(session, job)
            if job.mode == "full":
                open_review(session, job, gate(session, job))
        log.info("job %s completed", job_id)

    def _coding(self, job_id: str, owner: str, bundle: JobBundle, run_dir: Path, spec: ParticipantSpec,
                secret: SecretStr | None, mode: str, run_label: str, label: str) -> None:
        """Run a Coding job (:mod:`aml_ray.serve_app.coding_jobs`); a host whose sandbox cannot isolate the
        tests fails the job with the sandbox's reason (never a run with less isolation)."""
        from aml_ray.coding.sandbox import SandboxUnavailable
        from aml_ray.run.provenance import pipeline_code_hash
        from aml_ray.serve_app import coding_jobs

        settings = self.service.settings
        progress = _Progress(self.service.sessions, job_id, [])
        code_hash = pipeline_code_hash()
        try:
            rates, info = coding_jobs.run_coding_job(settings, bundle.path, run_dir / bundle.name, spec, mode=mode,
                                                     run_label=run_label, label=label, on_progress=progress.callback)
        except SandboxUnavailable as exc:
            log.error("job %s: %s", job_id, exc)
            self._fail(job_id, owner, f"the Coding sandbox refused to run on this host: {exc}")
            return
        except Exception as exc:  # contract error, participant status, task file refused...: summarised, redacted
            log.error("job %s failed: %s", job_id, type(exc).__name__)
            self._fail(job_id, owner, redact(f"{type(exc).__name__}: {exc}", secret))
            return
        progress.flush()
        limit = settings.smoke_limit_samples if mode == "smoke" else settings.full_limit_samples
        facts = coding_jobs.coding_facts(info, bench_path=bundle.path, limit=limit, pipeline_code_sha256=code_hash)
        self._finish(job_id, owner, rates, facts, summary=coding_jobs.coding_summary(rates, info),
                     gate=lambda session, job: coding_jobs.coding_gate(
                         session, job, facts, coding_jobs.coding_baseline(settings, bundle.path)))

    def _bundle(self, bundle: JobBundle, out_dir: Path, spec: ParticipantSpec, mode: str, track: str,
                run_label: str, label: str, progress: _Progress) -> tuple[list[dict[str, Any]], dict[str, Any], Any]:
        """Run, resume or read back one bundle; returns its (table rows, run.json, :class:`EvaluationResult`),
        the result None when the bundle is read back (it completed before an interruption)."""
        from aml_ray.run.evaluation import EvaluationConfig, evaluate

        settings = self.service.settings
        run_json = out_dir / "run.json"
        if run_json.exists():
            info = json.loads(run_json.read_text())
            if info.get("status") == "completed":  # finished before the interruption: read back, not rerun
                results = json.loads((out_dir / "results.json").read_text())
                progress.totals = _totals_of(info)
                return results["table"], info, None
        cfg = EvaluationConfig(
            dataset=bundle.dataset, participant=spec, answer=settings.model("answer"), judge=settings.model("judge"),
            out_dir=out_dir, data_path=bundle.path, suite=settings.suite_for(track), resume=run_json.exists(),
            limit_samples=settings.smoke_limit_samples if mode == "smoke" else settings.full_limit_samples,
            run_label=run_label, participant_label=label,
            head_start=True)  # one active job per version (store.jobs.create_job): nobody else sends to it
        result = evaluate(cfg, on_progress=progress.callback, num_cpus=settings.num_cpus)
        return result.table.to_dicts(), result.run_info, result

    def _smoke_conformance(self, job_id: str, owner: str, spec: ParticipantSpec, secret: SecretStr | None) -> bool:
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
        self._fail(job_id, owner, redact("conformance checks failed: " + "; ".join(failing), secret))
        return False

    def _fail(self, job_id: str, owner: str, summary: str) -> None:
        with self.service.sessions.begin() as session:
            if owns(session, job_id, owner):
                mark_failed(get_job(session, job_id), summary)

    def _participant(self, session, version: Version) -> tuple[ParticipantSpec, SecretStr | None]:
        allow = self.service.settings.allow_loopback
        # resolved once here and pinned: the client connects to these addresses, never re-resolving (item 9)
        checked = [validate_endpoint_url(url.replace("{task_id}", "task"), allow_loopback=allow)
                   for url in (version.add_url, version.search_url, version.health_url, version.add_status_url) if url]
        secret = load_secret(session, self.service.box, version.credential_id) if version.credential_id else None
        spec = ParticipantSpec(add_url=version.add_url, search_url=version.search_url, health_url=version.health_url,
                               add_status_url=version.add_status_url, auth=version.auth_scheme, secret=secret,
                               max_in_flight=version.max_in_flight, requests_per_s=version.requests_per_s,
                               timeout_s=version.timeout_s, pinned_addresses=pin_map(checked))
        return spec, secret


class _Progress:
    """Progress of a job over its bundles: the stage rows count the finished bundles' units plus the running
    bundle's, and ``Job.bundles`` (:mod:`aml_ray.store.bundles`) keeps each bundle's status and own share.

    A bundle's totals are known when it starts, so the stage rows' totals grow bundle by bundle; the job's
    overall progress is the mean of the bundles' shares, which the next bundle's start never lowers.
    """

    def __init__(self, sessions, job_id: str, bundles: list[JobBundle]):
        """``bundles``: the job's bundles in the order they run (none for a Coding job)."""
        self.sessions, self.job_id = sessions, job_id
        self.entries = bundle_entries.pending(bundles)
        self.base_totals: dict[str, int] = {}
        self.base_done: dict[str, int] = {}
        self.totals: dict[str, int] = {}
        self.latest: dict[str, int] = {}
        self.current = -1
        self._last_write = 0.0

    def _sum(self, base: dict[str, int], current: dict[str, int]) -> dict[str, int]:
        keys = set(base) | set(current)
        return {k: base.get(k, 0) + current.get(k, 0) for k in keys}

    def start(self, outcome) -> None:
        """The bundle ``outcome`` names (status ``running``) starts."""
        self.current = next(i for i, e in enumerate(self.entries) if e["name"] == outcome.name)
        self.entries[self.current].update(status="running", title=outcome.title, progress=0.0)
        self.totals, self.latest = {}, {}
        self._write(None, {})

    def callback(self, kind: str, values: dict[str, int]) -> None:
        """The ``on_progress`` of :func:`aml_ray.run.evaluation.evaluate` for the running bundle."""
        now = time.monotonic()
        if kind == "totals":
            self.totals = dict(values)
            self._write("totals", self._sum(self.base_totals, self.totals))
            self._last_write = now
            return
        self.latest.update(values)
        if now - self._last_write >= PROGRESS_INTERVAL_S:
            self._last_write = now
            self._write("done", self._sum(self.base_done, self.latest))

    def ended(self, outcome, info: dict[str, Any] | None = None) -> None:
        """Fold the running bundle into the base and record its outcome (a
        :class:`aml_ray.run.suite_run.BundleOutcome`). A bundle that ran counts its totals as done (``info``,
        its run.json, gives them when it was read back); one that failed keeps the units it finished."""
        totals = self.totals or (_totals_of(info) if info else {})
        self.base_totals = self._sum(self.base_totals, totals)
        done = {**self.latest, **totals} if outcome.status == "ran" else self.latest
        self.base_done = self._sum(self.base_done, done)
        entry = self.entries[self.current]
        described = outcome.describe()
        entry.update({k: described.get(k) for k in bundle_entries.OUTCOME_FIELDS if k in described})
        entry["progress"] = 1.0 if outcome.status == "ran" else bundle_entries.share_done(totals, self.latest)
        self.totals, self.latest = {}, {}
        self._write("totals", self.base_totals)
        self._write("done", self.base_done)

    def flush(self) -> None:
        """Write the newest counts of the running bundle (a Coding job's one run, when it ends)."""
        if self.latest:
            self._write("done", self._sum(self.base_done, self.latest))

    def _write(self, kind: str | None, values: dict[str, int]) -> None:
        if self.current >= 0 and self.entries[self.current]["status"] == "running":
            self.entries[self.current]["progress"] = bundle_entries.share_done(self.totals, self.latest)
        with self.sessions.begin() as s:
            job = get_job(s, self.job_id)
            if kind is not None:
                record_progress(job, kind, values)
            if self.entries:
                job.bundles = [dict(e) for e in self.entries]  # a new list: the JSON column is written


def _totals_of(info: dict[str, Any]) -> dict[str, int]:
    ds = info["dataset"]
    model_total = 0 if info.get("retrieval_only") else ds["scorable_questions"]
    return {"add": ds["chunks"], "search": ds["scorable_questions"], "answer": model_total, "judge": model_total}
