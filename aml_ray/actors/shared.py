"""Client actors shared by every job on the cluster (and the progress hub, :func:`acquire_progress_hub`).

A participant version's declared capacity and a model endpoint's declared limits (in-flight slots, RPM,
TPM) belong to the version and to the endpoint, not to one job nor to one process. The service runs each
job in its own detached Ray actor (:mod:`aml_ray.serve_app.job_actor`), so jobs running at once are
separate processes; they must still go through **one**
:class:`~aml_ray.actors.participant.ParticipantClient` per participant version and **one**
:class:`~aml_ray.actors.model.ModelClient` per model endpoint identity on the whole cluster, whose slots
go round-robin across jobs (:mod:`aml_ray.actors.fair`).

- registry: one detached, named :class:`ClientRegistry` actor (:data:`REGISTRY_NAME` in
  :data:`NAMESPACE`, found or started with ``get_if_exists=True``, on the head node) starts the client
  actors, counts who holds them and closes them. Every process asks it, so two job actors get the same
  client; the registry serialises acquire and release, so a client is never handed out while it closes.
- identity: a hash of the configuration's non-secret fields (:func:`participant_version_key`,
  :func:`model_endpoint_key`); the secret never enters a name, a key or a log. Two configurations with
  the same non-secret fields but a different secret (another account, a rotated key) get separate
  actors: the registry compares the full configuration by value in its memory.
- name: ``aml-<kind>-<identity>-<registry token>-<generation>`` in :data:`NAMESPACE`, so
  ``ray list actors`` shows which endpoint an actor serves; a closed actor's name is never reused.
- lifetime: a job takes a :class:`Lease` when it starts and releases it when it ends (in ``finally``);
  the last lease out closes the actor's HTTP pool and kills it. A lease lasts ``lease_s`` seconds
  (default :data:`LEASE_S`) and a thread of the holding process renews it every third of that: a job
  actor that dies (node lost, process killed) stops renewing, its leases expire, and the client is
  closed once no live lease holds it. The clients are owned by the registry (they die with it: a lost
  registry loses its clients, whose jobs then fail and are resumed by the queue). A registry started by
  a run exits after :data:`REGISTRY_IDLE_S` seconds with no client, and the next acquire starts a new one;
  the one ``aml-ray cluster up`` starts (:func:`start_registry`, ``idle_exit_s=None``) stays while the
  cluster is up, so a run on it does not wait for the registry's worker process to start.
- head start (:mod:`aml_ray.run.head_start`): a job that asks for it (``head_start=True``) is granted it
  when its lease starts the version's client, i.e. no other job holds that client. The client actor is then
  made holding back all of its in-flight slots (:class:`~aml_ray.actors.participant.ParticipantClient`'s
  ``held_back``), and the job's driver sends its first Adds with a client of its own while the actors
  start; its handover gives the slots back (:meth:`~aml_ray.actors.participant.ParticipantClient.hold_back`),
  and the end of its lease gives back any it left held. Another job that leases the same client
  meanwhile queues behind those slots, so the declared in-flight limit holds across both jobs.
- private: a driver that started its own local cluster (``aml-ray run`` without
  ``RAY_ADDRESS``) has nobody to share with; ``private=True`` spawns the client in that process without
  the registry (one actor process less to start before the first Add), and its lease's release closes
  and kills it.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import re
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import ModelEndpoint

log = logging.getLogger("aml_ray.actors.shared")

#: Ray namespace of the registry and of the client actors (the job actors' too).
NAMESPACE = "aml"
#: Name of the cluster's registry actor.
REGISTRY_NAME = "aml-client-registry"
#: Seconds a lease lasts without renewal; the holder's process renews it every third of this.
LEASE_S = 60.0
#: Seconds the registry waits with no client before it exits.
REGISTRY_IDLE_S = 300.0
#: Seconds between the registry's checks for expired leases.
SWEEP_S = 0.5


def _digest(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def model_endpoint_key(endpoint: ModelEndpoint) -> str:
    """The identity of a model endpoint: 16 hex digits of sha256 over its non-secret fields.

    Fields: role, base_url, model and the declared limits (max_in_flight, rpm, tpm, rate_window_s, rate_headroom), plus the client
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
                    "rate_window_s": endpoint.rate_window_s, "rate_headroom": endpoint.rate_headroom,
                    "timeout_s": endpoint.timeout_s, "cache_path": endpoint.cache_path,
                    "vision": endpoint.vision})


