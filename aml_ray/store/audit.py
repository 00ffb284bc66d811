"""The admin audit log: every admin action is one row (actor, action, target, secret-free detail)."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from aml_ray.store.models import AdminAction

log = logging.getLogger("aml_ray.admin")


def log_admin_action(session: Session, *, actor: str, action: str, target: str,
                     detail: dict[str, Any] | None = None) -> AdminAction:
    """Record an admin action in the table and the ``aml_ray.admin`` logger.

    Args:
        session: an open session (the row commits with the action itself).
        actor: who acted (``"admin"``).
        action: e.g. ``"access_request.approve"``.
        target: the id acted on.
        detail: extra secret-free facts.

    Returns:
        The row.
    """
    row = AdminAction(actor=actor, action=action, target=target, detail=detail or {})
    session.add(row)
    session.flush()
    log.info("admin action %s on %s by %s", action, target, actor)
    return row


def admin_actions(session: Session, limit: int = 100) -> list[AdminAction]:
    """The latest admin actions, newest first."""
    return list(session.scalars(select(AdminAction).order_by(AdminAction.id.desc()).limit(limit)))
