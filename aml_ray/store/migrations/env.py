"""Alembic environment: migrations run on the connection the caller passes in ``config.attributes``.

:func:`aml_ray.store.engine.upgrade` calls ``alembic upgrade head`` programmatically at start-up;
``render_as_batch`` lets the same revisions alter tables on SQLite.
"""

from __future__ import annotations

from alembic import context

from aml_ray.store.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    """Run the migrations on ``config.attributes["connection"]``."""
    connection = config.attributes.get("connection")
    if connection is None:
        raise RuntimeError("aml_ray migrations run through aml_ray.store.engine.upgrade(engine), which "
                           "passes the connection; the alembic command line is not configured")
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=connection.dialect.name == "sqlite", compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("offline (SQL script) migrations are not supported")
run_migrations_online()