def participant_version_key(spec: ParticipantSpec) -> str:
    """The identity of a participant version: 16 hex digits of sha256 over the spec without its secret.

    Everything else of the spec is in it (endpoints, pinned addresses, auth scheme, declared capacity,
    timeout, retry policy, media limits): a job whose client would behave differently gets its own client.
    """
    return _digest(spec.model_dump(mode="json", exclude={"secret"}))


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:64]


def _spawn(kind: str, config: Any, name: str, held_back: int = 0):
    if kind == "progress":
        from aml_ray.actors.progress_hub import spawn_progress_hub

        return spawn_progress_hub(name=name, namespace=NAMESPACE)
    if kind == "model":
        from aml_ray.actors.model import spawn_model_client

        return spawn_model_client(config, name=name, namespace=NAMESPACE)
    from aml_ray.actors.participant import spawn_participant_client

    return spawn_participant_client(config, name=name, namespace=NAMESPACE, held_back=held_back)


@dataclass
class _Entry:
    name: str
    config: Any  # the full spec or endpoint, secret included: compared by value, never printed
    handle: Any
    leases: dict[str, str] = field(default_factory=dict)  # lease id -> job
    head_start: str | None = None  # the lease granted the head start (its client was made holding its slots)


@dataclass
class _Held:
    key: tuple[str, str]
    name: str
    lease_s: float
    expires: float


