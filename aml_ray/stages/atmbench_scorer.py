"""Scoring contract ``atmbench_qs``: ATM-Bench's question score, by the row's ``qtype`` (its category).

- ``number`` and ``list_recall``: deterministic rules of :mod:`aml_ray.scoring.atmbench_qs`;
- ``open_end``: the judge model with the ``atmbench_judge`` prompt, which must reply with JSON
  ``{"accuracy": <0..1>}``; an unparsable reply is re-asked up to ``max_parse_retries`` times, then the
  row is ``judge_error`` (kept in the denominator). With the offline judge, the credit is Mem-Gallery's
  token F1 against the gold (a labelled stand-in, never an official score).

The dataset score is the mean credit over questions (:func:`aml_ray.scoring.aggregate`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from aml_ray.scoring.atmbench_qs import list_recall_score, number_score
from aml_ray.scoring.memgallery_f1 import memgallery_f1
from aml_ray.stages.memgallery_scorer import row_status
from aml_ray.stages.scorers import register_scorer

_JSON = re.compile(r"\{.*\}", re.DOTALL)


def parse_accuracy(text: str | None) -> float | None:
    """The ``accuracy`` of a judge reply (a number in [0, 1] or a boolean), or None when unreadable.

    Examples:
        >>> parse_accuracy('```json\\n{"accuracy": 1}\\n```'), parse_accuracy('{"accuracy": true}')
        (1.0, 1.0)
        >>> parse_accuracy("yes") is None
        True
    """
    m = _JSON.search(text or "")
    if not m:
        return None
    try:
        value = json.loads(m.group(0)).get("accuracy")
    except (ValueError, AttributeError):
        return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and 0 <= value <= 1:
        return float(value)
    return None


def _set(r: dict[str, Any], score: float, rule: str, raw: str | None = None, attempts: int = 0) -> None:
    verdict = "CORRECT" if score == 1.0 else "WRONG"
    r.update(verdict=verdict, score=score, judge_status="ok", judge_error=None, judge_attempts=attempts,
             judge_verdicts=[verdict], judge_raw=raw, score_detail=json.dumps({"rule": rule}))


@register_scorer("atmbench_qs")
async def atmbench_qs(rows: list[dict[str, Any]], *, endpoint=None, model=None, prompt=None,
                      f1_rule: str = "token", max_parse_retries: int = 2, judge_runs: int = 1) -> None:
    """Score ATM-Bench rows in place (see the module docstring).

    Args:
        rows: question rows after Answer; ``category`` is the qtype, ``gold`` the JSON answer (a list of
            ids for ``list_recall``).
        endpoint / model / prompt: the judge (``open_end`` only); offline when ``endpoint.offline``.
        max_parse_retries: re-asks of an unparsable judge reply.
    """
    open_rows = []
    for r in rows:
        if r["answer_status"] != "ok":
            continue
        gold = json.loads(r["gold"])
        if r["category"] == "number":
            _set(r, number_score(r["answer"] or "", str(gold)), "number")
        elif r["category"] == "list_recall":
            _set(r, list_recall_score(r["answer"] or "", [str(g) for g in gold]), "list_recall")
        elif endpoint is None or endpoint.offline or model is None:
            _set(r, memgallery_f1(r["answer"] or "", str(gold)), "open_end_offline_token_f1")
        else:
            open_rows.append(r)
    todo = open_rows
    for attempt in range(1, max_parse_retries + 2):
        if not todo:
            break
        batch = [[{"role": "user", "content": prompt.render(question=r["question"], gold=json.loads(r["gold"]),
                                                             answer=r["answer"])}] for r in todo]
        outcomes = await model.complete_batch(batch, max_tokens=64, prompt_sha256=prompt.sha256)
        again = []
        for r, o in zip(todo, outcomes):
            acc = parse_accuracy(o["text"]) if o["status"] == "ok" else None
            if acc is not None:
                _set(r, acc, "open_end_judge", o["text"], attempt)
            else:
                r.update(judge_status="error", judge_attempts=attempt, judge_raw=o.get("text"),
                         judge_error=o.get("error") or "judge reply has no JSON accuracy", judge_verdicts=["judge_error"])
                again.append(r)
        todo = again
    for r in rows:
        if r["answer_status"] == "ok" and r["judge_status"] is None:
            r.update(judge_status="error", judge_error="not judged")
        r["status"] = row_status(r) if r["answer_status"] == "ok" else (
            "search_error" if r["search_status"] != "ok" else "answer_error")
