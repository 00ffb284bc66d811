"""aml_ray.run.pipeline's leases of the cluster's shared actors: what every job needs (the progress hub, the
model clients) first, the participant version's client last; a lease that fails to come releases the others."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

import aml_ray.actors.shared as shared
from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import ModelEndpoint
from aml_ray.reference.server import ReferenceServer
from aml_ray.run.evaluation import EvaluationConfig, evaluate
from tests.fake_openai import FakeOpenAI, Reply
from tests.servers import ThreadServer

pytestmark = pytest.mark.usefixtures("ray_session")


def _reply(prompt: str, n: int) -> Reply:
    """A judge's CORRECT verdict to a grading prompt, an answer to any other."""
    return Reply('{"label": "correct"}' if prompt.startswith("You are grading") else "An answer")


def _config(tmp_path, ref, base: str, job: str, locomo_file) -> EvaluationConfig:
    answer = ModelEndpoint(role="answer", base_url=base, model="gpt-4o-mini", api_key=SecretStr("sk-a"))
    judge = ModelEndpoint(role="judge", base_url=base, model="judge-model", api_key=SecretStr("sk-j"))
    return EvaluationConfig(dataset="locomo", participant=ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url),
                            answer=answer, judge=judge, out_dir=tmp_path / "run", data_path=locomo_file,
                            limit_samples=1, run_id=job)


def test_the_shared_actors_are_leased_before_the_participants_client(tmp_path, locomo_file, monkeypatch):
    """The raylet starts worker processes in the order they are asked for: a job leases the hub and the
    model clients, which every job needs, before its participant version's client, so jobs that start at
    once do not all wait behind every job's participant client."""
    kinds: list[str] = []
    acquire = shared._acquire

    def recorded(kind, *args, **kwargs):
        kinds.append(kind)
        return acquire(kind, *args, **kwargs)

    monkeypatch.setattr(shared, "_acquire", recorded)
    with ThreadServer(FakeOpenAI(_reply).app) as http, \
            ReferenceServer(tmp_path / "ref") as ref:
        result = evaluate(_config(tmp_path, ref, f"{http.base_url}/v1", "job-order", locomo_file))
    assert result.run_info["status"] == "completed"
    assert kinds == ["progress", "model", "model", "participant"]


def test_a_lease_that_fails_releases_the_leases_taken_before_it(tmp_path, locomo_file, monkeypatch):
    """The judge's client cannot be leased: the run fails with that error, and the job holds no lease on the
    cluster (the hub's and the answer model's are given back at once, not left to be renewed)."""
    def refused(endpoint, job, **kwargs):
        if endpoint.role == "judge":
            raise RuntimeError("the judge's client could not be leased")
        return shared._acquire("model", shared.model_endpoint_key(endpoint), endpoint, job, shared.LEASE_S,
                               kwargs.get("private", False))

    import aml_ray.run.pipeline as pipeline

    monkeypatch.setattr(pipeline, "acquire_model_client", refused)
    with ThreadServer(FakeOpenAI(_reply).app) as http, \
            ReferenceServer(tmp_path / "ref") as ref:
        with pytest.raises(RuntimeError, match="the judge's client could not be leased"):
            evaluate(_config(tmp_path, ref, f"{http.base_url}/v1", "job-refused", locomo_file))
    held = {name: jobs for name, jobs in shared.live_leases().items() if any(j.startswith("job-refused/") for j in jobs)}
    assert held == {}
    assert not [lease for lease in shared._held.values() if lease.job.startswith("job-refused/")]
