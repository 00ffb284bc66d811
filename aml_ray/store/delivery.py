"""Delivery of an access request's outcome to its submitter: a one-time status token, and the issued key.

Issue 28 (7): the submitter, not only the admin, receives the Leaderboard API key. At submission the
request gets a status token (``amls_`` + 256 random bits), returned once in the 201 response; only its
sha256 is stored. When a ``new_key`` request is approved, the new key is kept encrypted with the
platform master key (:class:`aml_ray.security.SecretBox`) beside the token hash; the first status read
with the token after approval decrypts it, returns it and erases the ciphertext, so it is shown once.
Seed ("Data, security & privacy"): secrets are stored encrypted and never put in URLs, so the token is
sent in a request body, never in a link.
"""

from __future__ import annotations

import secrets
from datetime import datetime

from pydantic import SecretStr
from sqlalchemy import ForeignKey, String, Text, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from aml_ray.security import SecretBox, hash_key
from aml_ray.store.models import AccessRequest, Base, utcnow

#: Prefix of a status token (tells it apart from an ``aml_`` Leaderboard API key).
STATUS_TOKEN_PREFIX = "amls_"


class AccessRequestDelivery(Base):
    """The submitter's channel of one access request: the status token's hash and the held key."""

    __tablename__ = "access_request_delivery"
    request_id: Mapped[str] = mapped_column(ForeignKey("access_requests.id"), primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    #: Fernet token of the issued Leaderboard API key until the submitter has read it, then None
    key_ciphertext: Mapped[str | None] = mapped_column(Text)
    key_delivered_at: Mapped[datetime | None] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


def issue_status_token(session: Session, request: AccessRequest) -> str:
    """Create the request's status token.

    Args:
        session: an open session.
        request: the stored (flushed) request.

    Returns:
        The token in clear (``amls_`` + 43 URL-safe characters); only its sha256 is stored.
    """
    token = STATUS_TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(AccessRequestDelivery(request_id=request.id, token_hash=hash_key(token)))
    session.flush()
    return token


def request_for_token(session: Session, token: str) -> tuple[AccessRequest, AccessRequestDelivery] | None:
    """The request a status token belongs to, or None for an unknown token."""
    if not token.startswith(STATUS_TOKEN_PREFIX):
        return None
    delivery = session.scalar(select(AccessRequestDelivery).where(AccessRequestDelivery.token_hash == hash_key(token)))
    if delivery is None:
        return None
    return session.get(AccessRequest, delivery.request_id), delivery


def hold_issued_key(session: Session, box: SecretBox, request_id: str, key: str) -> bool:
    """Keep a just-issued key, encrypted, for the submitter's next status read.

    Returns:
        False when the request has no status token (made before tokens existed): nothing is held.
    """
    delivery = session.get(AccessRequestDelivery, request_id)
    if delivery is None:
        return False
    delivery.key_ciphertext = box.encrypt(key)
    session.flush()
    return True


def take_issued_key(session: Session, box: SecretBox, delivery: AccessRequestDelivery) -> SecretStr | None:
    """The held key, once: decrypted, then erased from the store.

    Returns:
        The key, or None when none is held (not approved yet, an ``add_version`` request, or already read).
    """
    if delivery.key_ciphertext is None:
        return None
    key = box.decrypt(delivery.key_ciphertext)
    delivery.key_ciphertext, delivery.key_delivered_at = None, utcnow()
    session.flush()
    return key
