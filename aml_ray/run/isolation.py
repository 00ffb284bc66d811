"""Leak detection inside every run: a Search that returns another user_id's memory.

user_id is the only isolation boundary of the AML contract (DESIGN.md "IDs"). The platform knows what
every user_id of the run was sent (its Add messages and request_ids), so after the run's traffic it
checks each question's returned memories against the other users' Adds:

- **id rule**: the memory's ``id`` equals a request_id the run sent for another user_id;
- **content rule**: the memory's content holds, word for word after normalising (lower case, runs of
  whitespace as one space), a message of another user_id of at least :data:`MIN_WORDS` words that the
  question's own user was never sent, neither whole nor as part of one of its own messages. A message
  that several users were sent (LongMemEval's shared haystack sessions) belongs to each of them; one
  that only other users were sent is a leak however many of them share it. The "part of" clause matters
  because LongMemEval's haystacks lightly edit the sessions they share: one user's message can be
  another's with a sentence added in front, so the shorter one sits inside the longer user's own chunk.
  Participants that rewrite text (extracted facts, summaries) are not caught by this rule: it finds
  copies, which is what a store that ignores ``user_id`` returns.

A message is found in a memory through its first :data:`MIN_WORDS` words (an index of openings, one
entry per message, so a large corpus costs one pass over its messages), then confirmed by a substring
test of the whole message; a hit is then checked against the asking user's own messages (each user's
messages are kept as hashes into one table of distinct texts). Each distinct (user_id, memory) pair is
checked once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any


#: Shortest message (in words) the content rule uses: shorter ones ("ok", "haha, yes!") recur by chance.
MIN_WORDS = 8
#: Characters of a memory's content that are examined (a huge memory is cut, never skipped).
MAX_MEMORY_CHARS = 200_000
_SPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    """Lower case, whitespace runs as one space, trimmed."""
    return _SPACE.sub(" ", text).strip().lower()


@dataclass
class _Owners:
    """What each user_id of the run was sent: request_id -> user_id, message openings -> messages."""

    request_owner: dict[str, str]
    text_owners: dict[int, set[str]]  # hash(normalised message) -> user_ids sent it
    openings: dict[str, list[tuple[str, int]]]  # first MIN_WORDS words -> [(normalised message, its hash)]
    texts: dict[int, str] = field(default_factory=dict)  # hash -> normalised message of MIN_WORDS words or more
    user_texts: dict[str, set[int]] = field(default_factory=dict)  # user_id -> hashes of its messages

    def sent_within(self, user_id: str, message: str) -> bool:
        """True when ``user_id`` was sent ``message`` (normalised), whole or inside one of its own messages."""
        return any(message in self.texts[h] for h in self.user_texts.get(user_id, ()))


def _message_texts(add: dict[str, Any]) -> Iterator[str]:
    for m in add.get("messages", ()):
        content = m.get("content")
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):  # Multimodal parts: the text parts
            yield " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")


def index_adds(adds_by_user: Iterable[tuple[str, list[dict[str, Any]]]]) -> _Owners:
    """Index the run's Adds: ``[(user_id, [AddRequest dicts]), ...]`` -> who was sent what."""
    owners = _Owners({}, {}, {})
    for user_id, adds in adds_by_user:
        own = owners.user_texts.setdefault(user_id, set())
        for add in adds:
            owners.request_owner[add["request_id"]] = user_id
            for text in _message_texts(add):
                norm = normalise(text)
                words = norm.split(" ")
                if len(words) < MIN_WORDS:
                    continue  # too short to be a leak, and too short to hold one
                h = hash(norm)
                owners.texts.setdefault(h, norm)
                own.add(h)
                users = owners.text_owners.setdefault(h, set())
                if not users:
                    owners.openings.setdefault(" ".join(words[:MIN_WORDS]), []).append((norm, h))
                users.add(user_id)
    return owners


def _content_owner(content: str, user_id: str, owners: _Owners) -> tuple[str, str] | None:
    """``(other user_id, the message's first words)`` when ``content`` holds a message that others were sent
    and ``user_id`` was not, neither whole nor inside one of its own messages."""
    norm = normalise(content[:MAX_MEMORY_CHARS])
    words = norm.split(" ")
    for i in range(len(words) - MIN_WORDS + 1):
        candidates = owners.openings.get(" ".join(words[i:i + MIN_WORDS]))
        if not candidates:
            continue
        for message, h in candidates:
            users = owners.text_owners[h]
            if user_id in users or message not in norm or owners.sent_within(user_id, message):
                continue
            return sorted(users)[0], " ".join(words[i:i + MIN_WORDS])
    return None


class LeakFinder:
    """Checks question rows one at a time for memories of another user_id of the run (:func:`find_leaks`).

    Args:
        owners: :func:`index_adds` of the run's Adds.
        limit: stop checking after this many leaking questions (the run is failed by the first).

    Attributes:
        leaks: one dict per leaking question found so far, as :func:`find_leaks` returns them.
    """

    def __init__(self, owners: _Owners, *, limit: int = 1000) -> None:
        self.owners, self.limit = owners, limit
        self.leaks: list[dict[str, Any]] = []
        self._checked: dict[tuple[str, str, str], tuple[str, str, str] | None] = {}

    @property
    def full(self) -> bool:
        """``limit`` leaking questions were found: later rows are not checked."""
        return len(self.leaks) >= self.limit

    def check(self, row: dict[str, Any]) -> None:
        """Check one question row (``question_id``, ``user_id``, ``memories`` ``[{id, content}]``); a leak is
        appended to :attr:`leaks` (its first leaking memory). Does nothing once :attr:`full`."""
        if self.full:
            return
        user_id = row["user_id"]
        for rank, memory in enumerate(row.get("memories") or (), start=1):
            mid, content = memory.get("id") or "", memory.get("content") or ""
            key = (user_id, mid, content)
            if key not in self._checked:
                self._checked[key] = self._owner(user_id, mid, content)
            found = self._checked[key]
            if found is not None:
                self.leaks.append({"question_id": row["question_id"], "user_id": user_id, "memory_id": mid,
                                   "rank": rank, "owner_user_id": found[0], "rule": found[1], "evidence": found[2]})
                return

    def _owner(self, user_id: str, mid: str, content: str) -> tuple[str, str, str] | None:
        """``(other user_id, rule, evidence)`` when the memory belongs to another user_id, else None."""
        owner = self.owners.request_owner.get(mid)
        if owner is not None and owner != user_id:
            return owner, "id", f"request_id {mid}"
        hit = _content_owner(content, user_id, self.owners)
        return None if hit is None else (hit[0], "content", f"message starting {hit[1]!r}")


def find_leaks(rows: Iterable[dict[str, Any]], owners: _Owners, *, limit: int = 1000) -> list[dict[str, Any]]:
    """Questions whose memories belong to another user_id of the run.

    Args:
        rows: question rows with ``question_id``, ``user_id`` and ``memories`` (``[{id, content}]``).
        owners: :func:`index_adds` of the run's Adds.
        limit: stop after this many leaking questions (the run is failed by the first).

    Returns:
        One dict per leaking question (its first leaking memory): ``question_id``, ``user_id``,
        ``memory_id``, ``rank`` (1-based), ``owner_user_id``, ``rule`` (``id`` | ``content``), ``evidence``
        (the request_id, or the message's first words).
    """
    finder = LeakFinder(owners, limit=limit)
    for row in rows:
        finder.check(row)
        if finder.full:
            break
    return finder.leaks
