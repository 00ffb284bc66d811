"""The Ray actor a job runs in: detached, so that a job outlives the Serve replica that started it.

One actor per claim of a job (0 CPUs: its work waits on the participant and the models). It opens its own
connection to the store from the service settings, runs :meth:`aml_ray.serve_app.worker.JobWorker.run_job`
under the lease the dispatcher claimed, renewing it while it runs (the job's Ingest stage, with the models'
stages inside, runs in this process too: :mod:`aml_ray.run.local_ingest`), then exits (``ray.actor.exit_actor``), so
no finished job leaves a process behind. When the actor dies with its node, nothing renews the lease; once
it expires, any replica's dispatcher claims the job again and a new actor resumes it from its evidence.

Standby (a smoke job's first Add within a second or two of its submission): starting a job
actor (a worker process, the service's imports, the store) took 1.3-2.7 s on 2 cores, all before the
job's first request. So each dispatcher keeps one actor started ahead, with no job
(:meth:`aml_ray.serve_app.dispatch.JobDispatcher.turn`), and hands it the next claimed job; it then starts
the next standby. A standby is named ``aml-job-standby-<token>``; an actor started for a claim (no standby
ready, or standby off) ``aml-job-<job id>-<attempt>``; the dispatcher logs which actor runs which job. A
standby whose dispatcher stops pinging it (the replica died) exits after :data:`STANDBY_IDLE_S` seconds,
so a lost replica leaves no process behind.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time

import ray

log = logging.getLogger("aml_ray.serve_app.job_actor")
#: Namespace of the job actors (a restarted service finds and names them there).
NAMESPACE = "aml"
#: Seconds a standby job actor waits without a ping from its dispatcher before it exits.
STANDBY_IDLE_S = 60.0


def actor_name(job_id: str, attempt: int) -> str:
    """The actor name of one claim of a job started for that claim (no standby was ready)."""
    return f"aml-job-{job_id}-{attempt}"


def standby_name() -> str:
    """A fresh name for a standby job actor: ``aml-job-standby-<8 hex digits>``."""
    return f"aml-job-standby-{secrets.token_hex(4)}"


def warm_imports() -> None:
    """Import what a job needs before its first request: the job runner (and through it the evaluation and
    the conformance battery) and Ray Data (the pipeline's), 0.56 s and 0.74 s on 2 cores, measured in a
    fresh process; a standby does it in a thread of its own once started, before it is handed a job."""
    import ray.data  # noqa: F401

    import aml_ray.conformance.runner  # noqa: F401
    import aml_ray.run.pipeline  # noqa: F401
    import aml_ray.serve_app.worker  # noqa: F401


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
class JobActor:
    """Runs one claimed job to its end, then exits.

    Args:
        settings: the :class:`aml_ray.serve_app.settings.ServiceSettings` (database URL, master keys, suites).
        standby_s: a standby (started before its job is known): it exits when :meth:`ping` has not been
            called for this many seconds and no job was handed to it; None for an actor started for a claim.
    """

    def __init__(self, settings, standby_s: float | None = None):
        from aml_ray.serve_app.app import build_service

        settings.run_worker = False
        self.service = build_service(settings)
        self._lock = threading.Lock()
        self._job: str | None = None
        self._pinged = time.monotonic()
        if standby_s:  # the imports go on beside: a job handed over meanwhile waits only for what is left
            threading.Thread(target=warm_imports, name="aml-standby-imports", daemon=True).start()
            threading.Thread(target=self._watch, args=(standby_s,), name="aml-standby-watch", daemon=True).start()

    def ping(self) -> bool:
        """The dispatcher is alive and may still hand this standby a job; returns True."""
        with self._lock:
            self._pinged = time.monotonic()
        return True

    def _watch(self, standby_s: float) -> None:
        while True:
            time.sleep(min(1.0, standby_s / 4))
            with self._lock:
                if self._job is not None:
                    return
                if time.monotonic() - self._pinged > standby_s:
                    self._job = ""  # a run() arriving now finds the actor ending
                    break
        log.info("standby job actor: no ping from its dispatcher for %.0f s, exiting", standby_s)
        self.service.engine.dispose()
        ray.kill(ray.get_runtime_context().current_actor)

    def run(self, job_id: str, owner: str) -> None:
        """Run ``job_id`` as lease ``owner``; the actor exits afterwards (its caller sees the actor's end)."""
        from aml_ray.serve_app.worker import JobWorker

        with self._lock:
            if self._job == "":  # the standby is exiting: the caller sees the actor die, the lease expires
                return
            self._job = job_id
        try:
            JobWorker(self.service).run_job(job_id, owner=owner)
        except Exception:  # a defect, not the participant's: logged here; the job is claimed again after
            log.exception("job %s: runner error", job_id)  # its lease, at most settings.max_attempts times
        finally:
            self.service.engine.dispose()
            ray.actor.exit_actor()
