"""The Ray actor a job runs in: detached, so that a job outlives the Serve replica that started it.

One actor per claim of a job (named ``aml-job-<job id>-<attempt>`` in the ``aml`` namespace, 0 CPUs: the
evaluation's Ray Data stages hold the CPUs). It opens its own connection to the store from the service
settings, runs :meth:`aml_ray.serve_app.worker.JobWorker.run_job` under the lease the dispatcher claimed,
renewing it while it runs, then exits (``ray.actor.exit_actor``), so no finished job leaves a process
behind. When the actor dies with its node, nothing renews the lease; once it expires, any replica's
dispatcher claims the job again and a new actor resumes it from its evidence.
"""

from __future__ import annotations

import logging

import ray

log = logging.getLogger("aml_ray.serve_app.job_actor")
#: Namespace of the job actors (a restarted service finds and names them there).
NAMESPACE = "aml"


def actor_name(job_id: str, attempt: int) -> str:
    """The actor name of one claim of a job."""
    return f"aml-job-{job_id}-{attempt}"


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
class JobActor:
    """Runs one claimed job to its end, then exits.

    Args:
        settings: the :class:`aml_ray.serve_app.settings.ServiceSettings` (database URL, master keys, suites).
    """

    def __init__(self, settings):
        from aml_ray.serve_app.app import build_service

        settings.run_worker = False
        self.service = build_service(settings)

    def run(self, job_id: str, owner: str) -> None:
        """Run ``job_id`` as lease ``owner``; the actor exits afterwards (its caller sees the actor's end)."""
        from aml_ray.serve_app.worker import JobWorker

        try:
            JobWorker(self.service).run_job(job_id, owner=owner)
        except Exception:  # a defect, not the participant's: logged here; the job is claimed again after
            log.exception("job %s: runner error", job_id)  # its lease, at most settings.max_attempts times
        finally:
            self.service.engine.dispose()
            ray.actor.exit_actor()
