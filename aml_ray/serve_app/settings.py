"""The service's settings (read once from the environment by :meth:`ServiceSettings.from_env`).

Environment variables (besides those of :mod:`aml_ray.config`):

- ``AML_DATABASE_URL``: SQLAlchemy URL (default SQLite at ``<data dir>/aml.sqlite3``).
- ``AML_ADMIN_TOKEN``: the admin bearer token; admin routes answer 503 while it is unset.
- ``AML_MASTER_KEYS``: comma-separated Fernet keys, current first. Unset: a key is generated once into
  ``<data dir>/master.key`` (mode 0600), fine for one machine, not for a cluster.
- ``AML_EDITION``: the edition quotas are counted in (default ``cycle-2``).
- ``AML_ALLOW_LOOPBACK``: ``1`` accepts loopback participant endpoints. Operators' own test setups only;
  never on a public deployment.
- ``AML_MAX_CONCURRENT_JOBS``: jobs one replica's dispatcher runs at once (default 2, at least 1); see
  :class:`aml_ray.serve_app.dispatch.JobDispatcher`.
- ``AML_STANDBY_JOB_ACTOR``: ``0`` turns off the job actor each replica keeps started for its next job
  (default on; :mod:`aml_ray.serve_app.job_actor`).
- ``AML_DATASETS_DIR``: where the suites' dataset files are (the layout of ``shared/datasets``; default
  ``~/.aml-ray/datasets``, :func:`aml_ray.suite.datasets_dir`). Files found there are never downloaded.
- ``AML_CODING_BENCH``: the Coding track's task file: a CAMBench file (``cambench.jsonl``,
  :mod:`aml_ray.coding.cambench`) or a folder holding it or a ``bench.json`` (:mod:`aml_ray.coding.bench`);
  default ``<datasets dir>/cambench/cambench.jsonl``. Repository snapshots are where the file names them.
- ``AML_SMOKE_SAMPLES`` / ``AML_FULL_SAMPLES``: samples per bundle in a smoke (default 1) and a full run
  (default ``all``, the formal suite); the publication gate counts questions with the same setting. For
  the Coding track they count tasks.
- ``AML_RETENTION_DAYS``: evidence of jobs finished longer ago is purged on a schedule (default 30);
  ``AML_PURGE_INTERVAL_S``: seconds between purges (default 86400; ``0`` turns the schedule off).
- ``AML_MAX_BODY_BYTES``: the largest request body accepted (default 1 MiB); larger ones get 413.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.fernet import Fernet
from pydantic import SecretStr

from aml_ray.config import DEFAULT_RETENTION_DAYS, ModelEndpoint, _number, data_dir  # _number: env number rule
from aml_ray.security import MASTER_KEYS_ENV
from aml_ray.store.engine import database_url

if TYPE_CHECKING:
    from aml_ray.coding.sandbox import SandboxConfig

#: Jobs the worker runs at once unless ``AML_MAX_CONCURRENT_JOBS`` says otherwise.
DEFAULT_MAX_CONCURRENT_JOBS = 2
#: The largest request body the API accepts unless ``AML_MAX_BODY_BYTES`` says otherwise (1 MiB: an access
#: request with every optional text field at its maximum length is under 40 KiB).
DEFAULT_MAX_BODY_BYTES = 1 << 20
#: Seconds between scheduled evidence purges unless ``AML_PURGE_INTERVAL_S`` says otherwise (one day).
DEFAULT_PURGE_INTERVAL_S = 86400.0
#: Tracks and the datasets their suite runs (only Textual has a dataset adapter so far).
TRACK_DATASETS: dict[str, tuple[str, ...]] = {"textual": ("locomo",), "multimodal": (), "coding": ("cambench",)}
#: Board column title of the Coding track's one dataset (it has no suite file).
CODING_TITLE = "CAMBench Coding (resolved rate with relevant memory)"
#: Where the Coding task file is below the datasets folder unless ``AML_CODING_BENCH`` says otherwise.
DEFAULT_CODING_BENCH = Path("cambench") / "cambench.jsonl"


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
    if track == "coding":
        return {"cambench": CODING_TITLE}
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
        dataset_paths: local dataset files by dataset name; they override ``datasets_dir``.
        datasets_dir: where bundle files are (``<dir>/<bundle.path>``); None: :func:`aml_ray.suite.datasets_dir`.
        suites: the suite (name or file) a track's jobs run; default the shipped suite named like the track.
        answer / judge: the locked model endpoints jobs call; None reads them from the job's environment
            (:func:`aml_ray.config.model_endpoint_from_env`).
        coding_bench: the Coding track's task file or folder; None: ``<datasets dir>/cambench/cambench.jsonl``.
        coding_sandbox: the limits of the Coding track's test sandbox (:class:`aml_ray.coding.sandbox.SandboxConfig`;
            None: its defaults). Never ``unsandboxed``: a host without the isolation fails the job.
        smoke_limit_samples: samples per dataset in a smoke run (the "small fixed subset").
        full_limit_samples: samples per dataset in a full run; None = all (the formal suite). Tests
            shrink it; the publication gate compares question counts with the same setting.
        run_worker: start the background job worker (off for tests that only exercise routes).
        health_check: GET the declared health URL when an access request is submitted.
        num_cpus: CPUs for a Ray cluster a job starts itself (ignored when Ray is running).
        max_concurrent_jobs: jobs one replica's dispatcher runs at once, each in its own Ray actor (many
            participants at once); they share each participant version's and each model endpoint's
            declared limits (:mod:`aml_ray.actors.shared`).
        lease_s: seconds a job's claim lasts unless its runner renews it (:mod:`aml_ray.store.queue`);
            a job whose runner died is resumed by another after at most this long.
        poll_interval_s: seconds between the dispatcher's looks at the queue.
        standby_job_actor: each dispatcher keeps one job actor started ahead for the next job
            (:mod:`aml_ray.serve_app.job_actor`; ``AML_STANDBY_JOB_ACTOR=0`` turns it off): one idle
            process per replica, for 1.3-2.7 s less before a job's first request on 2 cores.
        max_attempts: claims of one job before it is failed (a job that kills its runner every time).
        retention_days / purge_interval_s: the scheduled evidence purge (:mod:`aml_ray.store.retention`);
            ``purge_interval_s`` None or 0 turns it off.
        max_body_bytes: request bodies larger than this get 413.
        trusted_origins: origins (``scheme://host[:port]``) besides the request's own whose pages may post
            to the service (a proxy that rewrites ``Host``); :mod:`aml_ray.serve_app.origin_check`.
        health_timeout_s: the whole health check of an access request's ``health_url``, in seconds.
        access_requests_per_minute: unauthenticated access requests one client address may submit per
            minute (:mod:`aml_ray.serve_app.admission`); beyond it, 429 with ``Retry-After``.
        max_health_checks: health checks running at once per replica; one more answers 503 at once, so
            slow health URLs never hold the request threads that every page needs.
    """

    database_url: str
    master_keys: list[SecretStr]
    db_schema: str | None = None
    admin_token: SecretStr | None = None
    allow_loopback: bool = False
    edition: str = "cycle-2"
    runs_dir: Path = field(default_factory=default_runs_dir)
    dataset_paths: dict[str, Path] = field(default_factory=dict)
    datasets_dir: Path | None = None
    suites: dict[str, str] = field(default_factory=dict)
    coding_bench: Path | None = None
    coding_sandbox: SandboxConfig | None = None
    answer: ModelEndpoint | None = None
    judge: ModelEndpoint | None = None
    smoke_limit_samples: int = 1
    full_limit_samples: int | None = None
    run_worker: bool = True
    health_check: bool = True
    num_cpus: int | None = None
    max_concurrent_jobs: int = DEFAULT_MAX_CONCURRENT_JOBS
    lease_s: float = 60.0
    poll_interval_s: float = 2.0
    standby_job_actor: bool = True
    max_attempts: int = 3
    retention_days: int = DEFAULT_RETENTION_DAYS
    purge_interval_s: float | None = DEFAULT_PURGE_INTERVAL_S
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    trusted_origins: tuple[str, ...] = ()
    health_timeout_s: float = 5.0
    access_requests_per_minute: int = 10
    max_health_checks: int = 4

    def __post_init__(self) -> None:
        if self.max_concurrent_jobs < 1:
            raise ValueError(f"max_concurrent_jobs must be >= 1, got {self.max_concurrent_jobs}")
        if self.smoke_limit_samples < 1:
            raise ValueError(f"smoke_limit_samples (AML_SMOKE_SAMPLES) must be >= 1, got {self.smoke_limit_samples}")
        if self.full_limit_samples is not None and self.full_limit_samples < 1:
            raise ValueError(f"full_limit_samples (AML_FULL_SAMPLES) must be >= 1 or all, got {self.full_limit_samples}")
        if self.coding_sandbox is not None and self.coding_sandbox.unsandboxed:
            raise ValueError("coding_sandbox.unsandboxed: the service never runs participants' diffs without "
                             "isolation; use a host with user namespaces (docs/operations.md)")
        if self.lease_s <= 0 or self.poll_interval_s <= 0:
            raise ValueError(f"lease_s and poll_interval_s must be > 0, got {self.lease_s}, {self.poll_interval_s}")

    def model(self, role: str) -> ModelEndpoint:
        """The ``answer`` or ``judge`` endpoint: the configured one, else from the environment."""
        from aml_ray.config import model_endpoint_from_env

        return getattr(self, role) or model_endpoint_from_env(role)

    def suite_for(self, track: str) -> str:
        """The suite name or file a track's jobs run (``suites[track]``, else the shipped suite ``track``)."""
        return self.suites.get(track, track)

    def bundle_path(self, bundle) -> Path:
        """Where a bundle's data is: ``dataset_paths[bundle.dataset]``, else ``<datasets_dir>/<bundle.path>``."""
        from aml_ray.suite import datasets_dir

        given = self.dataset_paths.get(bundle.dataset)
        return Path(given) if given else (self.datasets_dir or datasets_dir()) / bundle.path

    def coding_bench_path(self) -> Path:
        """Where the Coding task file is: ``coding_bench``, else ``<datasets dir>/cambench/cambench.jsonl``."""
        from aml_ray.suite import datasets_dir

        if self.coding_bench:
            return Path(self.coding_bench)
        return (self.datasets_dir or datasets_dir()) / DEFAULT_CODING_BENCH

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
        full = (env.get("AML_FULL_SAMPLES") or "all").strip().lower()
        purge = _number(env, "AML_PURGE_INTERVAL_S") if env.get("AML_PURGE_INTERVAL_S", "").strip() != "0" else None
        return cls(database_url=database_url(env), master_keys=[SecretStr(k) for k in keys],
                   admin_token=SecretStr(token) if token else None,
                   allow_loopback=env.get("AML_ALLOW_LOOPBACK") == "1",
                   edition=env.get("AML_EDITION") or "cycle-2",
                   datasets_dir=Path(env["AML_DATASETS_DIR"]).expanduser() if env.get("AML_DATASETS_DIR") else None,
                   coding_bench=Path(env["AML_CODING_BENCH"]).expanduser() if env.get("AML_CODING_BENCH") else None,
                   smoke_limit_samples=_number(env, "AML_SMOKE_SAMPLES", int) or 1,
                   full_limit_samples=None if full == "all" else _number({"AML_FULL_SAMPLES": full}, "AML_FULL_SAMPLES", int),
                   retention_days=_number(env, "AML_RETENTION_DAYS", int) or DEFAULT_RETENTION_DAYS,
                   purge_interval_s=purge if "AML_PURGE_INTERVAL_S" in env else DEFAULT_PURGE_INTERVAL_S,
                   max_body_bytes=_number(env, "AML_MAX_BODY_BYTES", int) or DEFAULT_MAX_BODY_BYTES,
                   max_concurrent_jobs=_number(env, "AML_MAX_CONCURRENT_JOBS", int) or DEFAULT_MAX_CONCURRENT_JOBS,
                   standby_job_actor=env.get("AML_STANDBY_JOB_ACTOR", "1").strip() != "0",
                   trusted_origins=tuple(o.strip() for o in (env.get("AML_TRUSTED_ORIGINS") or "").split(",")
                                         if o.strip()))



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
