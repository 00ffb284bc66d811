"""Token counting with OpenAI's BPE encodings, offline, for texts of any length.

Uses ``bpe-openai`` (tiktoken-compatible API and the same BPE encodings, with the vocabularies shipped
inside the package). tiktoken itself downloads its vocabulary files at first use, which an air-gapped
evaluation cluster cannot do.

Rules (participant text is counted as it comes, so nothing in it may stop a run):

- Text that looks like a special token (``<|endoftext|>``) is counted as ordinary text, as the model API
  counts a message's content; ``bpe-openai``, like tiktoken, raises on it by default.
- ``bpe-openai`` refuses one encode of 1,000,000 characters or more, or of more than 200,000 tokens
  (``bpe_openai/tokenizer.py``). A text longer than :data:`PIECE_CHARS` is encoded in pieces cut just
  before a space that follows a non-space character. Both encodings' pre-tokenizer patterns split there
  anyway (no pattern matches a non-space followed by a space), and BPE runs on each pre-token alone, so
  the sum of the pieces is the whole text's count. A piece with no such space (one word of 50,000
  characters) is cut at :data:`PIECE_CHARS`, and its count may differ from the whole text's by a token.
- :data:`MAX_CHARS_PER_TOKEN` bounds the characters of one token, so a text of ``n`` characters has at
  least ``ceil(n / MAX_CHARS_PER_TOKEN)`` tokens: callers with a token budget cut a text that cannot fit
  on its length alone, before tokenising it (:func:`min_tokens`, :func:`aml_ray.models.context.fit_context`).
"""

from __future__ import annotations

from functools import lru_cache

DEFAULT_ENCODING = "o200k_base"  # gpt-4o / gpt-4o-mini / gpt-4.1 family

#: The longest token of o200k_base and cl100k_base, in UTF-8 bytes (runs of 128 spaces or dashes); a
#: character is at least one byte, so no token holds more characters (checked by
#: ``tests/test_long_memory.py::test_every_token_is_at_most_max_chars_per_token_characters``).
MAX_CHARS_PER_TOKEN = 128
#: Characters per encode call at most: a character is at most 4 UTF-8 bytes and a token at least one
#: byte, so a piece is under both of ``bpe-openai``'s limits (1,000,000 characters, 200,000 tokens).
PIECE_CHARS = 50_000
#: Texts up to this many characters are cached (see :func:`_count`); longer ones are encoded each time,
#: so the cache holds at most 4,096 x 16,384 characters.
CACHED_CHARS = 16_384


@lru_cache(maxsize=16)
def encoding_for(model: str):
    """The encoding of ``model``; unknown models (and the offline ones) use ``o200k_base``.

    ``bpe_openai`` is imported here, on the first count, not with this module: its import builds the
    encodings (about 0.4 s), which the driver, importing the pipeline's stages, never uses.
    """
    import bpe_openai

    try:
        return bpe_openai.encoding_for_model(model)
    except Exception:  # noqa: BLE001 - bpe_openai raises UnsupportedModelError/KeyError variants
        return bpe_openai.get_encoding(DEFAULT_ENCODING)


def count_tokens(text: str, model: str = "gpt-4o-mini") -> int:
    """Number of tokens of ``text`` in ``model``'s encoding (0 for empty text); any length, any content
    (see the module rules)."""
    if not text:
        return 0
    return _count(text, model) if len(text) <= CACHED_CHARS else _count_pieces(text, model)


def head_tokens(text: str, max_tokens: int, model: str = "gpt-4o-mini") -> str:
    """The text of ``text``'s first ``max_tokens`` tokens in ``model``'s encoding (``text`` itself when it
    has no more).

    Only the pieces (:data:`PIECE_CHARS`) up to the cut are encoded, so a text of any length is cut in
    the time of its head. A multi-byte character split by the cut is left out whole, so the result is a
    prefix of ``text`` of at most ``max_tokens`` tokens.

    Raises:
        ValueError: ``max_tokens`` is below 1.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    enc = encoding_for(model)
    kept: list[int] = []
    for piece in _pieces(text):
        kept.extend(enc.encode(piece, disallowed_special=()))
        if len(kept) > max_tokens:
            return enc.decode_bytes(kept[:max_tokens]).decode("utf-8", errors="ignore")
    return text


def min_tokens(text: str) -> int:
    """A lower bound of ``text``'s tokens in any encoding we use, from its length alone:
    ``ceil(len(text) / MAX_CHARS_PER_TOKEN)``."""
    return -(-len(text) // MAX_CHARS_PER_TOKEN)


@lru_cache(maxsize=4096)
def _count(text: str, model: str) -> int:
    # A participant returns the same memories to many questions of one user (LoCoMo with the reference
    # system: each of a sample's ~40 chunks comes back to most of its ~200 questions), and encoding is
    # the Answer stage's largest cost per question (measured: docs/benchmarks.md);
    # 4,096 entries hold every memory of the samples in flight.
    return _count_pieces(text, model)


def _count_pieces(text: str, model: str) -> int:
    enc = encoding_for(model)
    return sum(len(enc.encode(piece, disallowed_special=())) for piece in _pieces(text))


def _pieces(text: str):
    """``text`` in consecutive pieces of at most :data:`PIECE_CHARS` characters (see the module rule)."""
    start = 0
    while len(text) - start > PIECE_CHARS:
        end = start + PIECE_CHARS
        cut = text.rfind(" ", start + 1, end + 1)
        while cut > start and text[cut - 1].isspace():
            cut = text.rfind(" ", start + 1, cut)
        if cut <= start:
            cut = end
        yield text[start:cut]
        start = cut
    yield text[start:]
