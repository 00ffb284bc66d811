"""Signed cookies for the HTML pages: who verified which Leaderboard API key, and the admin's sign-in.

The pages are server-rendered forms, so the key or admin token a person types is sent once, in a POST
body; the server answers with a cookie that names only the key's *id* (or "admin"), signed with
itsdangerous (HMAC-SHA1 over a secret derived from the current master key) and time-stamped. The cookie
holds no credential usable on the API, is ``HttpOnly`` and ``SameSite=Strict`` (a cross-site form cannot
send it, which is what protects the pages' POST forms), and is scoped to its pages' path. A revoked key,
a changed admin token or a rotated master key ends every session at the next request.
"""

from __future__ import annotations

import hashlib

from fastapi import Request, Response
from itsdangerous import BadSignature, URLSafeTimedSerializer

from aml_ray.serve_app.deps import Service
from aml_ray.store.models import LeaderboardKey

#: Participant page session: cookie name, path, lifetime (seconds).
KEY_COOKIE, KEY_PATH, KEY_MAX_AGE_S = "aml_eval", "/evaluate", 8 * 3600
#: Admin page session: cookie name, path, lifetime (seconds).
ADMIN_COOKIE, ADMIN_PATH, ADMIN_MAX_AGE_S = "aml_admin", "/admin", 2 * 3600


def _serializer(service: Service, purpose: str) -> URLSafeTimedSerializer:
    master = service.settings.master_keys[0].get_secret_value().encode()
    secret = hashlib.sha256(b"aml-ray page session\0" + master).hexdigest()
    return URLSafeTimedSerializer(secret, salt=f"aml-ray.{purpose}")


def _set(response: Response, request: Request, name: str, value: str, path: str, max_age: int) -> None:
    response.set_cookie(name, value, max_age=max_age, path=path, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")


def _read(request: Request, service: Service, name: str, purpose: str, max_age: int):
    raw = request.cookies.get(name)
    if not raw:
        return None
    try:
        return _serializer(service, purpose).loads(raw, max_age=max_age)
    except BadSignature:  # includes SignatureExpired
        return None


def start_key_session(response: Response, request: Request, service: Service, key: LeaderboardKey) -> None:
    """Remember a verified key on the participant's pages (the cookie holds the key id, not the key)."""
    value = _serializer(service, "key").dumps({"key_id": key.id})
    _set(response, request, KEY_COOKIE, value, KEY_PATH, KEY_MAX_AGE_S)


def session_key_id(request: Request, service: Service) -> str | None:
    """The key id of the participant's page session, or None (no cookie, bad signature, expired)."""
    data = _read(request, service, KEY_COOKIE, "key", KEY_MAX_AGE_S)
    return data.get("key_id") if isinstance(data, dict) else None


def _admin_tag(service: Service) -> str | None:
    token = service.settings.admin_token
    if token is None or not token.get_secret_value():
        return None
    return hashlib.sha256(b"aml-ray admin tag\0" + token.get_secret_value().encode()).hexdigest()[:16]


def start_admin_session(response: Response, request: Request, service: Service) -> None:
    """Remember the admin's sign-in (bound to the current admin token by a hash tag)."""
    value = _serializer(service, "admin").dumps({"admin": _admin_tag(service)})
    _set(response, request, ADMIN_COOKIE, value, ADMIN_PATH, ADMIN_MAX_AGE_S)


def is_admin_session(request: Request, service: Service) -> bool:
    """True when the request carries a valid admin page session for the configured admin token."""
    tag = _admin_tag(service)
    data = _read(request, service, ADMIN_COOKIE, "admin", ADMIN_MAX_AGE_S)
    return tag is not None and isinstance(data, dict) and data.get("admin") == tag


def end_session(response: Response, name: str, path: str) -> None:
    """Delete a page-session cookie."""
    response.delete_cookie(name, path=path)
