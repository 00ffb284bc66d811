"""Reference baselines: built-in participants that bracket every score.

Each speaks the AML contract through the reference server (``python -m aml_ray.reference --baseline NAME``,
``aml-ray run --participant reference:NAME``); Adds are stored as the BM25 reference stores them
(:class:`~aml_ray.reference.store.MemoryStore`: idempotent, 409 on a changed body), only Search differs:

- ``none``: returns nothing, so the score is the answer model's prior. A system below it is harmful.
- ``full-context``: returns the user's whole conversation as it was added, in order, cut to the context
  budget by dropping the **oldest** messages (LoCoMo's long-context baseline truncates the earliest
  dialogue): the newest messages whose prompt lines fit the budget (each message one line
  ``[created_at] content``, counted with the answer model's tokenizer, :mod:`aml_ray.models.tokens`), packed
  into at most ``top_k`` memories, one per Add request while they fit, consecutive requests merged when
  there are more than ``top_k``. A memory's ``created_at`` is left out (each line carries its own date),
  so the answer stage's own cut (:func:`aml_ray.models.context.fit_context`) keeps every memory.
- ``oracle``: returns the question's gold evidence turns, in source order: LoCoMo ``evidence`` dia_ids,
  LongMemEval answer sessions (every turn of each; the adapter does not keep ``has_answer``), the turns
  :func:`aml_ray.scoring.evidence_recall.evidence_messages` resolves. A question without resolvable
  evidence gets nothing. A system near it is retrieval-saturated.

The oracle finds the question by its Search: ``user_id`` names the sample (``eval:<run>:<dataset>:<sample>``,
:mod:`aml_ray.ids`) and ``query`` is the question's text, sent unchanged. Two questions of one sample with the
same text get the union of their evidence.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aml_ray.contract import SearchRequest
from aml_ray.datasets.base import Sample, turn_ids
from aml_ray.media import text_of
from aml_ray.models.tokens import count_tokens
from aml_ray.reference.store import Memory, MemoryStore

#: The reference systems ``--participant reference:NAME`` names: the BM25 store and the baselines.
BASELINES = ("none", "full-context", "oracle")
REFERENCE_SYSTEMS = ("bm25", *BASELINES)

#: ``(store, request) -> the Search response's data items`` (each ``{id, content, created_at?}``).
Searcher = Callable[[MemoryStore, SearchRequest], list[dict[str, Any]]]


def iso_utc(ms: int | None) -> str | None:
    """Unix milliseconds -> ``2023-05-07T13:56:00.000Z``; None for None or an out-of-range value."""
    if ms is None:
        return None
    try:
        dt = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def gold_memories(sample: Sample) -> dict[str, list[dict[str, Any]]]:
    """Each question of ``sample`` -> its gold evidence turns as Search memories, in source order.

    Returns:
        ``{question_id: [{"id": "gold:<turn id>", "content": <turn text>, "created_at": <ISO or None>}]}``;
        an empty list for a question whose evidence names no turn or session of the sample.
    """
    from aml_ray.scoring.evidence_recall import evidence_messages

    order = {tid: i for i, tid in enumerate(tid for session in sample.sessions for tid in turn_ids(session))}
    out: dict[str, list[dict[str, Any]]] = {}
    for qid, (units, _) in evidence_messages(sample).items():
        turns = {tid: m for unit in units for tid, m in unit}
        out[qid] = [{"id": f"gold:{tid}", "content": text_of(turns[tid].content),
                     "created_at": iso_utc(turns[tid].timestamp)}
                    for tid in sorted(turns, key=lambda t: order.get(t, 0))]
    return out


def no_memories(store: MemoryStore, body: SearchRequest) -> list[dict[str, Any]]:
    """The ``none`` baseline's Search: nothing, whatever was added."""
    return []


class Oracle:
    """The ``oracle`` baseline's Search over a dataset's samples (module docstring).

    Args:
        samples: the dataset's samples (their questions' evidence and sessions).
    """

    def __init__(self, samples: Iterable[Sample]):
        self.by_sample: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for sample in samples:
            gold = gold_memories(sample)
            by_text = self.by_sample.setdefault(sample.sample_id, {})
            for q in sample.questions:
                merged = {m["id"]: m for m in [*by_text.get(q.question, []), *gold[q.question_id]]}
                by_text[q.question] = list(merged.values())

    def __call__(self, store: MemoryStore, body: SearchRequest) -> list[dict[str, Any]]:
        """The gold turns of the question ``body.query`` asks in the sample ``body.user_id`` names."""
        parts = body.user_id.split(":", 3)
        sample = parts[3] if len(parts) == 4 and parts[0] == "eval" else None
        return self.by_sample.get(sample, {}).get(text_of(body.query), [])[:body.top_k]


