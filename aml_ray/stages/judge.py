"""Judge stage: the judge model (or the offline lexical judge), plus token F1 and BLEU-1."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from aml_ray.config import ModelEndpoint
from aml_ray.evidence import QUESTION_SCHEMA, to_table
from aml_ray.prompts import load_prompt
from aml_ray.scoring import JudgeParseError, bleu1, lexical_verdict, locomo_f1, parse_judge_label, token_f1
from aml_ray.stages._common import report


class JudgeStage:
    """Judges each answer (judge model or offline lexical judge) and computes token F1 and BLEU-1.

    A judge reply that cannot be parsed is asked again up to ``max_parse_retries`` times, then recorded
    as ``judge_error`` (DESIGN.md "Scoring contracts"); the question stays in the denominator.

    Args:
        endpoint: the judge model endpoint (offline when it has no base_url).
        client: the judge ``ModelClient`` actor handle, or None when offline.
        prompt: name or path of the judge prompt template.
        max_parse_retries: extra asks after an unparsable reply.
        f1_rule: ``"locomo"`` (official LoCoMo per-category F1) or ``"token"`` (best token F1 over golds).
        tracker: optional ``ProgressTracker`` actor handle.
    """

    def __init__(self, endpoint: ModelEndpoint, client, prompt: str, max_parse_retries: int = 2,
                 f1_rule: str = "token", tracker=None):
        if f1_rule not in ("locomo", "token"):
            raise ValueError(f"f1_rule must be 'locomo' or 'token', got {f1_rule!r}")
        self.endpoint, self.client, self.tracker, self.f1_rule = endpoint, client, tracker, f1_rule
        self.prompt = load_prompt(prompt)
        self.max_parse_retries = max_parse_retries

    async def _judge_online(self, rows: list[dict[str, Any]]) -> None:
        pending = list(rows)
        for r in rows:
            r.update(judge_attempts=0, judge_status="error")
        for _ in range(1 + self.max_parse_retries):
            if not pending:
                break
            prompts = [[{"role": "user", "content": self.prompt.render(
                question=r["question"], gold=_gold_text(r["gold"]), answer=r["answer"])}] for r in pending]
            outcomes = await self.client.complete_batch.remote(prompts)
            still = []
            for r, o in zip(pending, outcomes):
                r["judge_attempts"] += o["attempts"]
                r["judge_raw"] = o["text"]
                if o["status"] != "ok":
                    r["judge_error"] = o["error"]
                    if o["error"] == "empty reply":
                        still.append(r)
                    continue
                try:
                    r.update(verdict=parse_judge_label(o["text"]), judge_status="ok", judge_error=None)
                except JudgeParseError as exc:
                    r["judge_error"] = str(exc)
                    still.append(r)
            pending = still

    async def __call__(self, batch: pa.Table) -> pa.Table:
        rows = batch.to_pylist()
        answered = [r for r in rows if r["answer_status"] == "ok"]
        if self.endpoint.offline:
            for r in answered:
                label, why = lexical_verdict(r["answer"], json.loads(r["gold"]))
                r.update(verdict=label, judge_raw=why, judge_status="ok", judge_attempts=1)
        elif answered:
            await self._judge_online(answered)
        for r in rows:
            if r["answer_status"] == "ok":
                golds = _golds(r["gold"])
                r["f1"] = (locomo_f1(r["answer"], json.loads(r["gold"]), r["category"])
                           if self.f1_rule == "locomo" else max(token_f1(r["answer"], g) for g in golds))
                r["bleu1"] = max(bleu1(r["answer"], g) for g in golds)
            if r["search_status"] != "ok":
                r["status"] = "search_error"
            elif r["answer_status"] != "ok":
                r["status"] = "answer_error"
            elif r["judge_status"] != "ok":
                r["status"] = "judge_error"
            else:
                r["status"] = "scored"
        report(self.tracker, "judge", len(rows))
        return to_table(rows, QUESTION_SCHEMA)


def _golds(gold_json: str) -> list[str]:
    gold = json.loads(gold_json)
    return [str(g) for g in gold] if isinstance(gold, list) else [str(gold)]


def _gold_text(gold_json: str) -> str:
    return " | ".join(_golds(gold_json))
