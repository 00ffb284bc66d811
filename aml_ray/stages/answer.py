"""Answer stage: the locked answer model (or the offline answerer) over the retrieved memories.

The context is the participant's memories in their order, cut to the token budget
(:mod:`aml_ray.context`); the cut and the token count go to evidence.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from aml_ray.actors.model import ActorModel
from aml_ray.config import ModelEndpoint
from aml_ray.context import fit_context, speaker_blocks
from aml_ray.evidence import QUESTION_SCHEMA, to_table
from aml_ray.offline import extractive_answer
from aml_ray.prompts import Prompt, load_prompt
from aml_ray.stages._common import report

#: Default context budget of the answer prompt's memories, in tokens.
DEFAULT_CONTEXT_BUDGET = 16_000
ANSWER_MAX_TOKENS = 256


async def answer_rows(rows: list[dict[str, Any]], *, endpoint: ModelEndpoint, model, prompt: Prompt,
                      budget_tokens: int = DEFAULT_CONTEXT_BUDGET) -> None:
    """Fill the answer columns of question rows in place.

    Args:
        rows: question rows after Search (see ``QUESTION_SCHEMA``).
        endpoint: the answer endpoint; offline uses :func:`aml_ray.offline.extractive_answer`.
        model: an object with ``async complete_batch(batch, **kw)`` (a ``ModelClient`` or ``ActorModel``);
            None when offline.
        prompt: the answer prompt template.
        budget_tokens: the context budget for the memories.
    """
    todo = []
    for r in rows:
        if r["search_status"] != "ok":
            r.update(answer_status="skipped", answer_error="search failed")
            continue
        ctx = fit_context(r["memories"] or [], budget_tokens, endpoint.model)
        r.update(context_tokens=ctx.tokens, memories_in_context=len(ctx.memories), memories_cut=ctx.cut)
        todo.append((r, ctx))
    if endpoint.offline:
        for r, ctx in todo:
            r.update(answer=extractive_answer(r["question"], ctx.memories), answer_status="ok",
                     answer_attempts=1, answer_latency_ms=0.0, answer_cached=False)
        return
    if not todo:
        return
    batch = [[{"role": "user", "content": prompt.render(
        question=r["question"], speakers=r["speakers"] or [], question_date=r["question_date"],
        options=r["options"] or [],
        memory_blocks=speaker_blocks(ctx.memories, r["speakers"] or []))}] for r, ctx in todo]
    outcomes = await model.complete_batch(batch, max_tokens=ANSWER_MAX_TOKENS, prompt_sha256=prompt.sha256)
    for (r, _), o in zip(todo, outcomes):
        r.update(answer=o["text"] if o["status"] == "ok" else None, answer_status=o["status"],
                 answer_error=o["error"], answer_latency_ms=o["latency_ms"], answer_attempts=o["attempts"],
                 prompt_tokens=o["prompt_tokens"], completion_tokens=o["completion_tokens"],
                 answer_cached=o["cached"], cost_usd=o["cost_usd"])


class AnswerStage:
    """Ray Data stage around :func:`answer_rows`.

    Args:
        endpoint: the answer model endpoint (offline when it has no base_url).
        client: the answer ``ModelClient`` actor handle, or None when offline.
        prompt: the answer prompt (a loaded :class:`Prompt`, or a shipped name or path).
        budget_tokens: the context budget for the memories, in tokens.
        tracker: optional ``ProgressTracker`` actor handle.
    """

    def __init__(self, endpoint: ModelEndpoint, client, prompt: Prompt | str, budget_tokens: int = DEFAULT_CONTEXT_BUDGET,
                 tracker=None):
        self.endpoint, self.tracker, self.budget = endpoint, tracker, budget_tokens
        self.model = ActorModel(client) if client is not None else None
        self.prompt = prompt if isinstance(prompt, Prompt) else load_prompt(prompt)

    async def __call__(self, batch: pa.Table) -> pa.Table:
        rows = batch.to_pylist()
        await answer_rows(rows, endpoint=self.endpoint, model=self.model, prompt=self.prompt,
                          budget_tokens=self.budget)
        report(self.tracker, "answer", len(rows))
        return to_table(rows, QUESTION_SCHEMA)
