"""Answer stage: the locked answer model (or the offline answerer) over the retrieved memories."""

from __future__ import annotations

import pyarrow as pa

from aml_ray.config import ModelEndpoint
from aml_ray.evidence import QUESTION_SCHEMA, to_table
from aml_ray.offline import extractive_answer
from aml_ray.prompts import load_prompt
from aml_ray.stages._common import report


class AnswerStage:
    """Answers each searched question with the locked answer model (or the offline answerer).

    Args:
        endpoint: the answer model endpoint (offline when it has no base_url).
        client: the answer ``ModelClient`` actor handle, or None when offline.
        prompt: name or path of the answer prompt template.
        tracker: optional ``ProgressTracker`` actor handle.
    """

    def __init__(self, endpoint: ModelEndpoint, client, prompt: str, tracker=None):
        self.endpoint, self.client, self.tracker = endpoint, client, tracker
        self.prompt = load_prompt(prompt)

    async def __call__(self, batch: pa.Table) -> pa.Table:
        rows = batch.to_pylist()
        todo = [r for r in rows if r["search_status"] == "ok"]
        for r in rows:
            if r["search_status"] != "ok":
                r.update(answer_status="skipped", answer_error="search failed")
        if self.endpoint.offline:
            for r in todo:
                r.update(answer=extractive_answer(r["question"], r["memories"]), answer_status="ok",
                         answer_attempts=1, answer_latency_ms=0.0)
        elif todo:
            prompts = [[{"role": "user", "content": self.prompt.render(
                question=r["question"], memories=r["memories"], speakers=r["speakers"] or [])}] for r in todo]
            outcomes = await self.client.complete_batch.remote(prompts)
            for r, o in zip(todo, outcomes):
                r.update(answer=o["text"] if o["status"] == "ok" else None, answer_status=o["status"],
                         answer_error=o["error"], answer_latency_ms=o["latency_ms"],
                         answer_attempts=o["attempts"], prompt_tokens=o["prompt_tokens"],
                         completion_tokens=o["completion_tokens"])
        report(self.tracker, "answer", len(rows))
        return to_table(rows, QUESTION_SCHEMA)
