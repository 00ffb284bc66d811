"""Waits of the tests on Ray's asynchronous ends, guarded generously so a loaded machine never fails them."""

from __future__ import annotations

import time


def wait_until_actor_gone(name: str, namespace: str, guard_s: float = 60.0) -> None:
    """Return once no actor ``name`` is alive in ``namespace`` (``ray.get_actor`` raises ValueError), or after
    ``guard_s`` seconds: the caller asserts what it expects then. Looking an actor up sends it nothing."""
    import ray

    deadline = time.monotonic() + guard_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=namespace)
        except ValueError:
            return
        time.sleep(0.2)
