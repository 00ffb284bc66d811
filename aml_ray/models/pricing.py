"""Cost estimates from a price table (USD per million tokens).

The shipped table lists list prices (input, output) published by the providers; an operator replaces
it with ``AML_PRICE_TABLE=/path/prices.json`` (``{"model": [input_usd_per_mtok, output_usd_per_mtok]}``).
A model missing from the table has no estimate (None), never a guess.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path

SHIPPED_PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1": (2.00, 8.00),
}


@lru_cache(maxsize=4)
def _load(path: str | None) -> dict[str, tuple[float, float]]:
    if not path:
        return dict(SHIPPED_PRICES)
    raw = json.loads(Path(path).read_text())
    table = {}
    for model, pair in raw.items():
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, (int, float)) for x in pair)):
            raise ValueError(f"AML_PRICE_TABLE {path}: entry {model!r} must be [input_usd_per_mtok, "
                             "output_usd_per_mtok]")
        table[model] = (float(pair[0]), float(pair[1]))
    return table


def price_table() -> dict[str, tuple[float, float]]:
    """The active table (``AML_PRICE_TABLE`` file or the shipped one)."""
    return _load(os.environ.get("AML_PRICE_TABLE"))


def estimate_cost_usd(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    """USD estimate for one call, or None when the model has no price."""
    prices = price_table().get(model)
    if prices is None:
        return None
    return (prompt_tokens * prices[0] + completion_tokens * prices[1]) / 1_000_000