class ClientRegistry:
    """The cluster's client actors and their leases (runs as the detached actor :data:`REGISTRY_NAME`).

    An asyncio actor: its methods interleave only at ``await``, and acquire and release change the table
    before their first ``await``, so a closing client is never handed out.

    Args:
        idle_exit_s: seconds with no client after which it exits (the next acquire starts a new one);
            None: it never exits idle (the registry of ``aml-ray cluster up``, :func:`start_registry`).
    """

    def __init__(self, idle_exit_s: float | None = REGISTRY_IDLE_S) -> None:
        self.token = secrets.token_hex(4)  # a restarted registry never reuses a name
        self.idle_exit_s = idle_exit_s
        self._generation = itertools.count(1)
        self._entries: dict[tuple[str, str], list[_Entry]] = {}  # (kind, identity) -> live clients
        self._leases: dict[str, _Held] = {}
        self._sweeper: asyncio.Task | None = None
        self._idle_since = time.monotonic()

    def describe(self) -> dict[str, Any]:
        """``{"token": this registry's name token, "idle_exit_s": as constructed (None: never exits idle)}``."""
        return {"token": self.token, "idle_exit_s": self.idle_exit_s}

    async def acquire(self, kind: str, identity: str, config: Any, job: str, lease_id: str,
                      lease_s: float, head_start: bool = False) -> tuple[str, Any, bool]:
        """Lease the client of ``(kind, identity)`` whose configuration equals ``config`` (started if none).

        Args:
            head_start: the job asks for the head start (the module docstring): granted when this lease
                starts a participant client, which is then made holding back all its in-flight slots.

        Returns:
            ``(actor name, actor handle, whether the head start is granted)``.
        """
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        key = (kind, identity)
        entries = self._entries.setdefault(key, [])
        entry = next((e for e in entries if e.config == config), None)
        granted = False
        if entry is None:
            granted = head_start and kind == "participant"
            name = f"aml-{kind}-{_safe(identity)}-{self.token}-{next(self._generation)}"
            held = config.max_in_flight if granted else 0
            entry = _Entry(name=name, config=config, handle=_spawn(kind, config, name, held_back=held),
                           head_start=lease_id if granted else None)
            entries.append(entry)
        entry.leases[lease_id] = job
        self._leases[lease_id] = _Held(key, entry.name, lease_s, time.monotonic() + lease_s)
        return entry.name, entry.handle, granted

    def renew(self, lease_ids: list[str]) -> list[str]:
        """Extend the given leases by their ``lease_s``; returns the ids it does not hold (expired, released)."""
        now, unknown = time.monotonic(), []
        for lease_id in lease_ids:
            held = self._leases.get(lease_id)
            if held is None:
                unknown.append(lease_id)
            else:
                held.expires = now + held.lease_s
        return unknown

    async def release(self, lease_id: str, close_timeout_s: float = 10.0) -> bool:
        """End a lease; the last one out closes its client's HTTP pool and kills it. True when it closed one."""
        held = self._leases.pop(lease_id, None)
        if held is None:
            return False
        entries = self._entries.get(held.key, [])
        entry = next((e for e in entries if e.name == held.name), None)
        if entry is None:
            return False
        entry.leases.pop(lease_id, None)
        if entry.leases:
            if entry.head_start == lease_id:  # its head start's job ended: no slot stays held for it
                entry.head_start = None
                entry.handle.give_back.remote(entry.config.max_in_flight)
            return False
        entries.remove(entry)
        if not entries:
            del self._entries[held.key]
            if not self._entries:
                self._idle_since = time.monotonic()
        await _close(entry.handle, close_timeout_s)
        return True

    def live(self) -> dict[str, dict[str, int]]:
        """``{actor name: {job: leases}}`` of every live client."""
        return {e.name: dict(Counter(e.leases.values())) for entries in self._entries.values() for e in entries}

    async def _sweep(self) -> None:
        import ray

        while True:
            await asyncio.sleep(SWEEP_S)
            now = time.monotonic()
            for lease_id in [i for i, h in self._leases.items() if h.expires < now]:
                held = self._leases[lease_id]
                job = next((e.leases.get(lease_id) for e in self._entries.get(held.key, []) if e.name == held.name), "?")
                log.warning("lease of job %s on %s expired (its process stopped renewing it)", job, held.name)
                await self.release(lease_id)
            if not self._entries and self.idle_exit_s is not None and now - self._idle_since > self.idle_exit_s:
                ray.kill(ray.get_runtime_context().current_actor)  # no client for a while: the next acquire restarts one


async def _close(handle, timeout_s: float) -> None:
    import ray

    try:
        await asyncio.wait_for(handle.aclose.remote(), timeout_s)
    except Exception:  # noqa: BLE001 - closing is best effort; the kill below ends the actor anyway
        pass
    try:
        ray.kill(handle)
    except Exception:  # noqa: BLE001 - already dead
        pass


_registry_class = None  # ray.remote(ClientRegistry), made once per process


def registry(idle_exit_s: float | None = REGISTRY_IDLE_S):
    """The cluster's :class:`ClientRegistry` actor handle, started (detached, on the head node) if none runs.

    Args:
        idle_exit_s: the ``idle_exit_s`` of a registry this call starts; one already running keeps its own.
    """
    import ray

    global _registry_class
    if _registry_class is None:
        _registry_class = ray.remote(ClientRegistry)
    return _registry_class.options(
        name=REGISTRY_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True, num_cpus=0,
        max_restarts=-1, max_concurrency=1000, resources={"node:__internal_head__": 0.001},
        scheduling_strategy="DEFAULT").remote(idle_exit_s)


