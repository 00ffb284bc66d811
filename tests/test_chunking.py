"""Deterministic Textual chunker: 20 messages or 2,000 words, never across sessions."""

from __future__ import annotations

import pytest

from aml_ray.contract import Message
from aml_ray.datasets.base import Sample, Session
from aml_ray.datasets.chunking import (
    MAX_CHUNK_MESSAGES,
    MAX_CHUNK_WORDS,
    chunk_sample,
    chunk_session,
    count_words,
    split_messages,
)

T0 = 1_683_554_160_000


def msg(words: int = 1, i: int = 0) -> Message:
    """A message of exactly ``words`` whitespace tokens, timestamp T0 + i."""
    return Message(role="user" if i % 2 == 0 else "assistant",
                   content=" ".join(f"w{i}_{k}" for k in range(words)), timestamp=T0 + i)


def session(key: str, sizes: list[int], index: int = 1) -> Session:
    return Session(key=key, index=index, started_at_ms=T0,
                   messages=tuple(msg(w, i) for i, w in enumerate(sizes)))


def sizes_of(chunks) -> list[int]:
    return [len(c.messages) for c in chunks]


def test_limits_are_the_aml_rule():
    assert (MAX_CHUNK_MESSAGES, MAX_CHUNK_WORDS) == (20, 2000)


def test_count_words_is_whitespace_tokens():
    m = Message(role="user", content="  Alice:\tHi\n there  friend ")
    assert count_words(m) == 4


def test_exactly_20_messages_is_one_chunk():
    chunks = chunk_session("s", session("session_1", [1] * 20))
    assert sizes_of(chunks) == [20]


def test_21_messages_split_20_plus_1():
    chunks = chunk_session("s", session("session_1", [1] * 21))
    assert sizes_of(chunks) == [20, 1]
    assert [c.index for c in chunks] == [0, 1]


def test_41_messages_split_20_20_1():
    assert sizes_of(chunk_session("s", session("session_1", [1] * 41))) == [20, 20, 1]


def test_exactly_2000_words_across_messages_is_one_chunk():
    chunks = chunk_session("s", session("session_1", [1000, 600, 400]))
    assert sizes_of(chunks) == [3]


def test_2001_words_across_messages_closes_before_the_overflowing_message():
    chunks = chunk_session("s", session("session_1", [1000, 600, 401, 5]))
    assert sizes_of(chunks) == [2, 2]
    assert sum(count_words(m) for m in chunks[0].messages) == 1600


def test_single_oversized_message_is_a_chunk_alone():
    chunks = chunk_session("s", session("session_1", [3, 4, 2001, 5, 6]))
    assert sizes_of(chunks) == [2, 1, 2]
    assert count_words(chunks[1].messages[0]) == 2001


def test_oversized_message_first_and_last():
    assert sizes_of(chunk_session("s", session("session_1", [2001, 1]))) == [1, 1]
    assert sizes_of(chunk_session("s", session("session_1", [1, 2001]))) == [1, 1]
    assert sizes_of(chunk_session("s", session("session_1", [2001, 2500]))) == [1, 1]


def test_word_limit_wins_before_message_limit():
    chunks = chunk_session("s", session("session_1", [500] * 6))
    assert sizes_of(chunks) == [4, 2]


def test_message_limit_wins_before_word_limit():
    chunks = chunk_session("s", session("session_1", [99] * 25))
    assert sizes_of(chunks) == [20, 5]


def test_session_break_always_starts_a_new_chunk_and_indices_are_contiguous():
    sample = Sample(sample_id="conv-x", questions=(), sessions=(
        session("session_1", [1] * 3, 1),
        session("session_2", [1] * 21, 2),
        session("session_3", [], 3),
        session("session_10", [1] * 2, 4),
    ))
    chunks = chunk_sample(sample)
    assert [(c.session_key, len(c.messages)) for c in chunks] == [
        ("session_1", 3), ("session_2", 20), ("session_2", 1), ("session_10", 2)]
    assert [c.index for c in chunks] == list(range(4))
    assert {c.sample_id for c in chunks} == {"conv-x"}


def test_order_and_timestamps_are_preserved():
    sample = Sample(sample_id="conv-x", questions=(), sessions=(
        session("session_1", [700, 700, 700, 1, 2001, 3], 1),
        session("session_2", [1] * 45, 2),
    ))
    chunks = chunk_sample(sample)
    for s in sample.sessions:
        flat = [m for c in chunks if c.session_key == s.key for m in c.messages]
        assert flat == list(s.messages)  # same objects, same order, timestamps untouched


def test_chunking_is_deterministic():
    sample = Sample(sample_id="conv-x", questions=(),
                    sessions=(session("session_1", [300, 1500, 201, 2, 2500, 7] * 5, 1),))
    assert chunk_sample(sample) == chunk_sample(sample)


def test_split_messages_rejects_bad_limits():
    with pytest.raises(ValueError, match="max_messages"):
        split_messages([], max_messages=0)
