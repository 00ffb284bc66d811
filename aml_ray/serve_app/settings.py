"""The service's settings (read once from the environment by :meth:`ServiceSettings.from_env`).

Environment variables (besides those of :mod:`aml_ray.config`):

- ``AML_DATABASE_URL``: SQLAlchemy URL (default SQLite at ``<data dir>/aml.sqlite3``).
- ``AML_ADMIN_TOKEN``: the admin bearer token; admin routes answer 503 while it is unset.
- ``AML_MASTER_KEYS``: comma-separated Fernet keys, current first. Unset: a key is generated once into
  ``<data dir>/master.key`` (mode 0600), fine for one machine, not for a cluster.
- ``AML_EDITION``: the edition quotas are counted in (default ``cycle-2``).
- ``AML_ALLOW_LOOPBACK``: ``1`` accepts loopback participant endpoints. Operators' own test setups only;
  never on a public deployment.
- ``AML_MAX_CONCURRENT_JOBS``: jobs the worker runs at once (default 2, at least 1); see
  :class:`aml_ray.serve_app.worker.JobWorker`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.fernet import Fernet
from pydantic import SecretStr

from aml_ray.config import _number, data_dir  # _number: the env number rule of the model limits
from aml_ray.security import MASTER_KEYS_ENV
from aml_ray.store.engine import database_url

#: Jobs the worker runs at once unless ``AML_MAX_CONCURRENT_JOBS`` says otherwise.
DEFAULT_MAX_CONCURRENT_JOBS = 2
#: Tracks and the datasets their suite runs (only Textual has a dataset adapter so far).
TRACK_DATASETS: dict[str, tuple[str, ...]] = {"textual": ("locomo",), "multimodal": (), "coding": ()}


def board_datasets(track: str) -> tuple[str, ...]:
    """The dataset columns of a track's public board: the datasets its jobs run, else those of the track's
    shipped suite (the Multimodal board shows Mem-Gallery and ATM-Bench before the service runs its jobs).

    Examples:
        >>> board_datasets("textual"), board_datasets("multimodal")
        (('locomo',), ('memgallery', 'atmbench', 'atmbench_hard'))
    """
    if TRACK_DATASETS.get(track):
        return TRACK_DATASETS[track]
    return tuple(b.dataset for b in _track_suite(track).bundles) if _track_suite(track) else ()


def dataset_titles(track: str) -> dict[str, str]:
    """``dataset -> "Title (scorer)"`` for the board's column headers, from the track's shipped suite."""
    suite = _track_suite(track)
    return {b.dataset: f"{b.title} ({b.scorer})" for b in suite.bundles} if suite else {}


def _track_suite(track: str):
    from aml_ray.suite import load_suite

    try:
        suite = load_suite(track)
    except (FileNotFoundError, ValueError):
        return None
    return suite if suite.track == track else None


def default_runs_dir() -> Path:
    """Where the service writes job run directories (evidence, run.json): ``<data dir>/service-runs``."""
    return data_dir() / "service-runs"


@dataclass
class ServiceSettings:
    """Everything :func:`aml_ray.serve_app.app.create_app` needs.

    Attributes:
        database_url: SQLAlchemy URL of the store.
        db_schema: PostgreSQL schema for every table (tests); None for the default.
        admin_token: bearer token of the administrator; None disables admin routes (503).
        master_keys: Fernet keys for the Memory System Keys, current first.
        allow_loopback: accept loopback participant endpoints (operators and tests only).
        edition: the edition quotas are counted in.
        runs_dir: where job run directories (evidence, run.json) are written.
        dataset_paths: local dataset files by name; a missing name is downloaded and sha256-checked.
        smoke_limit_samples: samples per dataset in a smoke run (the "small fixed subset").
        full_limit_samples: samples per dataset in a full run; None = all (the formal suite). Tests
            shrink it; the publication gate compares question counts with the same setting.
        run_worker: start the background job worker (off for tests that only exercise routes).
        health_check: GET the declared health URL when an access request is submitted.
        num_cpus: CPUs for a Ray cluster a job starts itself (ignored when Ray is running).
        max_concurrent_jobs: jobs the worker runs at once, each in its own thread (issue 7: many
            participants at once); they share each participant version's and each model endpoint's
            declared limits (:mod:`aml_ray.actors.shared`).
    """

    database_url: str
    master_keys: list[SecretStr]
    db_schema: str | None = None
    admin_token: SecretStr | None = None
    allow_loopback: bool = False
    edition: str = "cycle-2"
    runs_dir: Path = field(default_factory=default_runs_dir)
    dataset_paths: dict[str, Path] = field(default_factory=dict)
    smoke_limit_samples: int = 1
    full_limit_samples: int | None = None
    run_worker: bool = True
    health_check: bool = True
    num_cpus: int | None = None
    max_concurrent_jobs: int = DEFAULT_MAX_CONCURRENT_JOBS

    def __post_init__(self) -> None:
        if self.max_concurrent_jobs < 1:
            raise ValueError(f"max_concurrent_jobs must be >= 1, got {self.max_concurrent_jobs}")

    def __repr__(self) -> str:  # never print the token or the master keys
        return (f"ServiceSettings(database_url={self.database_url.split('@')[-1]!r}, edition={self.edition!r}, "
                f"allow_loopback={self.allow_loopback}, runs_dir={str(self.runs_dir)!r})")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ServiceSettings:
        """Settings from the environment (see the module docstring).

        Args:
            env: the environment (default ``os.environ``).

        Returns:
            The settings.
        """
        env = os.environ if env is None else env
        keys = [k.strip() for k in (env.get(MASTER_KEYS_ENV) or "").split(",") if k.strip()]
        if not keys:
            keys = [_local_master_key(data_dir() / "master.key")]
        token = env.get("AML_ADMIN_TOKEN")
        return cls(database_url=database_url(env), master_keys=[SecretStr(k) for k in keys],
                   admin_token=SecretStr(token) if token else None,
                   allow_loopback=env.get("AML_ALLOW_LOOPBACK") == "1",
                   edition=env.get("AML_EDITION") or "cycle-2",
                   max_concurrent_jobs=_number(env, "AML_MAX_CONCURRENT_JOBS", int) or DEFAULT_MAX_CONCURRENT_JOBS)



def _local_master_key(path: Path) -> str:
    """Read, or create with mode 0600, a single-machine master key file."""
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    key = Fernet.generate_key().decode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    return key