def start_registry(*, timeout_s: float = 120.0) -> dict[str, Any]:
    """Start the cluster's registry for good (``idle_exit_s=None``) and wait until it answers; Ray must be
    initialised. ``aml-ray cluster up`` runs it once (:func:`aml_ray.run.cluster.up`), so no run on the cluster
    waits for the registry's start. A registry already running is left as it is.

    Returns:
        The running registry's :meth:`ClientRegistry.describe`.

    Raises:
        ray.exceptions.GetTimeoutError: it did not answer within ``timeout_s``.
    """
    import ray

    return ray.get(registry(None).describe.remote(), timeout=timeout_s)


def _call(method: str, *args, timeout_s: float = 60.0, tries: int = 5):
    """``ray.get(registry().<method>.remote(*args))``, retried when the registry actor is gone (it exited idle
    or died): the next call starts a new one."""
    import ray
    from ray.exceptions import RayActorError

    for attempt in range(tries):
        try:
            return ray.get(getattr(registry(), method).remote(*args), timeout=timeout_s)
        except RayActorError:
            if attempt == tries - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


# ------------------------------------------------------------------------------------- the holding process
_lock = threading.Lock()
_held: dict[str, Lease] = {}  # lease id -> this process's live leases (renewed by _renewer)
_wake = threading.Event()
_renewer: threading.Thread | None = None


@dataclass
class Lease:
    """One job's hold on a shared client actor; :meth:`release` it when the job ends.

    Attributes:
        name: the actor's Ray name (no secret in it).
        handle: the actor handle to pass to the stages.
        job: the job key the lease was taken for.
        lease_id: the registry's id of this lease (random).
        lease_s: seconds the lease lasts without renewal (renewed by this process every third of it).
    """

    name: str
    handle: Any
    job: str
    lease_id: str
    lease_s: float = LEASE_S
    private: bool = False  # spawned by this process without the registry (_acquire's ``private``)
    head_start: bool = False  # the registry granted this job the head start (the module docstring)
    _released: bool = False

    def release(self, *, close_timeout_s: float = 10.0) -> bool:
        """Give the lease back; the last one out (on the cluster) closes the actor's HTTP pool and kills it.

        Releasing twice is a no-op. Never raises (a lost registry or a dead actor: closing is best effort).

        Returns:
            True when this release closed and killed the actor.
        """
        if self._released:
            return False
        self._released = True
        if self.private:  # no registry holds it: this lease is its only holder
            asyncio.run(_close(self.handle, close_timeout_s))
            return True
        with _lock:
            _held.pop(self.lease_id, None)
        try:
            return bool(_call("release", self.lease_id, close_timeout_s, timeout_s=close_timeout_s + 30))
        except Exception as exc:  # noqa: BLE001 - the lease then expires in the registry
            log.warning("lease %s on %s not released (%s); it expires", self.lease_id, self.name, type(exc).__name__)
            return False


def _renew_loop() -> None:
    global _renewer
    while True:
        with _lock:
            if not _held:
                _renewer = None
                return
            interval = min(lease.lease_s for lease in _held.values()) / 3
        _wake.wait(interval)
        _wake.clear()
        with _lock:
            ids = list(_held)
        if not ids:
            continue
        try:
            lost = _call("renew", ids, timeout_s=max(interval, 5.0), tries=2)
        except Exception as exc:  # noqa: BLE001 - Ray shut down, registry restarting: try again next turn
            log.warning("lease renewal failed: %s", type(exc).__name__)
            continue
        for lease_id in lost:
            with _lock:
                lease = _held.pop(lease_id, None)
            if lease is not None:
                log.warning("lease of job %s on %s had expired (not renewed in time)", lease.job, lease.name)


