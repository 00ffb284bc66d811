"""Deterministic Textual chunker: sessions -> Add-sized chunks.

Rule (source: AML user documentation, "Ordinary Textual splits deterministically at either 20 messages
or 2,000 Adapter-counted words"; DESIGN.md "Chunking"):

- A session is split into consecutive chunks of at most :data:`MAX_CHUNK_MESSAGES` messages and at most
  :data:`MAX_CHUNK_WORDS` words, whichever limit is reached first.
- A chunk is closed *before* adding a message would make it exceed either limit; the message then starts
  the next chunk. A chunk of exactly 20 messages or exactly 2,000 words is therefore allowed.
- A single message longer than 2,000 words cannot fit any chunk, so it forms a chunk alone (the messages
  before and after it go into other chunks). Messages are never cut.
- A chunk never spans two sessions; a session without messages yields no chunk.
- Message order, content and timestamps are unchanged.
- ``Chunk.index`` is 0-based across the whole sample, in session order (``chunk-0``, ``chunk-1``, ...),
  which is the ``<n>`` of the request_id (see :mod:`aml_ray.ids`).

Word count ("Adapter-counted words"): the number of whitespace-separated tokens of a message's rendered
content, i.e. ``len(content.split())`` (Python's ``str.split()`` with no argument: any run of Unicode
whitespace separates tokens; leading/trailing whitespace is ignored). For LoCoMo the rendered content
includes the ``"<speaker>: "`` prefix and any ``[shares an image: ...]`` caption, since that is exactly
the text the participant receives.
"""

from __future__ import annotations

from collections.abc import Iterable

from aml_ray.contract import Message
from aml_ray.datasets.base import Chunk, Sample, Session
from aml_ray.media import text_of

#: Maximum messages per Textual chunk (AML user documentation: "20 messages or 2,000 ... words").
MAX_CHUNK_MESSAGES = 20
#: Maximum Adapter-counted words per Textual chunk (same source); see :func:`count_words`.
MAX_CHUNK_WORDS = 2000


def count_words(message: Message) -> int:
    """Adapter-counted words of one message.

    Args:
        message: a contract message whose ``content`` is the rendered text sent to the participant.

    Returns:
        ``len(message.content.split())``: whitespace-separated tokens of the rendered content
        (Multimodal: of its text parts; images count no words).
    """
    return len(text_of(message.content).split())


def split_messages(
    messages: Iterable[Message],
    *,
    max_messages: int = MAX_CHUNK_MESSAGES,
    max_words: int = MAX_CHUNK_WORDS,
) -> list[tuple[Message, ...]]:
    """Split one session's messages into consecutive groups under the Textual limits.

    Args:
        messages: the session's messages in source order.
        max_messages: message limit per group (default :data:`MAX_CHUNK_MESSAGES`; only tests change it).
        max_words: word limit per group (default :data:`MAX_CHUNK_WORDS`), counted by :func:`count_words`.

    Returns:
        The groups in order; concatenated they equal the input. Empty input gives an empty list.

    Raises:
        ValueError: if a limit is smaller than 1.
    """
    if max_messages < 1 or max_words < 1:
        raise ValueError(f"chunk limits must be >= 1, got max_messages={max_messages}, "
                         f"max_words={max_words}")
    groups: list[tuple[Message, ...]] = []
    current: list[Message] = []
    words = 0
    for message in messages:
        n = count_words(message)
        if current and (len(current) + 1 > max_messages or words + n > max_words):
            groups.append(tuple(current))
            current, words = [], 0
        current.append(message)
        words += n
    if current:
        groups.append(tuple(current))
    return groups


def chunk_session(sample_id: str, session: Session, *, start_index: int = 0) -> list[Chunk]:
    """Chunk one session.

    Args:
        sample_id: the owning sample's id (copied into every chunk).
        session: the session to split; its messages are kept as they are.
        start_index: the sample-wide index of this session's first chunk.

    Returns:
        The session's chunks with indices ``start_index, start_index + 1, ...``; empty for a session
        without messages.
    """
    return [
        Chunk(sample_id=sample_id, session_key=session.key, index=start_index + i, messages=group)
        for i, group in enumerate(split_messages(session.messages))
    ]


def chunk_sample(sample: Sample) -> list[Chunk]:
    """Chunk every session of a sample, in session order.

    Args:
        sample: the sample; its sessions are taken in the order given (adapters order them).

    Returns:
        All chunks of the sample, indices 0-based and contiguous across sessions; a chunk never holds
        messages of two sessions.
    """
    chunks: list[Chunk] = []
    for session in sample.sessions:
        chunks.extend(chunk_session(sample.sample_id, session, start_index=len(chunks)))
    return chunks
