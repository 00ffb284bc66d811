"""Request and response bodies of the API (pydantic v2). Secrets are ``SecretStr`` and never returned."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from aml_ray.serve_app.text_fields import Line, Text

Track = Literal["textual", "multimodal", "coding"]
Division = Literal["open_source", "commercial"]
AuthScheme = Literal["none", "Token", "Bearer", "X-Api-Key"]
Mode = Literal["smoke", "full"]
Label = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
#: Declared capacity bounds ``(least, most)``: concurrent requests, requests per second (0.1 is one request
#: every 10 s; less would stretch a suite past any retention period) and the per-request timeout in seconds
#: (the seed's 30-minute upper bound on one Add or Search).
MAX_IN_FLIGHT = (1, 1024)
REQUESTS_PER_S = (0.1, 10_000.0)
TIMEOUT_S = (1.0, 1800.0)


class AccessRequestIn(BaseModel):
    """An evaluation access request (seed: "Evaluation Access Request").

    ``kind="add_version"`` binds the version to the key sent in ``Authorization: Bearer``.
    """

    model_config = ConfigDict(extra="forbid")
    kind: Literal["new_key", "add_version"] = "new_key"
    contact_name: Line = Field(min_length=1, max_length=200)
    contact_email: Line = Field(min_length=3, max_length=320, pattern=r"^[^@\s]+@[^@\s]+$")
    organization: Line = Field(min_length=1, max_length=200)
    system_name: Line = Field(min_length=1, max_length=200)
    version_label: str = Label
    track: Track
    division: Division
    description: Text = Field(default="", max_length=10_000)
    public_info: Text = Field(default="", max_length=10_000)
    add_url: Line = Field(max_length=2000)
    search_url: Line = Field(max_length=2000)
    health_url: Line | None = Field(default=None, max_length=2000)
    add_status_url: Line | None = Field(default=None, max_length=2000)
    auth_scheme: AuthScheme = "none"
    memory_system_key: SecretStr | None = Field(default=None, max_length=4096)
    max_in_flight: int = Field(default=16, ge=MAX_IN_FLIGHT[0], le=MAX_IN_FLIGHT[1])
    requests_per_s: float | None = Field(default=None, ge=REQUESTS_PER_S[0], le=REQUESTS_PER_S[1],
                                         allow_inf_nan=False)
    timeout_s: float = Field(default=1800.0, ge=TIMEOUT_S[0], le=TIMEOUT_S[1], allow_inf_nan=False)
    repository_url: Line | None = Field(default=None, max_length=500)
    commit: str | None = Field(default=None, max_length=64, pattern=r"^[0-9a-fA-F]{7,64}$")
    attribution: Text | None = Field(default=None, max_length=10_000)
    method_changes: Text | None = Field(default=None, max_length=10_000)

    @model_validator(mode="after")
    def _rules(self) -> AccessRequestIn:
        if self.auth_scheme != "none" and not (self.memory_system_key and
                                               self.memory_system_key.get_secret_value()):
            raise ValueError(f"auth_scheme {self.auth_scheme} needs memory_system_key")
        if self.division == "open_source" and not (self.repository_url and self.commit and self.attribution):
            raise ValueError("open_source entries must give repository_url, commit and attribution")
        if self.add_status_url and "{task_id}" not in self.add_status_url:
            raise ValueError("add_status_url must contain {task_id}")
        return self


class AccessRequestOut(BaseModel):
    """The stored request, as its submitter sees it (no secret, only whether one is held)."""

    id: str
    status: str
    kind: str
    system_name: str
    version_label: str
    track: str
    division: str
    health: str | None
    has_memory_system_key: bool


class Checklist(BaseModel):
    """The full-run checklist (seed: every item must be confirmed).

    Strict booleans: only JSON ``true``/``false``; ``"yes"``, ``"true"``, ``1`` are refused (422) so that a
    confirmation is never read into a string.
    """

    model_config = ConfigDict(extra="forbid", strict=True)
    smoke_passed: bool = False
    contract_followed: bool = False
    run_instructions_complete: bool = False
    original_work_disclosed: bool = False
    no_integrity_violation: bool = False


class JobIn(BaseModel):
    """``POST /api/jobs``."""

    model_config = ConfigDict(extra="forbid")
    version_id: str = Field(min_length=1, max_length=32)
    mode: Mode
    run_label: str = Label
    track: Track
    checklist: Checklist | None = None


class StageOut(BaseModel):
    """One stage's progress: ``stage`` as stored (``add``...), ``label`` the seed's word (``ingestion``...)."""

    stage: str
    label: str
    done: int
    failed: int = 0
    total: int


class BundleOut(BaseModel):
    """One bundle of a job (:mod:`aml_ray.store.bundles`): ``status`` is ``pending``, ``running``, ``ran``,
    ``failed`` or ``skipped``; ``progress`` the bundle's own share of finished units (0..1); ``reason`` why
    it failed or was skipped; ``score`` (0..1), ``coverage`` and the question counts once it ran."""

    name: str
    dataset: str
    title: str | None = None
    status: str
    progress: float = 0.0
    reason: str | None = None
    score: float | None = None
    score_ci_low: float | None = None
    score_ci_high: float | None = None
    coverage: float | None = None
    n_total: int | None = None
    n_scored: int | None = None


class JobOut(BaseModel):
    """A job's status as its key sees it; ``progress`` (0..1) is the mean of its bundles' progress, which
    never drops when the next bundle starts; ``current_bundle`` names the bundle that runs now."""

    id: str
    version_id: str
    mode: str
    track: str
    run_label: str
    status: str
    stage: str
    stage_label: str
    progress: float
    stages: list[StageOut]
    bundles: list[BundleOut] = []
    current_bundle: str | None = None
    error_summary: str | None
    conformance: dict[str, Any] | None = None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class VersionOut(BaseModel):
    """A version bound to the caller's key (endpoints shown; the credential only as a flag)."""

    id: str
    system_name: str
    label: str
    track: str
    division: str
    add_url: str
    search_url: str
    health_url: str | None
    auth_scheme: str
    has_memory_system_key: bool
    max_in_flight: int
    requests_per_s: float | None


class KeyOut(BaseModel):
    """``GET /api/keys/me``."""

    key_prefix: str
    versions: list[VersionOut]


class Decision(BaseModel):
    """An admin rejection reason."""

    model_config = ConfigDict(extra="forbid")
    reason: Text = Field(min_length=1, max_length=2000)


class LeaderboardRow(BaseModel):
    """A public leaderboard row.

    ``rank``: standard competition ranking on the sorted score (equal scores share a rank, the next rank
    skips: 1, 1, 3); ``answer_model`` and ``suite`` (``name@version``): what the row was measured with.
    ``memory_gain`` (Coding only): resolved rate with relevant memory minus with noisy memory.
    ``panel``: the judge panel's accuracies and spread when ``aml-ray rejudge --panel`` was run on the row's
    job (:func:`aml_ray.serve_app.panel_spread.job_panel`), else None.
    """

    rank: int
    system: str
    organization: str
    version: str
    division: str
    overall: float | None
    coverage: float | None
    datasets: dict[str, Any]
    answer_model: str | None = None
    suite: str | None = None
    memory_gain: float | None = None
    panel: dict[str, Any] | None = None
    published_at: datetime


class LeaderboardOut(BaseModel):
    """``GET /api/leaderboard/{track}``."""

    track: str
    datasets: list[str]
    rows: list[LeaderboardRow]