def _acquire(kind: str, identity: str, config: Any, job: str, lease_s: float, private: bool = False,
             head_start: bool = False) -> Lease:
    """A lease from the registry; or, ``private``, a client actor spawned here and held by this lease alone.

    Private is for a driver that started its own local cluster (:func:`aml_ray.run.ray_runtime.init_ray`
    returned True): no other process can reach that cluster, so there is nothing to share and the
    registry's actor would be one more worker process to start before the first Add.
    """
    global _renewer
    lease_id = secrets.token_hex(8)
    if private:
        name = f"aml-{kind}-{_safe(identity)}-private-{lease_id}"
        return Lease(name=name, handle=_spawn(kind, config, name), job=job, lease_id=lease_id, lease_s=lease_s,
                     private=True)
    name, handle, granted = _call("acquire", kind, identity, config, job, lease_id, lease_s, head_start)
    lease = Lease(name=name, handle=handle, job=job, lease_id=lease_id, lease_s=lease_s, head_start=granted)
    with _lock:
        _held[lease_id] = lease
        if _renewer is None:
            _renewer = threading.Thread(target=_renew_loop, name="aml-lease-renewer", daemon=True)
            _renewer.start()
    _wake.set()  # a shorter lease may need an earlier renewal
    return lease


def acquire_model_client(endpoint: ModelEndpoint, job: str, *, lease_s: float = LEASE_S, private: bool = False) -> Lease:
    """The cluster's shared ``ModelClient`` actor for ``endpoint``, leased to ``job``.

    Args:
        endpoint: an online endpoint (its key travels to the registry and the actor only).
        job: the job's key (its run id).
        lease_s: seconds the lease lasts unless this process renews it (it does while it lives).
        private: spawn the actor here, without the registry (only where this process started its own
            local cluster: no other process shares it; see :func:`_acquire`).

    Returns:
        A :class:`Lease`; wrap its handle as ``JobModel(lease.handle, job)`` for the stages.

    Raises:
        ValueError: from the actor's constructor (surfaced on the first call) for an offline endpoint.
    """
    return _acquire("model", model_endpoint_key(endpoint), endpoint, job, lease_s, private)


def acquire_participant_client(spec: ParticipantSpec, job: str, *, version_key: str | None = None,
                               lease_s: float = LEASE_S, private: bool = False, head_start: bool = False) -> Lease:
    """The cluster's shared ``ParticipantClient`` actor for a participant version, leased to ``job``.

    Jobs of the same version share its declared capacity (max in-flight, requests/s); different
    versions each get their own client and their own limits. (The service admits one active job per
    version; a job resumed while its previous actor still ran would share the client with it.)

    Args:
        spec: the version's spec (its secret travels to the registry and the actor only).
        job: the job's key (its run id).
        version_key: a non-secret key naming the version (e.g. ``"version-<id>"``); default
            :func:`participant_version_key`. Jobs with the same key *and* an equal spec share a client.
        lease_s, private: as :func:`acquire_model_client`.
        head_start: ask for the head start (the module docstring; not with ``private``, whose client is
            this job's alone): ``lease.head_start`` says whether it is granted, and when it is, the client
            holds back all its slots until this job's handover calls its ``hold_back``, or the lease ends.

    Returns:
        A :class:`Lease` whose handle the stages call.
    """
    return _acquire("participant", version_key or participant_version_key(spec), spec, job, lease_s, private,
                    head_start and not private)


#: The progress hub's identity and configuration at the registry: one hub per cluster.
PROGRESS_HUB = "hub"


def acquire_progress_hub(job: str, *, lease_s: float = LEASE_S, private: bool = False) -> Lease:
    """The cluster's :class:`~aml_ray.actors.progress_hub.ProgressHub` actor, which holds every job's progress
    tracker, leased to ``job`` (one worker process for all jobs, not one per job; started by the first lease
    and closed by the last, as the clients are).

    Args:
        job / lease_s / private: as :func:`acquire_model_client`.

    Returns:
        A :class:`Lease`; the pipeline wraps its handle as ``TrackerOnHub(lease.handle, key)``.
    """
    return _acquire("progress", PROGRESS_HUB, PROGRESS_HUB, job, lease_s, private)


def live_leases() -> dict[str, dict[str, int]]:
    """``{actor name: {job: leases}}`` of the cluster's shared client actors (tests and drills)."""
    return _call("live")
