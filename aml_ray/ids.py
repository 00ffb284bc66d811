"""Platform identifiers sent to participants (DESIGN.md "IDs").

- ``user_id    = eval:<run_id>:<dataset>:<sample>``  (the only isolation boundary)
- ``session_id = eval:<run_id>:<dataset>:<sample>:<session>``
- ``request_id = eval:<run_id>:<dataset>:<sample>:chunk-<n>``

A question's platform id (evidence only, never a participant field) is
``eval:<run_id>:<dataset>:<sample>:q-<question_id>``.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

_SAFE = re.compile(r"^[A-Za-z0-9._\-]+$")


def new_run_id() -> str:
    """A fresh run id: ``run_`` + 12 hex characters (random, not derived from secrets or time)."""
    return "run_" + secrets.token_hex(6)


@dataclass(frozen=True, slots=True)
class IdScheme:
    """Builds the ids of one run over one dataset.

    Args:
        run_id: the run's id (letters, digits, ``.``, ``_``, ``-``).
        dataset: the dataset name, e.g. ``"locomo"``.

    Raises:
        ValueError: if run_id or dataset contains other characters (``:`` would make ids ambiguous).
    """

    run_id: str
    dataset: str

    def __post_init__(self) -> None:
        for name in ("run_id", "dataset"):
            value = getattr(self, name)
            if not _SAFE.match(value):
                raise ValueError(f"{name}={value!r} may only use letters, digits, '.', '_' and '-'")

    def user_id(self, sample_id: str) -> str:
        return f"eval:{self.run_id}:{self.dataset}:{sample_id}"

    def session_id(self, sample_id: str, session_key: str) -> str:
        return f"eval:{self.run_id}:{self.dataset}:{sample_id}:{session_key}"

    def request_id(self, sample_id: str, chunk_index: int) -> str:
        return f"eval:{self.run_id}:{self.dataset}:{sample_id}:chunk-{chunk_index}"

    def question_ref(self, sample_id: str, question_id: str) -> str:
        return f"eval:{self.run_id}:{self.dataset}:{sample_id}:q-{question_id}"
