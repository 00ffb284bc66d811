"""Database URL, engine and session factory, and ``alembic upgrade head`` at start-up.

SQLite by default (``<data dir>/aml.sqlite3``, see :func:`aml_ray.config.data_dir`); PostgreSQL with
``AML_DATABASE_URL=postgresql+psycopg://user@host:5432/db``. An optional ``schema`` puts every table
(and alembic's version table) in one PostgreSQL schema, which tests use to keep runs apart.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, make_url, text
from sqlalchemy.orm import Session, sessionmaker

from aml_ray.config import data_dir

#: Environment variable with the SQLAlchemy URL of the service database.
DATABASE_URL_ENV = "AML_DATABASE_URL"
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
_upgrade_lock = threading.Lock()
#: Pooled SQLite connections kept open (the size of FastAPI's thread pool for sync routes).
SQLITE_POOL_SIZE = 40


def database_url(env: dict[str, str] | None = None) -> str:
    """``AML_DATABASE_URL``, or SQLite at ``<data dir>/aml.sqlite3`` (the folder is created).

    Args:
        env: the environment (default ``os.environ``).

    Returns:
        A SQLAlchemy URL.
    """
    env = os.environ if env is None else env
    url = env.get(DATABASE_URL_ENV)
    if url:
        return url
    path = data_dir() / "aml.sqlite3"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def private_file(path: Path) -> None:
    """Create ``path`` empty with mode 0600 if missing, else set its mode to 0600 (owner read/write only).

    The SQLite file holds hashed keys, encrypted credentials and private results: not world-readable.
    SQLite gives its ``-wal`` and ``-shm`` files the database file's mode.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    os.chmod(path, 0o600)


def make_engine(url: str, *, schema: str | None = None) -> Engine:
    """An engine for ``url``; SQLite gets foreign keys on, WAL, a busy timeout and a 0600 file.

    Args:
        url: a SQLAlchemy URL (``sqlite:///path`` or ``postgresql+psycopg://...``).
        schema: PostgreSQL only: the schema to create (if missing) and put first on ``search_path``.

    Returns:
        The engine.

    Raises:
        ValueError: ``schema`` given for a non-PostgreSQL URL, or not a plain identifier.
    """
    if url.startswith("sqlite"):
        if schema:
            raise ValueError("schema= is only supported on PostgreSQL")
        database = make_url(url).database
        pool = {}
        if database and database != ":memory:":
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
            private_file(Path(database).expanduser())
            # one pooled connection per request thread (FastAPI runs sync routes on 40 threads): a smaller
            # pool reopened a connection for most requests under concurrent reads (measured, load drill)
            pool = {"pool_size": SQLITE_POOL_SIZE, "max_overflow": 10}
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, **pool)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.close()

        return engine
    connect_args = {}
    if schema:
        if not schema.replace("_", "").isalnum():
            raise ValueError(f"schema must be letters, digits and '_', got {schema!r}")
        connect_args["options"] = f"-csearch_path={schema}"
    engine = create_engine(url, pool_pre_ping=True, connect_args=connect_args)
    if schema:
        with engine.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
    return engine


def alembic_config() -> Config:
    """The alembic configuration pointing at the packaged migrations."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply migrations up to ``revision`` (idempotent; serialised within the process).

    Args:
        engine: the database.
        revision: target revision (default ``head``).
    """
    cfg = alembic_config()
    with _upgrade_lock, engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions that keep loaded attributes after commit (routes read them after the transaction)."""
    return sessionmaker(engine, expire_on_commit=False)
