"""Leaderboard keys, systems, versions and encrypted Memory System Keys (credentials)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from aml_ray.security import SecretBox, hash_key, key_display_prefix, new_key
from aml_ray.store.errors import NotFound
from aml_ray.store.models import Credential, LeaderboardKey, System, Version, utcnow


def issue_key(session: Session) -> tuple[LeaderboardKey, str]:
    """Create a Leaderboard API key.

    Args:
        session: an open session.

    Returns:
        ``(row, key)``: the row holds only the hash; ``key`` is the clear key, to be shown once.
    """
    key = new_key()
    row = LeaderboardKey(key_hash=hash_key(key), display_prefix=key_display_prefix(key))
    session.add(row)
    session.flush()
    return row, key


def find_key(session: Session, key: str) -> LeaderboardKey | None:
    """The active key row for a presented key, or None (unknown or revoked)."""
    row = session.scalar(select(LeaderboardKey).where(LeaderboardKey.key_hash == hash_key(key)))
    if row is None or row.revoked_at is not None:
        return None
    return row


def store_credential(session: Session, box: SecretBox, secret: str) -> Credential:
    """Encrypt a Memory System Key and store it.

    Args:
        session: an open session.
        box: the master-key box.
        secret: the key in clear.

    Returns:
        The row; refer to it by ``id`` only.
    """
    row = Credential(ciphertext=box.encrypt(secret))
    session.add(row)
    session.flush()
    return row


def load_secret(session: Session, box: SecretBox, credential_id: str):
    """Decrypt a stored Memory System Key.

    Args:
        session: an open session.
        box: the master-key box.
        credential_id: the opaque id.

    Returns:
        A :class:`pydantic.SecretStr`.

    Raises:
        NotFound: no such credential.
    """
    row = session.get(Credential, credential_id)
    if row is None:
        raise NotFound(f"credential {credential_id} not found")
    return box.decrypt(row.ciphertext)


def rotate_credentials(session: Session, box: SecretBox) -> int:
    """Re-encrypt every credential under the box's current master key.

    Returns:
        How many rows were rotated.
    """
    n = 0
    for row in session.scalars(select(Credential)):
        row.ciphertext = box.rotate(row.ciphertext)
        row.rotated_at = utcnow()
        n += 1
    session.flush()
    return n


def versions_for_key(session: Session, key_id: str) -> list[Version]:
    """The versions bound to a key, oldest first."""
    stmt = (select(Version).join(System).where(System.key_id == key_id).order_by(Version.created_at))
    return list(session.scalars(stmt))


def version_for_key(session: Session, key_id: str, version_id: str) -> Version:
    """A version bound to ``key_id``.

    Raises:
        NotFound: unknown, or bound to another key (indistinguishable on purpose).
    """
    version = session.get(Version, version_id)
    if version is None or version.system.key_id != key_id:
        raise NotFound(f"version {version_id} is not bound to this key")
    return version
