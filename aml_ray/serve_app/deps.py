"""Shared dependencies: the service container, a DB session per request, the caller's key, the admin."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Header, HTTPException, Request
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from aml_ray.security import SecretBox, tokens_equal
from aml_ray.serve_app.settings import ServiceSettings
from aml_ray.store.keys import find_key
from aml_ray.store.models import LeaderboardKey

if TYPE_CHECKING:
    from aml_ray.serve_app.admission import Admission
    from aml_ray.serve_app.dispatch import JobDispatcher

ADMIN_ACTOR = "admin"


@dataclass
class Service:
    """What the routes share: settings, database, secret box and the job worker.

    Attributes:
        settings: the service settings.
        engine: the database engine.
        sessions: the session factory.
        box: encrypts and decrypts Memory System Keys.
        worker: the replica's job dispatcher (None when ``settings.run_worker`` is off).
        admission: the replica's access-request rate limit and health-check slots.
    """

    settings: ServiceSettings
    engine: Engine
    sessions: sessionmaker[Session]
    box: SecretBox
    worker: JobDispatcher | None = None
    admission: Admission | None = None


def get_service(request: Request) -> Service:
    """The :class:`Service` of the running app."""
    return request.app.state.service


def db_session(service: Annotated[Service, Depends(get_service)]) -> Iterator[Session]:
    """A session for one request: committed when the route returns, rolled back when it raises.

    Used through :data:`SessionDep`, so the commit happens before the response is sent.
    """
    with service.sessions() as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


#: Commit before the response is sent ("function" scope): a client that reads its own write right after
#: a 201 must find it (the default "request" scope commits only after the response went out).
SessionDep = Annotated[Session, Depends(db_session, scope="function")]


def optional_key(session: SessionDep,
                 authorization: Annotated[str | None, Header()] = None) -> LeaderboardKey | None:
    """The caller's key when one is sent; 401 when one is sent but is not valid."""
    if authorization is None:
        return None
    token = _bearer(authorization)
    row = find_key(session, token) if token else None
    if row is None:
        raise HTTPException(401, {"reason": "invalid Leaderboard API key"},
                            headers={"WWW-Authenticate": "Bearer"})
    return row


def current_key(key: Annotated[LeaderboardKey | None, Depends(optional_key)]) -> LeaderboardKey:
    """The caller's Leaderboard API key (``Authorization: Bearer aml_...``); 401 without a valid one."""
    if key is None:
        raise HTTPException(401, {"reason": "a Leaderboard API key is required (Authorization: Bearer aml_...)"},
                            headers={"WWW-Authenticate": "Bearer"})
    return key


def require_admin(service: Annotated[Service, Depends(get_service)],
                  authorization: Annotated[str | None, Header()] = None) -> str:
    """The admin actor name; admin authentication is the separate ``AML_ADMIN_TOKEN``.

    Raises:
        HTTPException: 503 when no admin token is configured, 401 for a missing or wrong token.
    """
    expected = service.settings.admin_token
    if expected is None or not expected.get_secret_value():
        raise HTTPException(503, {"reason": "admin routes are disabled: set AML_ADMIN_TOKEN"})
    token = _bearer(authorization)
    if token is None or not tokens_equal(token, expected.get_secret_value()):
        raise HTTPException(401, {"reason": "admin token required"}, headers={"WWW-Authenticate": "Bearer"})
    return ADMIN_ACTOR


KeyDep = Annotated[LeaderboardKey, Depends(current_key)]
AdminDep = Annotated[str, Depends(require_admin)]
ServiceDep = Annotated[Service, Depends(get_service)]
