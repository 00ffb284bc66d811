"""Token counting with OpenAI's BPE encodings, offline.

Uses ``bpe-openai`` (tiktoken-compatible API and the same BPE encodings, with the vocabularies shipped
inside the package). tiktoken itself downloads its vocabulary files at first use, which an air-gapped
evaluation cluster cannot do.
"""

from __future__ import annotations

from functools import lru_cache

import bpe_openai

DEFAULT_ENCODING = "o200k_base"  # gpt-4o / gpt-4o-mini / gpt-4.1 family


@lru_cache(maxsize=16)
def encoding_for(model: str):
    """The encoding of ``model``; unknown models (and the offline ones) use ``o200k_base``."""
    try:
        return bpe_openai.encoding_for_model(model)
    except Exception:  # noqa: BLE001 - bpe_openai raises UnsupportedModelError/KeyError variants
        return bpe_openai.get_encoding(DEFAULT_ENCODING)


def count_tokens(text: str, model: str = "gpt-4o-mini") -> int:
    """Number of tokens of ``text`` in ``model``'s encoding (0 for empty text)."""
    return _count(text, model) if text else 0


@lru_cache(maxsize=4096)
def _count(text: str, model: str) -> int:
    # A participant returns the same memories to many questions of one user (LoCoMo with the reference
    # system: each of a sample's ~40 chunks comes back to most of its ~200 questions), and encoding is
    # about 10 us per 100-character memory, the Answer stage's largest cost per question (measured);
    # 4,096 entries hold every memory of the samples in flight.
    return len(encoding_for(model).encode(text))
