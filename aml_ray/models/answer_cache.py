"""Cache of model replies keyed by (model, prompt hash, input hash), in SQLite.

A re-judge or a resumed run does not pay twice for the same answer: the key covers everything that
determines a temperature-0 reply (model name, the prompt template's sha256, and the sha256 of the
rendered messages). Only successful, non-empty replies are stored.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any


def cache_key(model: str, prompt_sha256: str, messages: list[dict[str, Any]]) -> str:
    """sha256 hex of the model, the prompt hash and the rendered messages (canonical JSON)."""
    payload = json.dumps([model, prompt_sha256, messages], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


class AnswerCache:
    """SQLite-backed reply cache (one file; safe for the threads of one process).

    Args:
        path: the database file (created with its folder).
    """

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, text TEXT NOT NULL, "
                         "prompt_tokens INTEGER, completion_tokens INTEGER)")
        self._lock = threading.Lock()

    def get(self, key: str) -> dict[str, Any] | None:
        """The cached reply ``{text, prompt_tokens, completion_tokens}``, or None."""
        with self._lock:
            row = self._db.execute("SELECT text, prompt_tokens, completion_tokens FROM replies WHERE key=?",
                                   (key,)).fetchone()
        return None if row is None else {"text": row[0], "prompt_tokens": row[1], "completion_tokens": row[2]}

    def put(self, key: str, text: str, prompt_tokens: int, completion_tokens: int) -> None:
        """Store a reply (the latest reply for a key wins, so a re-asked judge replaces an unparsable one)."""
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO replies VALUES (?, ?, ?, ?)",
                             (key, text, prompt_tokens, completion_tokens))

    def close(self) -> None:
        self._db.close()
