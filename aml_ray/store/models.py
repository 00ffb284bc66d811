"""SQLAlchemy 2 typed models of the service's tables.

Identifiers are opaque random strings with a kind prefix (``job_...``, ``cred_...``) so that one never
guesses another participant's id. Times are timezone-aware UTC. No column ever holds a secret in clear:
``leaderboard_keys.key_hash`` is sha256 of the key, ``credentials.ciphertext`` is a Fernet token.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(timezone.utc)


def new_id(kind: str) -> str:
    """An opaque id: ``<kind>_`` + 16 random URL-safe characters (96 bits)."""
    return f"{kind}_{secrets.token_urlsafe(12)}"


class UTCDateTime(TypeDecorator):
    """A DateTime that always comes back timezone-aware UTC (SQLite drops the offset)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime: pass a timezone-aware UTC value")
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value


class Base(DeclarativeBase):
    """Declarative base of every service table."""

    type_annotation_map = {datetime: UTCDateTime, dict[str, Any]: JSON, list[Any]: JSON}


class AccessRequest(Base):
    """A participant's application: a new key, or a new version bound to an existing key."""

    __tablename__ = "access_requests"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("req"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending | approved | rejected
    kind: Mapped[str] = mapped_column(String(16))  # new_key | add_version
    existing_key_id: Mapped[str | None] = mapped_column(ForeignKey("leaderboard_keys.id"))
    contact_name: Mapped[str] = mapped_column(String(200))
    contact_email: Mapped[str] = mapped_column(String(320))
    organization: Mapped[str] = mapped_column(String(200))
    system_name: Mapped[str] = mapped_column(String(200))
    version_label: Mapped[str] = mapped_column(String(100))
    track: Mapped[str] = mapped_column(String(32))
    division: Mapped[str] = mapped_column(String(32))  # open_source | commercial
    description: Mapped[str] = mapped_column(Text, default="")
    public_info: Mapped[str] = mapped_column(Text, default="")
    endpoints: Mapped[dict[str, Any]] = mapped_column()  # add/search/health/add_status URLs, auth, capacity
    credential_id: Mapped[str | None] = mapped_column(ForeignKey("credentials.id"))
    repository_url: Mapped[str | None] = mapped_column(String(500))
    commit: Mapped[str | None] = mapped_column(String(64))
    attribution: Mapped[str | None] = mapped_column(Text)
    method_changes: Mapped[str | None] = mapped_column(Text)
    health_summary: Mapped[str | None] = mapped_column(String(100))
    decided_at: Mapped[datetime | None] = mapped_column()
    decided_by: Mapped[str | None] = mapped_column(String(100))
    decision_reason: Mapped[str | None] = mapped_column(Text)
    version_id: Mapped[str | None] = mapped_column(ForeignKey("versions.id"))


class LeaderboardKey(Base):
    """An issued Leaderboard API key: only its sha256 hash and a display prefix are kept."""

    __tablename__ = "leaderboard_keys"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("key"))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    display_prefix: Mapped[str] = mapped_column(String(8))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column()
    systems: Mapped[list[System]] = relationship(back_populates="key")


class System(Base):
    """A participant's memory system, owned by one key."""

    __tablename__ = "systems"
    __table_args__ = (UniqueConstraint("key_id", "name"),)
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("sys"))
    key_id: Mapped[str] = mapped_column(ForeignKey("leaderboard_keys.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    organization: Mapped[str] = mapped_column(String(200))
    division: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    key: Mapped[LeaderboardKey] = relationship(back_populates="systems")
    versions: Mapped[list[Version]] = relationship(back_populates="system")


class Version(Base):
    """A fixed, evaluable version of a system: endpoints, auth scheme, capacity, open-source materials."""

    __tablename__ = "versions"
    __table_args__ = (UniqueConstraint("system_id", "label", "track"),)
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("ver"))
    system_id: Mapped[str] = mapped_column(ForeignKey("systems.id"), index=True)
    label: Mapped[str] = mapped_column(String(100))
    track: Mapped[str] = mapped_column(String(32))
    add_url: Mapped[str] = mapped_column(String(2000))
    search_url: Mapped[str] = mapped_column(String(2000))
    health_url: Mapped[str | None] = mapped_column(String(2000))
    add_status_url: Mapped[str | None] = mapped_column(String(2000))
    auth_scheme: Mapped[str] = mapped_column(String(16))  # none | Token | Bearer | X-Api-Key
    credential_id: Mapped[str | None] = mapped_column(ForeignKey("credentials.id"))
    max_in_flight: Mapped[int] = mapped_column(Integer, default=16)
    requests_per_s: Mapped[float | None] = mapped_column(Float)
    timeout_s: Mapped[float] = mapped_column(Float, default=1800.0)
    repository_url: Mapped[str | None] = mapped_column(String(500))
    commit: Mapped[str | None] = mapped_column(String(64))
    attribution: Mapped[str | None] = mapped_column(Text)
    method_changes: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    system: Mapped[System] = relationship(back_populates="versions")


class Credential(Base):
    """A Memory System Key, encrypted with the platform master key; referenced only by its id."""

    __tablename__ = "credentials"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("cred"))
    ciphertext: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    rotated_at: Mapped[datetime | None] = mapped_column()


