"""Settings read from the environment (one place for every knob an operator sets).

Environment variables:

- ``AML_DATA_DIR``: state of the service and default run output (default ``~/.aml-ray``).
- ``AML_CACHE_DIR``: downloaded dataset files (default ``$AML_DATA_DIR/cache``).
- ``ANSWER_API_BASE``, ``ANSWER_API_KEY``, ``ANSWER_MODEL``: the answer model's OpenAI-compatible endpoint.
- ``JUDGE_API_BASE``, ``JUDGE_API_KEY``, ``JUDGE_MODEL``: the judge model's endpoint.
- ``ANSWER_VISION=1``: the answer model accepts image inputs (required by the Multimodal track).

With no ``*_API_BASE`` set, the embedded offline answerer / lexical judge are used and labelled as
offline in every output.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

#: Retention period of evidence, in days (DESIGN.md "Data handling"): ``aml-ray purge`` and
#: :mod:`aml_ray.store.retention`. Here, not in the store, so that ``aml-ray --help`` does not load SQLAlchemy.
DEFAULT_RETENTION_DAYS = 30


def data_dir() -> Path:
    """The platform's data directory (``AML_DATA_DIR`` or ``~/.aml-ray``)."""
    return Path(os.environ.get("AML_DATA_DIR") or Path.home() / ".aml-ray").expanduser()


def cache_dir() -> Path:
    """Where downloaded dataset files are cached (``AML_CACHE_DIR`` or ``<data dir>/cache``)."""
    return Path(os.environ.get("AML_CACHE_DIR") or data_dir() / "cache").expanduser()


#: Share of a model's rpm/tpm the client leaves unused from the start (``<ROLE>_RATE_HEADROOM``); refusals widen
#: it (:class:`aml_ray.models.rate_limits.RequestBudget`).
DEFAULT_RATE_HEADROOM = 0.02


@dataclass(frozen=True)
class ModelEndpoint:
    """An OpenAI-compatible model endpoint.

    Attributes:
        role: ``"answer"`` or ``"judge"``.
        base_url: e.g. ``https://api.openai.com/v1``; None selects the offline implementation.
        model: model name sent in requests.
        api_key: the secret; excluded from repr, logs and evidence.
        max_in_flight: concurrent requests to this endpoint.
        timeout_s: per-request timeout in seconds (answer 180 s, judge 360 s by default).
        rpm: requests per minute limit, or None.
        tpm: tokens per minute limit (prompt estimate + max_tokens), or None.
        rate_window_s: seconds of the rpm/tpm budget the client may send at once, in (0, 60] (default 0.5:
            hosted APIs enforce per-minute limits over periods as short as a second, and a client that
            holds half of that period's budget stays under it when requests bunch up on the way; see
            :class:`aml_ray.models.rate_limits.RequestBudget`).
        rate_headroom: share of rpm/tpm left unused from the start, in [0, 0.5) (default 0.02), so the
            endpoint's budget absorbs arrival jitter; each 429 the endpoint answers widens the margin (an
            endpoint that counts tokens its own way: :class:`aml_ray.models.rate_limits.RequestBudget`).
        cache_path: SQLite reply cache (see :mod:`aml_ray.models.answer_cache`), or None for no cache.
        vision: the model accepts OpenAI-style image parts (``<ROLE>_VISION=1``); the Multimodal track
            refuses an online answer model without it.
    """

    role: str
    base_url: str | None
    model: str
    api_key: SecretStr | None = None
    max_in_flight: int = 32
    timeout_s: float = 180.0
    rpm: float | None = None
    tpm: float | None = None
    cache_path: str | None = None
    vision: bool = False
    rate_window_s: float = 0.5
    rate_headroom: float = DEFAULT_RATE_HEADROOM

    def __post_init__(self) -> None:
        """Refuse limits a client cannot hold (the field name and the fix in the message)."""
        prefix = self.role.upper()
        if self.max_in_flight < 1:
            raise ValueError(f"{prefix}_MAX_IN_FLIGHT must be >= 1, got {self.max_in_flight!r}")
        for name, value in (("RPM", self.rpm), ("TPM", self.tpm)):
            if value is not None and not value > 0:
                raise ValueError(f"{prefix}_{name} must be a positive number or unset, got {value!r}")
        if not 0 < self.rate_window_s <= 60:
            raise ValueError(f"{prefix}_RATE_WINDOW_S must be in (0, 60] seconds, got {self.rate_window_s!r}")
        if not 0 <= self.rate_headroom < 0.5:
            raise ValueError(f"{prefix}_RATE_HEADROOM must be in [0, 0.5), got {self.rate_headroom!r}")

    @property
    def offline(self) -> bool:
        return self.base_url is None

    def describe(self) -> dict[str, object]:
        """A secret-free description for run.json and the console."""
        return {"role": self.role, "base_url": self.base_url, "model": self.model, "offline": self.offline,
                "timeout_s": self.timeout_s, "max_in_flight": self.max_in_flight, "rpm": self.rpm,
                "tpm": self.tpm, "rate_window_s": self.rate_window_s, "rate_headroom": self.rate_headroom,
                "temperature": 0, **({"vision": True} if self.vision else {})}


