"""The service store: SQLAlchemy 2 models, the engine with alembic migrations, and queries by table group."""

from aml_ray.store.engine import database_url, make_engine, session_factory, upgrade
from aml_ray.store.models import Base

__all__ = ["Base", "database_url", "make_engine", "session_factory", "upgrade"]