class Job(Base):
    """One evaluation of a version in a mode (smoke | full) under a unique run label per key."""

    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("key_id", "run_label"), Index("ix_jobs_status_created", "status", "created_at"))
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("job"))
    key_id: Mapped[str] = mapped_column(ForeignKey("leaderboard_keys.id"), index=True)
    version_id: Mapped[str] = mapped_column(ForeignKey("versions.id"), index=True)
    mode: Mapped[str] = mapped_column(String(8))
    track: Mapped[str] = mapped_column(String(32))
    run_label: Mapped[str] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(16), default="queued")  # queued|running|completed|partial|failed
    stage: Mapped[str] = mapped_column(String(32), default="queued")
    error_summary: Mapped[str | None] = mapped_column(Text)
    checklist: Mapped[dict[str, Any] | None] = mapped_column()
    #: the conformance battery's report of a smoke job (aml_ray.conformance), JSON
    conformance: Mapped[dict[str, Any] | None] = mapped_column()
    #: each bundle of a Textual/Multimodal job, in suite order, as :mod:`aml_ray.store.bundles` keeps it
    #: (name, status, progress 0..1, scores, the cause of a failure), JSON; None before the job starts
    bundles: Mapped[list[Any] | None] = mapped_column()
    run_dir: Mapped[str | None] = mapped_column(String(1000))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()
    #: the database queue's lease (aml_ray.store.queue): who runs the job and until when, and how many
    #: times it was claimed (a claim after an expired lease resumes the run from its evidence)
    lease_owner: Mapped[str | None] = mapped_column(String(64))
    lease_expires_at: Mapped[datetime | None] = mapped_column()
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    stages: Mapped[list[JobStage]] = relationship(order_by="JobStage.position", cascade="all, delete-orphan")


class JobStage(Base):
    """Progress of one pipeline stage of a job (add, search, answer, judge)."""

    __tablename__ = "job_stages"
    __table_args__ = (UniqueConstraint("job_id", "stage"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    stage: Mapped[str] = mapped_column(String(16))
    position: Mapped[int] = mapped_column(Integer)
    done: Mapped[int] = mapped_column(Integer, default=0)  # units finished, failed ones included
    failed: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # of ``done``: failed after retries
    total: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class Result(Base):
    """The score table of a completed job and the secret-free facts the publication gate checks."""

    __tablename__ = "results"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("res"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), unique=True)
    table: Mapped[list[Any]] = mapped_column()  # rows of aml_ray.scoring.aggregate
    overall: Mapped[float | None] = mapped_column(Float)
    coverage: Mapped[float | None] = mapped_column(Float)
    per_dataset: Mapped[dict[str, Any]] = mapped_column()  # {dataset: {"accuracy", "coverage", "n_total"}}
    facts: Mapped[dict[str, Any]] = mapped_column()  # models, pipeline hash, dataset hashes, counts
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Review(Base):
    """The review of a completed full job: the publication gate's checks and the admin's decision."""

    __tablename__ = "reviews"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("rev"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), unique=True)
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending | approved | rejected
    gate: Mapped[dict[str, Any]] = mapped_column()
    decided_by: Mapped[str | None] = mapped_column(String(100))
    decided_at: Mapped[datetime | None] = mapped_column()
    reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class PublicSubmission(Base):
    """A published leaderboard row (a denormalised copy, so the public board never joins private data)."""

    __tablename__ = "public_submissions"
    __table_args__ = (UniqueConstraint("version_id", "track"),)
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: new_id("pub"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), unique=True)
    version_id: Mapped[str] = mapped_column(ForeignKey("versions.id"))
    track: Mapped[str] = mapped_column(String(32), index=True)
    system_name: Mapped[str] = mapped_column(String(200))
    organization: Mapped[str] = mapped_column(String(200))
    version_label: Mapped[str] = mapped_column(String(100))
    division: Mapped[str] = mapped_column(String(32))
    overall: Mapped[float | None] = mapped_column(Float)
    coverage: Mapped[float | None] = mapped_column(Float)
    per_dataset: Mapped[dict[str, Any]] = mapped_column()
    #: the answer model and suite (name@version) the row was measured with, shown per board row
    answer_model: Mapped[str | None] = mapped_column(String(200))
    suite: Mapped[str | None] = mapped_column(String(100))
    published_at: Mapped[datetime] = mapped_column(default=utcnow)


class QuotaUsage(Base):
    """One charged evaluation against a key's quota (smoke and full counted separately)."""

    __tablename__ = "quota_usage"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key_id: Mapped[str] = mapped_column(ForeignKey("leaderboard_keys.id"), index=True)
    track: Mapped[str] = mapped_column(String(32))
    mode: Mapped[str] = mapped_column(String(8))
    edition: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), unique=True)
    charged_at: Mapped[datetime] = mapped_column(default=utcnow)
    completed_at: Mapped[datetime | None] = mapped_column()


class AdminAction(Base):
    """Audit log: every admin action, with its target and outcome (never a secret)."""

    __tablename__ = "admin_actions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    actor: Mapped[str] = mapped_column(String(100))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(64))
    detail: Mapped[dict[str, Any]] = mapped_column(default=dict)
