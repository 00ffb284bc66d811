"""The answer context: retrieved memories in participant order, cut to the suite's token budget.

Rule: memories are taken in the participant's order and kept while the running total of their tokens
(content plus its date line) stays within ``budget_tokens``; the first memory that would pass the
budget and every memory after it are cut. The number cut is recorded in evidence (``memories_cut``) and
the kept tokens are an output metric (``context_tokens``). Memories are never reordered or rewritten.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aml_ray.tokens import count_tokens


@dataclass(frozen=True)
class AnswerContext:
    """Memories that go to the answer model.

    Attributes:
        memories: kept memories, participant order.
        tokens: tokens of the kept memories.
        cut: how many trailing memories were cut by the budget.
    """

    memories: list[dict[str, Any]]
    tokens: int
    cut: int


def memory_line(memory: dict[str, Any]) -> str:
    """How one memory appears in the prompt: ``[created_at] content`` (date only when given)."""
    created = memory.get("created_at")
    return f"[{created}] {memory['content']}" if created else str(memory["content"])


def fit_context(memories: list[dict[str, Any]], budget_tokens: int, model: str) -> AnswerContext:
    """Keep memories in order while they fit in ``budget_tokens`` (see the module rule).

    Raises:
        ValueError: ``budget_tokens`` < 1.
    """
    if budget_tokens < 1:
        raise ValueError(f"context budget must be >= 1 token, got {budget_tokens}")
    kept, total = [], 0
    for m in memories:
        n = count_tokens(memory_line(m), model)
        if total + n > budget_tokens:
            break
        kept.append(m)
        total += n
    return AnswerContext(memories=kept, tokens=total, cut=len(memories) - len(kept))


def speaker_blocks(memories: list[dict[str, Any]], speakers: list[str]) -> list[dict[str, Any]]:
    """Group memories into one ``<memories>`` block per speaker, keeping participant order in each.

    A memory belongs to a speaker when its content starts with ``"<speaker>:"`` (how LoCoMo turns are
    rendered); others go to a final block with ``speaker=None``. Empty blocks are dropped.

    Returns:
        ``[{"speaker": str | None, "memories": [...]}, ...]`` in speaker order, the shared block last.
    """
    blocks: dict[str | None, list[dict[str, Any]]] = {s: [] for s in speakers}
    blocks[None] = []
    for m in memories:
        owner = next((s for s in speakers if str(m["content"]).startswith(f"{s}:")), None)
        blocks[owner].append(m)
    return [{"speaker": s, "memories": ms} for s, ms in blocks.items() if ms]