OFFLINE_ANSWER_MODEL = "offline-extractive-answerer (not an official model)"
OFFLINE_JUDGE_MODEL = "offline-lexical-judge (not an official model)"


def _number(env: dict[str, str], name: str, kind=float):
    raw = env.get(name)
    if raw in (None, ""):
        return None
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} must be a number") from None
    if value <= 0:
        raise ValueError(f"{name}={raw!r} must be > 0")
    return value


def _headroom(env: dict[str, str], name: str) -> float:
    raw = env.get(name)
    if raw in (None, ""):
        return DEFAULT_RATE_HEADROOM
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} must be a number in [0, 0.5), e.g. 0.05") from None


def model_endpoint_from_env(role: str, env: dict[str, str] | None = None) -> ModelEndpoint:
    """Build the answer or judge endpoint from the environment.

    Variables (``<ROLE>`` is ``ANSWER`` or ``JUDGE``): ``<ROLE>_API_BASE``, ``<ROLE>_API_KEY``,
    ``<ROLE>_MODEL``, and optionally ``<ROLE>_MAX_IN_FLIGHT``, ``<ROLE>_RPM``, ``<ROLE>_TPM``,
    ``<ROLE>_RATE_WINDOW_S``, ``<ROLE>_RATE_HEADROOM`` (see :class:`ModelEndpoint`),
    ``<ROLE>_TIMEOUT_S``, ``<ROLE>_VISION`` (``1``/``true``: accepts images). Replies are cached under ``<cache dir>/model-replies.sqlite3`` unless
    ``AML_MODEL_CACHE=off``.

    Raises:
        ValueError: ``<ROLE>_API_BASE`` set without ``<ROLE>_MODEL``, or a limit that is not a positive number.
    """
    env = os.environ if env is None else env
    prefix = role.upper()
    base = env.get(f"{prefix}_API_BASE") or None
    timeout = _number(env, f"{prefix}_TIMEOUT_S") or (180.0 if role == "answer" else 360.0)
    if base is None:
        name = OFFLINE_ANSWER_MODEL if role == "answer" else OFFLINE_JUDGE_MODEL
        return ModelEndpoint(role=role, base_url=None, model=name, timeout_s=timeout)
    model = env.get(f"{prefix}_MODEL")
    if not model:
        raise ValueError(f"{prefix}_API_BASE is set but {prefix}_MODEL is not: set {prefix}_MODEL to the "
                         "model name the endpoint serves")
    key = env.get(f"{prefix}_API_KEY")
    cache = None if env.get("AML_MODEL_CACHE", "").lower() == "off" else str(cache_dir() / "model-replies.sqlite3")
    return ModelEndpoint(role=role, base_url=base, model=model, api_key=SecretStr(key) if key else None,
                         timeout_s=timeout, max_in_flight=_number(env, f"{prefix}_MAX_IN_FLIGHT", int) or 32,
                         rpm=_number(env, f"{prefix}_RPM"), tpm=_number(env, f"{prefix}_TPM"), cache_path=cache,
                         vision=env.get(f"{prefix}_VISION", "").lower() in ("1", "true", "yes"),
                         rate_window_s=_number(env, f"{prefix}_RATE_WINDOW_S") or 0.5,
                         rate_headroom=_headroom(env, f"{prefix}_RATE_HEADROOM"))
