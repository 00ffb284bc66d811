"""SQLite persistence for the reference memory system.

One row per Add message in ``memories``; one row per applied Add in ``applied_requests``. An Add is
committed in a single transaction, so when :meth:`MemoryStore.add` returns, the write is durable and
visible to every later read (the contract's "persisted and immediately searchable").

Idempotency follows the contract's retry rule ("a retry resends the same request_id and the same body"):
a repeated request_id with the same body is acknowledged without storing anything; the same request_id
with a different body is a :class:`RequestConflict`.

Multimodal: a message whose content is an array of parts is stored as its text (what BM25 indexes:
the text parts, newline-joined) plus ``parts_json``: the parts in order, where each image is a
reference ``{"type": "image", "sha256", "kind"}`` to ``<db dir>/media/<sha256>.<ext>``, stored once.
:meth:`MemoryStore.content_parts` rebuilds the contract parts for Search.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from aml_ray.contract import AddRequest
from aml_ray.media import MediaStore, text_of

_SCHEMA = """
CREATE TABLE IF NOT EXISTS memories (
    id           TEXT PRIMARY KEY,
    user_id      TEXT NOT NULL,
    session_id   TEXT NOT NULL,
    request_id   TEXT NOT NULL,
    position     INTEGER NOT NULL,
    role         TEXT NOT NULL,
    content      TEXT NOT NULL,
    timestamp_ms INTEGER,
    created_at   INTEGER NOT NULL,
    parts_json   TEXT
);
CREATE INDEX IF NOT EXISTS memories_by_user ON memories (user_id);
CREATE TABLE IF NOT EXISTS applied_requests (
    request_id  TEXT PRIMARY KEY,
    user_id     TEXT NOT NULL,
    session_id  TEXT NOT NULL,
    body_sha256 TEXT NOT NULL
);
"""


class RequestConflict(Exception):
    """A request_id was already applied with a different body.

    Args:
        request_id: the conflicting request id.
    """

    def __init__(self, request_id: str):
        self.request_id = request_id
        super().__init__("request_id was already applied with a different body")


@dataclass(frozen=True)
class Memory:
    """One stored message.

    Attributes:
        id: stable memory id, ``f"{request_id}#{position}"``.
        user_id: the isolation boundary.
        session_id: source session (grouping only).
        request_id: the Add that stored it.
        position: index of the message inside that Add.
        role: message role.
        content: message text.
        timestamp_ms: source timestamp in Unix milliseconds, if the message had one.
        created_at: persistence time in Unix milliseconds.
        parts_json: Multimodal: the message's parts (images by hash) as JSON, or None for a string.
    """

    id: str
    user_id: str
    session_id: str
    request_id: str
    position: int
    role: str
    content: str
    timestamp_ms: int | None
    created_at: int
    parts_json: str | None = None


def body_sha256(request: AddRequest) -> str:
    """Hash an Add body canonically (sorted keys, compact separators, UTF-8).

    Args:
        request: the validated Add request.

    Returns:
        The hex SHA-256 of the canonical JSON of the request.
    """
    canonical = json.dumps(request.model_dump(mode="json"), sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class MemoryStore:
    """Thread-safe SQLite store (WAL mode, one connection guarded by a lock).

    Args:
        db_path: the database file; created with its parent directory if missing.
    """

    def __init__(self, db_path: Path):
        self.db_path = Path(db_path)
        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # isolation_level=None: explicit BEGIN/COMMIT, so each Add is exactly one transaction.
        self._conn = sqlite3.connect(self.db_path, check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(_SCHEMA)
        columns = {row[1] for row in self._conn.execute("PRAGMA table_info(memories)")}
        if "parts_json" not in columns:  # a database made before multimodal support
            self._conn.execute("ALTER TABLE memories ADD COLUMN parts_json TEXT")
        self.media = MediaStore(self.db_path.parent / "media")

    def _stored_parts(self, content: str | list) -> str | None:
        """Parts -> ``parts_json`` with every image written once under ``media/`` (None for a string)."""
        if isinstance(content, str):
            return None
        out = []
        for p in self.media.externalize(content):
            if p["type"] == "text":
                out.append({"type": "text", "text": p["text"]})
            else:
                kind, _ = self.media.read(p["media"])
                out.append({"type": "image", "sha256": p["media"].removeprefix("media:"), "kind": kind})
        return json.dumps(out, ensure_ascii=False)

    def content_parts(self, memory: Memory) -> str | list[dict]:
        """What Search returns as ``content``: the string, or the stored parts with ``data:`` URLs in order."""
        if memory.parts_json is None:
            return memory.content
        return [{"type": "text", "text": p["text"]} if p["type"] == "text"
                else {"type": "image_url", "image_url": {"url": self.media.data_url("media:" + p["sha256"])}}
                for p in json.loads(memory.parts_json)]

    def add(self, request: AddRequest) -> bool:
        """Store an Add in one transaction, idempotently.

        Args:
            request: the validated Add request.

        Returns:
            True when the messages were stored now; False when the same request (same request_id and
            body) had already been applied and nothing was stored.

        Raises:
            RequestConflict: the request_id was applied before with a different body.
        """
        digest = body_sha256(request)
        now_ms = int(time.time() * 1000)
        rows = [
            (f"{request.request_id}#{i}", request.user_id, request.session_id, request.request_id, i,
             m.role, text_of(m.content), m.timestamp, now_ms, self._stored_parts(m.content))
            for i, m in enumerate(request.messages)
        ]
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                prior = conn.execute("SELECT body_sha256 FROM applied_requests WHERE request_id = ?",
                                     (request.request_id,)).fetchone()
                if prior is not None:
                    conn.execute("ROLLBACK")
                    if prior[0] != digest:
                        raise RequestConflict(request.request_id)
                    return False
                conn.execute("INSERT INTO applied_requests VALUES (?, ?, ?, ?)",
                             (request.request_id, request.user_id, request.session_id, digest))
                conn.executemany("INSERT INTO memories VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
                conn.execute("COMMIT")
            except RequestConflict:
                raise
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        return True

    def memories(self, user_id: str) -> list[Memory]:
        """All memories of exactly this user_id, in insertion order.

        Args:
            user_id: compared byte for byte (no prefix or case folding).

        Returns:
            The user's memories; empty for a user never seen.
        """
        with self._lock:
            cur = self._conn.execute(
                "SELECT id, user_id, session_id, request_id, position, role, content, timestamp_ms, "
                "created_at, parts_json FROM memories WHERE user_id = ? ORDER BY rowid", (user_id,))
            return [Memory(*row) for row in cur.fetchall()]

    def count(self, user_id: str) -> int:
        """Number of stored memories of this user_id.

        Args:
            user_id: compared exactly.

        Returns:
            The row count.
        """
        with self._lock:
            return self._conn.execute("SELECT COUNT(*) FROM memories WHERE user_id = ?",
                                      (user_id,)).fetchone()[0]

    def totals(self) -> dict[str, int]:
        """Store-wide counters for drills.

        Returns:
            ``memories`` (rows), ``requests_applied`` (distinct Add request_ids stored) and
            ``duplicate_messages``: rows minus distinct (user_id, content, timestamp_ms), i.e. messages
            stored more than once, which an idempotent platform never causes.
        """
        with self._lock:
            memories, distinct = self._conn.execute(
                "SELECT COUNT(*), (SELECT COUNT(*) FROM (SELECT DISTINCT user_id, content, timestamp_ms "
                "FROM memories)) FROM memories").fetchone()
            applied = self._conn.execute("SELECT COUNT(*) FROM applied_requests").fetchone()[0]
        return {"memories": memories, "requests_applied": applied, "duplicate_messages": memories - distinct}

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._conn.close()
