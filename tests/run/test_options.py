"""The pipeline's throughput knobs (:mod:`aml_ray.run.options`): what each picks for a given endpoint."""

from __future__ import annotations

import doctest

import pytest

from aml_ray.config import ModelEndpoint
from aml_ray.run import options
from aml_ray.run.options import PipelineOptions


def endpoint(max_in_flight: int, base_url: str | None = "http://127.0.0.1:9/v1") -> ModelEndpoint:
    return ModelEndpoint(role="answer", base_url=base_url, model="m", max_in_flight=max_in_flight)


def test_the_module_examples_hold():
    assert doctest.testmod(options).failed == 0


@pytest.mark.parametrize(("max_in_flight", "batch", "tasks"), [(32, 64, 4), (8, 16, 4), (4, 16, 2), (128, 256, 4),
                                                                (256, 256, 8)])
def test_the_model_stage_holds_eight_rounds_of_an_online_endpoints_concurrency(max_in_flight, batch, tasks):
    """Batch rows x tasks covers 8 x max_in_flight (at least 2 tasks, at most batches_in_flight): with 4
    rounds (2 tasks at 32 in flight) the answer model sat at half its budget while the judge model was at its
    limit and the tasks' answered rows waited for it."""
    opts = PipelineOptions()
    ep = endpoint(max_in_flight)
    assert (opts.model_batch_for(ep), opts.model_tasks_for(ep)) == (batch, tasks)


def test_an_offline_endpoint_runs_batches_in_flight_tasks_of_the_offline_batch():
    opts = PipelineOptions(batches_in_flight=5)
    ep = endpoint(32, base_url=None)
    assert (opts.model_batch_for(ep), opts.model_tasks_for(ep)) == (options.OFFLINE_BATCH, 5)
