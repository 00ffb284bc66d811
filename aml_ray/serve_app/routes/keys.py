"""``GET /api/keys/me``: verify a Leaderboard API key and list the versions bound to it."""

from __future__ import annotations

from fastapi import APIRouter

from aml_ray.serve_app.deps import KeyDep, SessionDep
from aml_ray.serve_app.schemas import KeyOut, VersionOut
from aml_ray.store.keys import versions_for_key
from aml_ray.store.models import Version

router = APIRouter(prefix="/api/keys", tags=["keys"])


def version_out(v: Version) -> VersionOut:
    """A version as its key sees it (the credential only as a flag)."""
    return VersionOut(id=v.id, system_name=v.system.name, label=v.label, track=v.track,
                      division=v.system.division, add_url=v.add_url, search_url=v.search_url,
                      health_url=v.health_url, auth_scheme=v.auth_scheme,
                      has_memory_system_key=v.credential_id is not None, max_in_flight=v.max_in_flight,
                      requests_per_s=v.requests_per_s)


@router.get("/me", response_model=KeyOut)
def whoami(key: KeyDep, session: SessionDep) -> KeyOut:
    """The caller's key prefix and bound versions (401 without a valid key)."""
    return KeyOut(key_prefix=key.display_prefix, versions=[version_out(v) for v in versions_for_key(session, key.id)])
