"""Client actors shared by every job a driver runs at once (issue 7, item 4: many participants at once).

A participant version's declared capacity and a model endpoint's declared limits belong to the version
and to the endpoint, not to one job. So a driver running several jobs at once (the service's
:class:`aml_ray.serve_app.worker.JobWorker`, or threads calling :func:`aml_ray.run.evaluation.evaluate`)
gives them **one** :class:`~aml_ray.actors.participant.ParticipantClient` per participant version and
**one** :class:`~aml_ray.actors.model.ModelClient` per model endpoint identity:

- identity: a hash of the configuration's non-secret fields (:func:`participant_version_key`,
  :func:`model_endpoint_key`); the secret never enters a name, a key or a log. Two configurations with
  the same non-secret fields but a different secret (another account, a rotated key) get separate
  actors: the registry compares the full configuration by value in memory, then picks or starts one.
- name: ``aml-<kind>-<identity>-<process token>-<generation>``, started with ``get_if_exists=True``
  (:func:`aml_ray.actors.model.spawn_model_client`, :func:`aml_ray.actors.participant.spawn_participant_client`),
  so ``ray list actors`` shows which endpoint an actor serves.
- lifetime: jobs take a :class:`Lease` when they start and release it when they end (in ``finally``);
  the last lease out closes the actor's HTTP pool and kills it. A later job starts a fresh one under a
  new generation number, so a name is never reused while Ray may still be retiring the old actor
  (``get_if_exists`` would otherwise hand out the dying one).

Why the count lives in the driver, not on the cluster: Ray scopes named actors to a namespace and a
driver gets a fresh anonymous one unless ``ray.init(namespace=...)`` says otherwise; a non-detached
actor also dies with the process that created it. Every set of jobs that must share limits here runs in
one driver (the service, or one program's threads), so a lock and a dict in that process are a
complete, crash-safe count: if the driver dies, its actors die with it and nothing leaks. Sharing
across drivers would need detached actors with leases that outlive a crashed driver, which nobody
would clean up; the process token in the name keeps two drivers that do share a namespace from
adopting (and later killing) each other's actors.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import secrets
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import ModelEndpoint

_lock = threading.Lock()
_entries: dict[tuple[str, str], list[_Entry]] = {}  # (kind, identity) -> live actors of that identity
_generation = itertools.count(1)
#: Distinguishes this process's actors from those of another driver in the same namespace.
PROCESS_TOKEN = secrets.token_hex(4)


def _digest(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def model_endpoint_key(endpoint: ModelEndpoint) -> str:
    """The identity of a model endpoint: 16 hex digits of sha256 over its non-secret fields.

    Fields: role, base_url, model and the declared limits (max_in_flight, rpm, tpm), plus the client
    settings a shared actor would otherwise impose on another job (timeout_s, cache_path, vision).
    The role is part of it because the operator declares limits per role (``ANSWER_MAX_IN_FLIGHT``,
    ``JUDGE_MAX_IN_FLIGHT``): the answer and judge budgets stay separate, as configured. The API key is
    never part of it.

    Examples:
        >>> from pydantic import SecretStr
        >>> a = ModelEndpoint(role="judge", base_url="http://m/v1", model="m", api_key=SecretStr("sk-1"))
        >>> b = ModelEndpoint(role="judge", base_url="http://m/v1", model="m", api_key=SecretStr("sk-2"))
        >>> model_endpoint_key(a) == model_endpoint_key(b), len(model_endpoint_key(a))
        (True, 16)
    """
    return _digest({"role": endpoint.role, "base_url": endpoint.base_url, "model": endpoint.model,
                    "max_in_flight": endpoint.max_in_flight, "rpm": endpoint.rpm, "tpm": endpoint.tpm,
                    "timeout_s": endpoint.timeout_s, "cache_path": endpoint.cache_path,
                    "vision": endpoint.vision})


def participant_version_key(spec: ParticipantSpec) -> str:
    """The identity of a participant version: 16 hex digits of sha256 over the spec without its secret.

    Everything else of the spec is in it (endpoints, auth scheme, declared capacity, timeout, retry
    policy, media limits): a job whose client would behave differently gets its own client.
    """
    return _digest(spec.model_dump(mode="json", exclude={"secret"}))


@dataclass
class _Entry:
    name: str
    config: Any  # the full spec or endpoint, secret included: compared by value, never printed
    handle: Any
    ray_job: str  # the Ray job (driver session) the actor belongs to; a new ray.init starts over
    jobs: Counter[str] = field(default_factory=Counter)


@dataclass
class Lease:
    """One job's hold on a shared client actor; :meth:`release` it when the job ends.

    Attributes:
        name: the actor's Ray name (no secret in it).
        handle: the actor handle to pass to the stages.
        job: the job key the lease was taken for.
    """

    name: str
    handle: Any
    job: str
    _kind_key: tuple[str, str]
    _released: bool = False

    def release(self, *, close_timeout_s: float = 10.0) -> bool:
        """Give the lease back; the last one out closes the actor's HTTP pool and kills the actor.

        Releasing twice is a no-op. Never raises for a dead actor (closing is best effort).

        Returns:
            True when this release closed and killed the actor.
        """
        if self._released:
            return False
        self._released = True
        with _lock:
            entries = _entries.get(self._kind_key, [])
            entry = next((e for e in entries if e.name == self.name), None)
            if entry is None:
                return False
            entry.jobs[self.job] -= 1
            if entry.jobs[self.job] <= 0:
                del entry.jobs[self.job]
            if entry.jobs:
                return False
            entries.remove(entry)
            if not entries:
                del _entries[self._kind_key]
        _close(entry.handle, close_timeout_s)
        return True


def _close(handle, timeout_s: float) -> None:
    import ray

    try:
        ray.get(handle.aclose.remote(), timeout=timeout_s)
    except Exception:  # noqa: BLE001 - closing is best effort; the kill below ends the actor anyway
        pass
    try:
        ray.kill(handle)
    except Exception:  # noqa: BLE001 - already dead
        pass


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:64]


def _acquire(kind: str, identity: str, config: Any, job: str, spawn: Callable[..., Any]) -> Lease:
    import ray

    ray_job = ray.get_runtime_context().get_job_id()
    key = (kind, identity)
    with _lock:
        entries = [e for e in _entries.get(key, []) if e.ray_job == ray_job]  # drop a previous Ray session's
        entry = next((e for e in entries if e.config == config), None)
        if entry is None:
            name = f"aml-{kind}-{_safe(identity)}-{PROCESS_TOKEN}-{next(_generation)}"
            entry = _Entry(name=name, config=config, handle=spawn(config, name=name), ray_job=ray_job)
            entries.append(entry)
        _entries[key] = entries
        entry.jobs[job] += 1
        return Lease(name=entry.name, handle=entry.handle, job=job, _kind_key=key)


def acquire_model_client(endpoint: ModelEndpoint, job: str) -> Lease:
    """The driver's shared ``ModelClient`` actor for ``endpoint``, leased to ``job``.

    Args:
        endpoint: an online endpoint (its key travels to the actor only).
        job: the job's key (its run id).

    Returns:
        A :class:`Lease`; wrap its handle as ``JobModel(lease.handle, job)`` for the stages.

    Raises:
        ValueError: from the actor's constructor (surfaced on the first call) for an offline endpoint.
    """
    from aml_ray.actors.model import spawn_model_client

    return _acquire("model", model_endpoint_key(endpoint), endpoint, job,
                    lambda cfg, name: spawn_model_client(cfg, name=name))


def acquire_participant_client(spec: ParticipantSpec, job: str, *, version_key: str | None = None) -> Lease:
    """The driver's shared ``ParticipantClient`` actor for a participant version, leased to ``job``.

    Jobs of the same version share its declared capacity (max in-flight, requests/s); different
    versions each get their own client and their own limits.

    Args:
        spec: the version's spec (its secret travels to the actor only).
        job: the job's key (its run id).
        version_key: a non-secret key naming the version (e.g. ``"version-<id>"``); default
            :func:`participant_version_key`. Jobs with the same key *and* an equal spec share a client.

    Returns:
        A :class:`Lease` whose handle the stages call.
    """
    from aml_ray.actors.participant import spawn_participant_client

    return _acquire("participant", version_key or participant_version_key(spec), spec, job,
                    lambda cfg, name: spawn_participant_client(cfg, name=name))


def live_leases() -> dict[str, dict[str, int]]:
    """``{actor name: {job: leases}}`` of this driver's shared actors (tests and drills)."""
    with _lock:
        return {e.name: dict(e.jobs) for entries in _entries.values() for e in entries}
