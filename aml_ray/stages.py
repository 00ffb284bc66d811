"""The pipeline's stages as Ray Data callable classes: Ingest -> Search -> Answer -> Judge.

Each stage receives a pyarrow batch of rows and returns one; rows are question rows of
:data:`aml_ray.evidence.QUESTION_SCHEMA` (the Ingest stage turns one sample row into that sample's
question rows). Stages never talk HTTP themselves: they send one actor call per batch to the
``ParticipantClient`` / ``ModelClient`` actors that own the connections and limits.

Errors: a :class:`~aml_ray.contract.ContractError` or a non-retryable participant status raised by an
actor propagates and stops the pipeline (seed: "Contract errors stop immediately"). Transient failures
that exhausted their retries are recorded in the row (``search_error``, ``answer_error``,
``judge_error``) and the question stays in the denominator.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from aml_ray.actors.participant import ParticipantError
from aml_ray.config import ModelEndpoint
from aml_ray.contract import ContractError
from aml_ray.evidence import ADD_SCHEMA, QUESTION_SCHEMA, RunDir, to_table, write_parquet_atomic
from aml_ray.offline import extractive_answer
from aml_ray.prompts import load_prompt
from aml_ray.scoring import JudgeParseError, bleu1, lexical_verdict, locomo_f1, parse_judge_label, token_f1


def _report(tracker, stage: str, n: int) -> None:
    if tracker is not None and n:
        tracker.incr.remote(stage, n)


async def _call_participant(ref, tracker):
    """Await a ParticipantClient call; a stage-stopping error is recorded on the tracker, then re-raised."""
    try:
        return await ref
    except ContractError as exc:
        failure = {"kind": "ContractError", "field": exc.field, "request_id": exc.request_id,
                   "summary": f"ContractError: field '{exc.field}': {exc.reason}"}
    except ParticipantError as exc:
        failure = {"kind": "ParticipantError", "status": exc.status, "request_id": exc.request_id,
                   "summary": f"ParticipantError: {exc}"}
    if tracker is not None:
        await tracker.record_failure.remote(failure)
    raise StageStopped(failure["summary"])


class StageStopped(RuntimeError):
    """Raised inside a stage after a contract error or non-retryable status was recorded on the tracker."""


class IngestStage:
    """Adds one sample's chunks in order, writes their evidence, and emits the sample's question rows.

    Input rows: ``{sample_id, adds_json, add_meta_json, questions_json}`` where ``adds_json`` is the
    ordered list of AddRequest dicts, ``add_meta_json`` their per-chunk metadata (chunk_index, n_words)
    and ``questions_json`` the sample's scorable question rows.

    Args:
        participant: the ``ParticipantClient`` actor handle.
        run_root: the run directory (Add evidence goes to ``evidence/adds/<sample_id>.parquet``; on a
            multi-node cluster it must be storage every node sees).
        tracker: optional ``ProgressTracker`` actor handle.
    """

    def __init__(self, participant, run_root: str, tracker=None):
        self.participant = participant
        self.run_dir = RunDir(Path(run_root))
        self.tracker = tracker

    async def __call__(self, batch: pa.Table) -> pa.Table:
        out: list[dict[str, Any]] = []
        for row in batch.to_pylist():
            adds = json.loads(row["adds_json"])
            meta = json.loads(row["add_meta_json"])
            outcomes = await _call_participant(self.participant.add_sample.remote(adds), self.tracker)
            evidence = [{
                "sample_id": row["sample_id"], "chunk_index": m["chunk_index"], "n_words": m["n_words"],
                "request_id": a["request_id"], "user_id": a["user_id"], "session_id": a["session_id"],
                "n_messages": len(a["messages"]), "request_sha256": o["request_sha256"],
                "status": o["status"], "http_status": o["http_status"], "attempts": o["attempts"],
                "retried_statuses": o["retried_statuses"], "latency_ms": o["latency_ms"],
                "elapsed_ms": o["elapsed_ms"], "contract": "ok" if o["status"] == "ok" else None,
                "error": o["error"],
            } for a, m, o in zip(adds, meta, outcomes)]
            write_parquet_atomic(to_table(evidence, ADD_SCHEMA), self.run_dir.add_file(row["sample_id"]))
            _report(self.tracker, "add", len(adds))
            out.extend(json.loads(row["questions_json"]))
        return to_table(out, QUESTION_SCHEMA)


class SearchStage:
    """Searches every question of a batch through the participant (one actor call per batch).

    Args:
        participant: the ``ParticipantClient`` actor handle.
        top_k: the suite's Top K (formal: 100).
        tracker: optional ``ProgressTracker`` actor handle.
    """

    def __init__(self, participant, top_k: int, tracker=None):
        self.participant, self.top_k, self.tracker = participant, top_k, tracker

    async def __call__(self, batch: pa.Table) -> pa.Table:
        rows = batch.to_pylist()
        items = []
        for r in rows:
            request: dict[str, Any] = {"query": r["question"], "user_id": r["user_id"], "top_k": self.top_k}
            if r["options"]:
                request["options"] = r["options"]
            items.append({"ref": r["ref"], "request": request})
        outcomes = await _call_participant(self.participant.search_batch.remote(items), self.tracker)
        for r, o in zip(rows, outcomes):
            r.update(search_status=o["status"], search_http_status=o["http_status"],
                     search_attempts=o["attempts"], search_retried_statuses=o["retried_statuses"],
                     search_latency_ms=o["latency_ms"], search_request_sha256=o["request_sha256"],
                     search_error=o["error"], memories=o["memories"], n_memories=len(o["memories"]),
                     contract="ok" if o["status"] == "ok" else None)
        _report(self.tracker, "search", len(rows))
        return to_table(rows, QUESTION_SCHEMA)


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
        _report(self.tracker, "answer", len(rows))
        return to_table(rows, QUESTION_SCHEMA)


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
        _report(self.tracker, "judge", len(rows))
        return to_table(rows, QUESTION_SCHEMA)


def _golds(gold_json: str) -> list[str]:
    gold = json.loads(gold_json)
    return [str(g) for g in gold] if isinstance(gold, list) else [str(gold)]


def _gold_text(gold_json: str) -> str:
    return " | ".join(_golds(gold_json))
