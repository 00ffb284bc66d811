"""Shared fixtures: one Ray cluster per test session and the dataset paths."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

# pytest-xdist's workers set COLUMNS=80; the command line's consoles take COLUMNS as their width
# (aml_ray.cli_common.console_width) when they are made, at import, and the tests read their output as a
# pipe gives it (120 columns). Removed before any aml_ray module is imported; tests of COLUMNS set it.
os.environ.pop("COLUMNS", None)

from aml_ray.store import make_engine, upgrade  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED_DATASETS = REPO.parent / "shared" / "datasets"
LOCOMO_FILE = SHARED_DATASETS / "locomo" / "locomo10.json"
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"  # the machine's PostgreSQL (trust auth)


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request, tmp_path) -> Iterator[sa.Engine]:
    """A migrated store engine: a SQLite file, and a fresh PostgreSQL schema dropped afterwards."""
    if request.param == "sqlite":
        eng = make_engine(f"sqlite:///{tmp_path / 'aml.sqlite3'}")
        upgrade(eng)
        yield eng
        eng.dispose()
        return
    schema = f"aml_test_{secrets.token_hex(6)}"
    eng = make_engine(PG_URL, schema=schema)
    upgrade(eng)
    try:
        yield eng
    finally:
        eng.dispose()
        cleanup = sa.create_engine(PG_URL)
        with cleanup.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        cleanup.dispose()


@pytest.fixture(scope="session")
def locomo_file() -> Path:
    """The real LoCoMo file from ../shared/datasets (never copied into the repo)."""
    assert LOCOMO_FILE.is_file(), f"{LOCOMO_FILE} is missing: tests read the benchmarks from ../shared/datasets"
    return LOCOMO_FILE


@pytest.fixture(scope="session")
def ray_session(tmp_path_factory) -> Iterator[None]:
    """Ray, started once per test session with 2 CPUs (docs/ray-notes.md: one ray.init per session)."""
    from aml_ray.run.ray_runtime import init_ray, shutdown_ray

    started = init_ray(num_cpus=2)
    yield
    if started:
        shutdown_ray()  # and no worker of the session's cluster outlives it


CHROMIUM = Path(os.environ.get("AML_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]


@pytest.fixture
def browser():
    """A headless Debian Chromium for one test, driven by Playwright (scripts/install_test_deps.sh).

    Per test, not per session: Playwright's sync API keeps an event loop running in the main thread while
    it is open, and every later ``asyncio.run`` in the session (evaluate(), the checks) would then fail
    with "asyncio.run() cannot be called from a running event loop"."""
    from playwright.sync_api import sync_playwright

    assert CHROMIUM.exists(), f"{CHROMIUM} missing: run scripts/install_test_deps.sh (Debian chromium)"
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
