"""The job dispatcher of one Serve replica: claims queued jobs from the database and starts their actors.

Every replica runs one dispatcher thread. Each turn it ends the bookkeeping of actors that finished, renews
the leases of the jobs whose actors it started and that still run (the actor renews them too, so a job
keeps its lease while either is alive),
claims jobs while it runs fewer than ``settings.max_concurrent_jobs`` (:func:`aml_ray.store.queue.claim_job`:
``SELECT ... FOR UPDATE SKIP LOCKED`` on PostgreSQL, a conditional UPDATE on SQLite, so two replicas never
take the same job) and starts a detached :class:`aml_ray.serve_app.job_actor.JobActor` for each. It wakes
when a job is submitted through this replica, else every ``settings.poll_interval_s`` seconds (jobs
submitted through another replica, and jobs whose runner died and whose lease expired, are found then).

It keeps one job actor started ahead (``settings.standby_job_actor``; :mod:`aml_ray.serve_app.job_actor`):
a claimed job goes to that standby, so the job's first request does not wait for a worker process, the
service's imports and the store (1.3-2.7 s on 2 cores), and the next standby starts behind it.

It also runs the evidence purge on its schedule (``settings.purge_interval_s``; :mod:`aml_ray.store.retention`).

Stopping the dispatcher (the replica shuts down) leaves running job actors alone: they finish their job
under their lease. A job whose actor dies is resumed from its evidence by the next claim.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from aml_ray.store.queue import claim_job, renew_lease

log = logging.getLogger("aml_ray.serve_app.dispatch")


class JobDispatcher:
    """Claims jobs and starts one Ray actor per claimed job.

    Args:
        service: the :class:`aml_ray.serve_app.deps.Service`.
        owner_prefix: prefix of this dispatcher's lease owner ids (tests name replicas with it).
    """

    def __init__(self, service, owner_prefix: str = "replica"):
        self.service = service
        self.owner_prefix = owner_prefix
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._running: dict[str, tuple[Any, str]] = {}  # job id -> (ObjectRef of its actor's run, lease owner)
        self._standby: tuple[Any, str, Any] | None = None  # (actor handle, name, its last ping's ObjectRef)
        self.actor_names: dict[str, str] = {}  # job id -> the Ray name of the actor of its latest claim here
        self._last_purge: float | None = None  # the first turn purges
        self.claimed: list[str] = []  # every job id this dispatcher claimed, in order (tests, logs)

    def start(self) -> None:
        """Start the dispatcher thread (it looks at the queue at once)."""
        self._thread = threading.Thread(target=self._loop, name="aml-job-dispatcher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread; job actors keep running; the standby (no job in it) is killed."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        standby, self._standby = self._standby, None
        if standby is not None:
            import ray

            try:
                ray.kill(standby[0])
            except Exception:  # noqa: BLE001 - already gone; an orphan exits by itself (STANDBY_IDLE_S)
                pass

    @property
    def alive(self) -> bool:
        """True while the dispatcher thread runs (started and not stopped)."""
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def submit(self, job_id: str) -> None:
        """A job was queued through this replica: look at the queue now."""
        self._wake.set()

    @property
    def standby(self) -> str | None:
        """The Ray name of the standby job actor (the next claimed job runs in it), or None."""
        return self._standby[1] if self._standby is not None else None

    def running_jobs(self) -> set[str]:
        """Ids of the jobs whose actors this dispatcher started and that have not ended."""
        return set(self._running)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.turn()
            except Exception:  # the dispatcher must survive a database or Ray hiccup
                log.exception("dispatcher turn failed")
            self._wake.wait(self.service.settings.poll_interval_s)
            self._wake.clear()

    def turn(self) -> list[str]:
        """One pass: reap finished actors, claim and start jobs up to the limit, purge when due.

        Returns:
            The ids of the jobs claimed in this pass.
        """
        import ray

        settings = self.service.settings
        if self._running:
            refs = [ref for ref, _ in self._running.values()]
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for job_id in [j for j, (r, _) in self._running.items() if r in done]:
                _log_end(job_id, self._running.pop(job_id)[0])
            # the actors still running hold their lease from here too: an actor's start-up (a new worker
            # process, imports, the store) must not let its claim expire before its own heartbeat starts
            with self.service.sessions.begin() as session:
                for job_id, (_, owner) in self._running.items():
                    renew_lease(session, job_id, owner=owner, lease_s=settings.lease_s)
        claimed = []
        while len(self._running) < settings.max_concurrent_jobs and not self._stop.is_set():
            job_id, attempt, owner = self._claim()
            if job_id is None:
                break
            self._running[job_id] = (self._launch(job_id, attempt, owner), owner)
            claimed.append(job_id)
        self.claimed.extend(claimed)
        if settings.standby_job_actor and not self._stop.is_set():
            self._keep_standby()
        self._maybe_purge()
        return claimed

    def _claim(self) -> tuple[str | None, int, str]:
        from aml_ray.serve_app.worker import new_owner, too_many_attempts
        from aml_ray.store.jobs import mark_failed

        settings = self.service.settings
        owner = new_owner(self.owner_prefix)
        with self.service.sessions.begin() as session:
            job = claim_job(session, owner=owner, lease_s=settings.lease_s)
            while job is not None and job.attempts > settings.max_attempts:
                mark_failed(job, too_many_attempts(job.attempts))
                log.error("job %s: failed after %d claims", job.id, job.attempts)
                job = claim_job(session, owner=owner, lease_s=settings.lease_s)
            if job is None:
                return None, 0, owner
            if job.attempts > 1:
                log.warning("job %s: lease expired, resuming it (claim %d)", job.id, job.attempts)
            return job.id, job.attempts, owner

    def _launch(self, job_id: str, attempt: int, owner: str):
        from aml_ray.serve_app.job_actor import NAMESPACE, JobActor, actor_name

        if self._standby is not None:
            actor, name, _ = self._standby
            self._standby = None
        else:
            name = actor_name(job_id, attempt)
            actor = JobActor.options(name=name, namespace=NAMESPACE, lifetime="detached").remote(self.service.settings)
        self.actor_names[job_id] = name
        log.info("job %s: claim %d runs in actor %s", job_id, attempt, name)
        return actor.run.remote(job_id, owner)

    def _keep_standby(self) -> None:
        """Start a standby job actor if there is none, else ping it (a standby found dead is replaced).

        Never starts Ray for it: without a Ray session in this process (a dispatcher driven by hand) it
        does nothing.
        """
        import ray

        if not ray.is_initialized():
            return

        from aml_ray.serve_app.job_actor import NAMESPACE, STANDBY_IDLE_S, JobActor, standby_name

        if self._standby is not None:
            actor, name, ping = self._standby
            done, _ = ray.wait([ping], timeout=0)
            if not done:  # still starting, or busy answering: ask again next turn
                return
            try:
                ray.get(ping)
                self._standby = (actor, name, actor.ping.remote())
                return
            except Exception as exc:  # noqa: BLE001 - it died (killed, node lost): start another
                log.warning("standby job actor %s is gone (%s); starting another", name, type(exc).__name__)
        name = standby_name()
        actor = JobActor.options(name=name, namespace=NAMESPACE, lifetime="detached").remote(
            self.service.settings, standby_s=STANDBY_IDLE_S)
        self._standby = (actor, name, actor.ping.remote())

    def _maybe_purge(self) -> None:
        settings = self.service.settings
        if not settings.purge_interval_s or (
                self._last_purge is not None and time.monotonic() - self._last_purge < settings.purge_interval_s):
            return
        self._last_purge = time.monotonic()
        purge_now(self.service)


def _log_end(job_id: str, ref) -> None:
    """Log how a job actor ended: its own exit is the normal end; anything else (it died, it raised) is logged
    as an error; the job itself is then resumed or failed through its lease."""
    import ray
    from ray.exceptions import ActorDiedError

    try:
        ray.get(ref, timeout=0)
    except ActorDiedError as exc:
        if "exit_actor() is called" not in str(exc):
            log.error("job %s: its actor died: %s", job_id, str(exc).splitlines()[0])
    except Exception as exc:
        log.error("job %s: its actor failed: %s", job_id, exc)


def purge_now(service) -> int:
    """Purge the evidence of jobs finished more than ``settings.retention_days`` ago (the scheduled purge).

    Returns:
        How many jobs' evidence was removed.
    """
    from pathlib import Path

    from aml_ray.store.retention import purge_evidence

    settings = service.settings
    items = list(purge_evidence(service.sessions, Path(settings.runs_dir), older_than_days=settings.retention_days))
    removed = sum(1 for item in items if not item.skipped)
    if items:
        log.info("scheduled purge: evidence of %d job(s) removed, %d skipped", removed, len(items) - removed)
    return removed
