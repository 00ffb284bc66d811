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
    """Number of tokens of ``text`` in ``model``'s encoding."""
    return len(encoding_for(model).encode(text)) if text else 0
