"""Per-user BM25 retrieval over stored memories (bm25s).

Each user_id has its own index, built lazily from that user's memories on the first Search and rebuilt
only after the user has new writes (a per-user version counter bumped by :meth:`BM25Index.mark_dirty`).
Users are isolated by construction: a Search only ever touches the index of the exact user_id.
"""

from __future__ import annotations

import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import bm25s
import numpy as np

from aml_ray.reference.store import Memory

try:  # shipped inside bm25s, no download
    from bm25s.stopwords import STOPWORDS_EN as _STOPWORDS
except ImportError:  # pragma: no cover - older bm25s
    _STOPWORDS = ()

STOPWORDS: frozenset[str] = frozenset(_STOPWORDS)
_TOKEN = re.compile(r"\w+", re.UNICODE)


def tokenize(text: str) -> list[str]:
    """Lowercase, split on ``\\w+`` runs and drop English stopwords.

    Args:
        text: any text.

    Returns:
        The tokens in order (possibly empty).
    """
    return [t for t in _TOKEN.findall(text.lower()) if t not in STOPWORDS]


@dataclass(frozen=True)
class Hit:
    """One search result.

    Attributes:
        memory: the stored memory.
        score: BM25 score (> 0; higher is more relevant).
    """

    memory: Memory
    score: float


class _UserIndex:
    """A built index for one user at one version."""

    def __init__(self, version: int, memories: Sequence[Memory]):
        self.version = version
        self.memories = list(memories)
        corpus = [tokenize(m.content) for m in self.memories]
        self.retriever: bm25s.BM25 | None = None
        if any(corpus):  # bm25s cannot index a corpus without a single token
            self.retriever = bm25s.BM25()
            self.retriever.index(corpus, show_progress=False)

    def search(self, query: str, top_k: int) -> list[Hit]:
        tokens = tokenize(query)
        if self.retriever is None or not tokens:
            return []
        scores = self.retriever.get_scores(tokens)
        k = min(top_k, len(scores))
        # Stable order among equal scores: earlier memories first.
        order = np.argsort(-scores, kind="stable")[:k]
        hits = []
        for i in order:
            s = float(scores[i])
            if not math.isfinite(s) or s <= 0.0:
                break
            hits.append(Hit(self.memories[i], s))
        return hits


class BM25Index:
    """Lazily built, per-user BM25 indexes with dirty tracking.

    Args:
        load: returns all memories of one exact user_id (e.g. :meth:`MemoryStore.memories`).
        max_users: how many built user indexes to keep (least recently used are dropped and rebuilt
            on demand).
    """

    def __init__(self, load: Callable[[str], list[Memory]], *, max_users: int = 1024):
        self._load = load
        self._max_users = max_users
        self._lock = threading.Lock()
        self._versions: dict[str, int] = {}
        self._built: OrderedDict[str, _UserIndex] = OrderedDict()
        self._user_locks: dict[str, threading.Lock] = {}
        self.builds = 0  #: number of index (re)builds, for tests and diagnostics

    def mark_dirty(self, user_id: str) -> None:
        """Record that this user has new writes; the next search rebuilds its index.

        Call after the write is committed.

        Args:
            user_id: the user that was written to.
        """
        with self._lock:
            self._versions[user_id] = self._versions.get(user_id, 0) + 1

    def search(self, user_id: str, query: str, top_k: int) -> list[Hit]:
        """Top BM25 hits for a query among this user's memories only.

        Args:
            user_id: exact isolation key.
            query: the question text.
            top_k: maximum number of hits (>= 1).

        Returns:
            At most ``top_k`` hits with positive scores, most relevant first; empty for an unknown
            user or a query sharing no token with the user's memories.
        """
        with self._lock:
            user_lock = self._user_locks.setdefault(user_id, threading.Lock())
        with user_lock:
            with self._lock:
                version = self._versions.get(user_id, 0)
                built = self._built.get(user_id)
                if built is not None:
                    self._built.move_to_end(user_id)
            if built is None or built.version != version:
                # Read the version before loading: a write committed meanwhile bumps it again,
                # so the next search rebuilds (never a stale index marked current).
                memories = self._load(user_id)
                if not memories:
                    return []
                built = _UserIndex(version, memories)
                with self._lock:
                    self.builds += 1
                    self._built[user_id] = built
                    self._built.move_to_end(user_id)
                    while len(self._built) > self._max_users:
                        self._built.popitem(last=False)
            return built.search(query, top_k)
