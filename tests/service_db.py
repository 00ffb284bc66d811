"""Service settings on either store the service supports: a SQLite file or a fresh PostgreSQL schema."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from cryptography.fernet import Fernet
from pydantic import SecretStr

from aml_ray.serve_app.settings import ServiceSettings
from tests.conftest import PG_URL, SHARED_DATASETS
from tests.service_suites import locomo_only_suite

DATABASES = ("sqlite", "postgresql")


@contextmanager
def settings_on(database: str, tmp_path: Path, admin_token: str, **over) -> Iterator[ServiceSettings]:
    """Settings without the job worker on ``database`` (``sqlite`` | ``postgresql``); a PostgreSQL schema
    made for them is dropped on exit. ``over`` sets further fields."""
    schema = None
    url = f"sqlite:///{tmp_path / 'aml.sqlite3'}"
    if database == "postgresql":
        schema, url = f"aml_svc_{secrets.token_hex(6)}", PG_URL
    settings = ServiceSettings(database_url=url, db_schema=schema,
                               master_keys=[SecretStr(Fernet.generate_key().decode())],
                               admin_token=SecretStr(admin_token), allow_loopback=True, run_worker=False,
                               runs_dir=tmp_path / "runs", datasets_dir=SHARED_DATASETS,
                               suites={"textual": locomo_only_suite()})
    for name, value in over.items():
        setattr(settings, name, value)
    try:
        yield settings
    finally:
        if schema:
            cleanup = sa.create_engine(PG_URL)
            with cleanup.begin() as conn:
                conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
            cleanup.dispose()
