"""aml_ray.run._ray_internals: the system config of the clusters aml-ray starts holds for the pinned Ray, a
change of Ray fails loudly naming what to check, and the config is applied (workers at the driver's
priority)."""

from __future__ import annotations

import os

import ray

from aml_ray.run import _ray_internals
from aml_ray.run._ray_internals import (NODE_START_TIMEOUT, PINNED_RAY_VERSION, SYSTEM_CONFIG, node_start_timed_out,
                                       version_mismatch)


def test_the_installed_ray_is_the_one_the_system_config_was_checked_against():
    assert version_mismatch(ray.__version__) is None, version_mismatch(ray.__version__)


def test_another_ray_is_named_with_every_key_to_check():
    said = version_mismatch("9.99.0")
    assert said is not None and "aml_ray.run._ray_internals.SYSTEM_CONFIG" in said
    assert PINNED_RAY_VERSION in said and "9.99.0" in said
    assert all(key in said for key in SYSTEM_CONFIG) and "NODE_START_TIMEOUT" in said


def test_the_node_start_timeout_is_recognised_by_the_words_of_the_installed_ray():
    """``ray.init`` raises a plain ``Exception`` whose text is in ``ray/_private/node.py``; a Ray that words it
    otherwise makes :func:`aml_ray.run.ray_runtime.init_ray` stop retrying, so this fails first."""
    from pathlib import Path

    source = (Path(ray.__file__).parent / "_private" / "node.py").read_text()
    assert f'"{NODE_START_TIMEOUT}. This "' in source
    assert node_start_timed_out(Exception(f"{NODE_START_TIMEOUT}. This could happen because ..."))
    assert not node_start_timed_out(RuntimeError(f"{NODE_START_TIMEOUT}."))
    assert not node_start_timed_out(Exception("The node with node id: 1 and address: 2 has been marked dead"))


def test_the_pin_is_the_projects_pin():
    pyproject = (_ray_internals.__file__.rsplit("/aml_ray/", 1)[0] + "/pyproject.toml")
    assert f'"ray[data,serve]=={PINNED_RAY_VERSION}"' in open(pyproject).read()


def test_workers_of_a_cluster_started_here_run_at_the_drivers_priority(ray_session):
    """Ray starts workers at nice 15 by default; ``worker_niceness: 0`` runs them at nice 0, so an actor's
    timings do not depend on the scheduler, nor on the process's right to lower its niceness."""

    @ray.remote(num_cpus=0)
    def niceness() -> int:
        return os.nice(0)

    assert ray.get(niceness.remote(), timeout=120) == os.nice(0) == 0