class FullContext:
    """The ``full-context`` baseline's Search: the newest messages that fit the budget (module docstring).

    Args:
        budget_tokens: the run's context budget, in tokens (>= 1).
        model: the answer model whose tokenizer counts them.

    Raises:
        ValueError: ``budget_tokens`` < 1.
    """

    def __init__(self, budget_tokens: int, model: str):
        if budget_tokens < 1:
            raise ValueError(f"full-context: the context budget must be >= 1 token, got {budget_tokens}")
        self.budget, self.model = budget_tokens, model

    @staticmethod
    def line(memory: Memory) -> str:
        """One message as a prompt line: ``[created_at] content`` (the date only when the message had one)."""
        created = iso_utc(memory.timestamp_ms)
        return f"[{created}] {memory.content}" if created else memory.content

    def kept(self, memories: list[Memory]) -> list[Memory]:
        """The newest ``memories`` whose lines, one token each for the newline between them, fit the budget."""
        total, start = 0, len(memories)
        while start > 0:
            n = count_tokens(self.line(memories[start - 1]), self.model) + 1
            if total + n > self.budget:
                break
            total, start = total + n, start - 1
        return memories[start:]

    @staticmethod
    def packed(memories: list[Memory], top_k: int) -> list[list[Memory]]:
        """``memories`` grouped by Add request, in order; more groups than ``top_k`` merged, consecutive ones
        together, into ``top_k`` groups of near-equal numbers of requests."""
        groups: list[list[Memory]] = []
        for m in memories:
            if groups and groups[-1][-1].request_id == m.request_id:
                groups[-1].append(m)
            else:
                groups.append([m])
        if len(groups) <= top_k:
            return groups
        size = -(-len(groups) // top_k)
        return [[m for g in groups[i:i + size] for m in g] for i in range(0, len(groups), size)]

    def __call__(self, store: MemoryStore, body: SearchRequest) -> list[dict[str, Any]]:
        """The conversation of ``body.user_id`` cut to the budget, as at most ``body.top_k`` memories."""
        kept = self.kept(store.memories(body.user_id))
        while kept:
            items = [{"id": f"{g[0].id}..{g[-1].id}", "content": "\n".join(self.line(m) for m in g)}
                     for g in self.packed(kept, body.top_k)]
            if sum(count_tokens(i["content"], self.model) for i in items) <= self.budget:
                return items
            kept = kept[1:]  # the newlines counted as one token each merged otherwise: drop the oldest message
        return []


def searcher(name: str, *, samples: Iterable[Sample] | None = None, budget_tokens: int | None = None,
             model: str | None = None) -> Searcher:
    """The Search of baseline ``name``.

    Args:
        name: one of :data:`BASELINES`.
        samples: the dataset's samples (``oracle`` only).
        budget_tokens / model: the context budget and answer model (``full-context`` only).

    Raises:
        ValueError: an unknown name, or a baseline without what it needs, naming the missing option.
    """
    if name == "none":
        return no_memories
    if name == "oracle":
        if samples is None:
            raise ValueError("baseline 'oracle' needs the dataset: pass --dataset and --data")
        return Oracle(samples)
    if name == "full-context":
        if budget_tokens is None or model is None:
            raise ValueError("baseline 'full-context' needs --context-budget and --answer-model")
        return FullContext(budget_tokens, model)
    raise ValueError(f"unknown baseline {name!r}: expected one of {', '.join(BASELINES)}")


def baseline_options(participant: str, dataset, data, budget_tokens: int, model: str,
                     allow_hash_mismatch: bool = False) -> dict[str, Any] | None:
    """The reference server's options for ``--participant reference:<baseline>`` on one dataset, or None for
    any other participant.

    Args:
        participant: the ``--participant`` value.
        dataset: the run's :class:`~aml_ray.datasets.registry.DatasetSpec`.
        data: the ``--data`` path, or None for the pinned file (resolved from the cache for the oracle).
        budget_tokens / model: the run's context budget and answer model (``full-context``).
        allow_hash_mismatch: as the run's ``--allow-hash-mismatch`` (resolving the pinned file).
    """
    if not participant.startswith("reference:") or participant == "reference:bm25":
        return None
    options: dict[str, Any] = {"context_budget": budget_tokens, "answer_model": model}
    if participant == "reference:oracle":
        from aml_ray.config import cache_dir

        path = data if data is not None else dataset.resolve(None, cache_dir(), allow_hash_mismatch)
        options.update(dataset=dataset.name, data=str(Path(path).resolve()))
    return options
