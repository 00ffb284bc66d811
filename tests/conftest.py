"""Shared fixtures: one Ray cluster per test session and the dataset paths."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATASETS = REPO.parent / "shared" / "datasets"
LOCOMO_FILE = SHARED_DATASETS / "locomo" / "locomo10.json"


@pytest.fixture(scope="session")
def locomo_file() -> Path:
    """The real LoCoMo file from ../shared/datasets (never copied into the repo)."""
    assert LOCOMO_FILE.is_file(), f"{LOCOMO_FILE} is missing: tests read the benchmarks from ../shared/datasets"
    return LOCOMO_FILE


@pytest.fixture(scope="session")
def ray_session(tmp_path_factory) -> Iterator[None]:
    """Ray, started once per test session with 2 CPUs (RAY_NOTES.md: one ray.init per session)."""
    import ray

    from aml_ray.ray_runtime import init_ray

    started = init_ray(num_cpus=2)
    yield
    if started:
        ray.shutdown()
