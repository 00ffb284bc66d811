"""Model-endpoint and participant limits hold across job processes (issue 28: jobs run in their own actors).

Each service job runs in its own detached Ray actor, so two jobs at once are two processes. A model
endpoint's declared in-flight limit (and RPM/TPM) and a participant version's declared capacity belong
to the endpoint and the version, not to one process: every job must go through one client actor per
identity on the whole cluster (:mod:`aml_ray.actors.shared`). Here two Ray actors stand in for two job
actors; each leases the model endpoint's and the participant version's clients and sends its calls at
once. Real loopback servers (their own processes) count what arrives.
"""

from __future__ import annotations

import time

import pytest
import ray

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import ModelEndpoint
from scripts.loopback_servers import ServerProcess
from tests.waits import wait_until_actor_gone

MODEL_LIMIT, PARTICIPANT_LIMIT, CALLS = 2, 3, 12
#: The live job's lease, seconds (renewed every third of it).
LIVE_LEASE_S = 15.0


@ray.remote(num_cpus=0)
class JobProcess:
    """A job actor's part that matters here: lease the shared clients, send a job's calls, release."""

    def ready(self) -> int:
        import os

        return os.getpid()

    def hold(self, spec: ParticipantSpec, job: str, lease_s: float) -> str:
        from aml_ray.actors.shared import acquire_participant_client

        self.lease = acquire_participant_client(spec, job, lease_s=lease_s)
        return self.lease.name

    def release(self) -> bool:
        return self.lease.release()

    def run(self, endpoint: ModelEndpoint, spec: ParticipantSpec, job: str) -> dict:
        from aml_ray.actors.shared import acquire_model_client, acquire_participant_client

        model, participant = acquire_model_client(endpoint, job), acquire_participant_client(spec, job)
        try:
            messages = [[{"role": "user", "content": f"[job:{job}] question {i}"}] for i in range(CALLS)]
            searches = [{"ref": f"{job}-{i}", "request": {"query": "q", "user_id": f"eval:{job}:d:s", "top_k": 5}}
                        for i in range(CALLS)]
            answers, found = ray.get([model.handle.complete_batch.remote(messages, job=job),
                                      participant.handle.search_batch.remote(searches)], timeout=120)
            return {"model": model.name, "participant": participant.name,
                    "ok": [sum(a["status"] == "ok" for a in answers), sum(s["status"] == "ok" for s in found)]}
        finally:
            model.release()
            participant.release()


def test_two_job_processes_together_stay_within_the_endpoints_and_the_versions_declared_limits(ray_session):
    with ServerProcess("model", "--latency-ms", "150", "--tag-regex", r"\[job:([a-z]+)\]") as model, \
            ServerProcess("participant", "--latency-ms", "150", "--capacity", str(PARTICIPANT_LIMIT)) as part:
        endpoint = ModelEndpoint(role="answer", base_url=f"{model.base_url}/v1", model="loopback-model",
                                 max_in_flight=MODEL_LIMIT)
        spec = ParticipantSpec(add_url=f"{part.base_url}/add", search_url=f"{part.base_url}/search",
                               max_in_flight=PARTICIPANT_LIMIT, adaptive_concurrency=False)
        jobs = [JobProcess.remote() for _ in range(2)]
        pids = ray.get([j.ready.remote() for j in jobs], timeout=120)  # both processes up before either sends
        out = ray.get([j.run.remote(endpoint, spec, name) for j, name in zip(jobs, ("alpha", "beta"))], timeout=180)
        model_stats, part_stats = model.stats(), part.stats()
    for j in jobs:
        ray.kill(j)
    assert len(set(pids)) == 2  # two processes, like two job actors
    assert [o["ok"] for o in out] == [[CALLS, CALLS], [CALLS, CALLS]]
    # the two jobs overlapped at the endpoint (each job's first call arrived before the other's last ended)
    calls = model_stats["calls"]
    span = {tag: (min(c[0] for c in calls if c[3] == tag), max(c[1] for c in calls if c[3] == tag))
            for tag in ("alpha", "beta")}
    assert span["alpha"][0] < span["beta"][1] and span["beta"][0] < span["alpha"][1], span
    # together, never more than the endpoint's and the version's declared in-flight limits
    assert model_stats["max_in_flight_by_kind"] == {"answer": MODEL_LIMIT}
    assert part_stats["max_in_flight"] == PARTICIPANT_LIMIT and part_stats["over_capacity"] == 0
    assert part_stats["n"]["search"] == 2 * CALLS
    # one client actor per identity on the cluster, both jobs on it
    assert out[0]["model"] == out[1]["model"] and out[0]["participant"] == out[1]["participant"]


def test_a_dead_job_process_lease_expires_a_live_one_is_renewed_and_the_last_release_closes_the_client(ray_session):
    from aml_ray.actors.shared import NAMESPACE, live_leases

    spec = ParticipantSpec(add_url="http://127.0.0.1:9/add", search_url="http://127.0.0.1:9/search")
    alive, doomed = JobProcess.remote(), JobProcess.remote()
    # the live holder renews every third of its 15 s lease: 10 s of slack for a renewal on a loaded machine;
    # the dead one's 1.5 s lease expires soon after it is killed
    names = ray.get([alive.hold.remote(spec, "alive", LIVE_LEASE_S), doomed.hold.remote(spec, "doomed", 1.5)],
                    timeout=120)
    held_by = time.monotonic()  # both leases were taken before this: the live one's first term ends before held_by + 15
    name = names[0]
    assert names[1] == name and live_leases()[name] == {"alive": 1, "doomed": 1}
    ray.kill(doomed)  # a job actor killed: nothing releases its lease, nothing renews it
    deadline = time.monotonic() + 60
    while "doomed" in live_leases().get(name, {}) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(max(0.0, held_by + LIVE_LEASE_S + 1 - time.monotonic()))  # past its first term: renewals kept it
    assert live_leases()[name] == {"alive": 1}
    assert ray.get(alive.release.remote(), timeout=60) is True  # the last one out closes the client
    assert name not in live_leases()
    wait_until_actor_gone(name, NAMESPACE)
    with pytest.raises(ValueError):
        ray.get_actor(name, namespace=NAMESPACE)
    ray.kill(alive)
