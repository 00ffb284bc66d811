"""Failure attribution: why each wrong question of a run was wrong.

Every non-excluded question whose credit is below 1 (the score table's rule,
:func:`aml_ray.explain.reanswer.credit_of`) gets exactly one class, checked in this order:

1. ``error``: its Search, answer or judge failed (``status`` is not ``scored``): nothing to attribute.
2. ``judge_disagreement``: the run judged each answer several times (``--judge-runs``) and its verdicts differ:
   the protocol, not the memory, decides it.
3. ``no_gold_evidence``: the dataset names no evidence for it that resolves to turns of the sample
   (:func:`aml_ray.reference.baselines.gold_memories`; e.g. LoCoMo items whose ``evidence`` is empty).
4. ``unanswerable_with_gold``: answered again with its gold evidence as the only memories (the run's locked
   answer model and judge, :meth:`~aml_ray.explain.reanswer.RunModels.reanswer`), it is still wrong: the item,
   the answer model or the judge fails it, whatever the memory returns.
5. ``synthesis_miss``: the gold was among the memories the Search returned (evidence recall's fuzzy rule,
   :func:`aml_ray.scoring.evidence_recall.question_recall`: ``first_rank`` set), yet the answer was wrong.
6. ``retrieval_miss``: the gold was not returned, and with it the answer is correct.

The classes' counts sum to the wrong count. Beside them: ``P(correct | gold retrieved in top K)`` for each
K of :data:`aml_ray.scoring.evidence_recall.KS`, over the questions with gold evidence whose Search
succeeded, and ``P(correct | gold not retrieved)``. A Streaming run's rows are attributed one by one (a
question searched at two checkpoints counts twice, as in its table).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from aml_ray.explain.reanswer import RunModels, credit_of
from aml_ray.scoring.evidence_recall import KS, question_recall, resolve_units

#: The classes, in the order they are checked (module docstring).
CLASSES = ("error", "judge_disagreement", "no_gold_evidence", "unanswerable_with_gold", "synthesis_miss",
           "retrieval_miss")


def _base_id(question_id: str) -> str:
    return question_id.split("@", 1)[0]


def attribute(models: RunModels) -> dict[str, Any]:
    """Attribute every wrong question of the run (module rules); answers the wrong ones again with their gold.

    Returns:
        ``{"questions": n, "wrong": n, "counts": {class: n}, "shares": {class: share of wrong},
        "p_correct_given_gold_in_top": {"K": p or None}, "p_correct_given_gold_not_retrieved": p or None,
        "rows": [{"question_id", "category", "class", "first_rank", "gold_answer", "gold_credit"}]}``.
    """
    from aml_ray.reference.baselines import gold_memories

    rows = [r for r in models.rows() if not r["excluded"]]
    wanted = {r["sample_id"] for r in rows}
    gold: dict[tuple[str, str], list[dict[str, Any]]] = {}
    units: dict[tuple[str, str], list] = {}
    for sample in models.samples():
        if sample.sample_id not in wanted:
            continue
        for qid, memories in gold_memories(sample).items():
            gold[(sample.sample_id, qid)] = memories
        for qid, (found, _) in resolve_units(sample).items():
            units[(sample.sample_id, qid)] = found
    first_rank: dict[str, int | None] = {}
    for r in rows:
        key = (r["sample_id"], _base_id(r["question_id"]))
        if r["search_status"] == "ok" and units.get(key):
            first_rank[r["question_id"]] = question_recall(units[key], r["memories"] or [])["first_rank"]
    wrong = [r for r in rows if credit_of(r) < 1.0]
    classes: dict[str, str] = {}
    to_reanswer = []
    for r in wrong:
        verdicts = [v for v in (r["judge_verdicts"] or []) if v is not None]
        if r["status"] != "scored":
            classes[r["question_id"]] = "error"
        elif len(set(verdicts)) > 1:
            classes[r["question_id"]] = "judge_disagreement"
        elif not gold.get((r["sample_id"], _base_id(r["question_id"]))):
            classes[r["question_id"]] = "no_gold_evidence"
        else:
            to_reanswer.append({**r, "memories": gold[(r["sample_id"], _base_id(r["question_id"]))],
                                "search_status": "ok"})
    answered = {a["question_id"]: a for a in models.reanswer(to_reanswer)}
    for qid, a in answered.items():
        classes[qid] = ("unanswerable_with_gold" if credit_of(a) < 1.0 else
                        "synthesis_miss" if first_rank.get(qid) is not None else "retrieval_miss")
    counts = Counter(classes.values())
    with_gold = [r for r in rows if r["question_id"] in first_rank]

    def p_correct(members: list[dict[str, Any]]) -> float | None:
        return sum(credit_of(r) >= 1.0 for r in members) / len(members) if members else None

    return {
        "questions": len(rows), "wrong": len(wrong),
        "counts": {c: counts.get(c, 0) for c in CLASSES},
        "shares": {c: (counts.get(c, 0) / len(wrong) if wrong else None) for c in CLASSES},
        "with_gold_evidence": len(with_gold),
        "p_correct_given_gold_in_top": {
            str(k): p_correct([r for r in with_gold if (first_rank[r["question_id"]] or k + 1) <= k]) for k in KS},
        "p_correct_given_gold_not_retrieved": p_correct([r for r in with_gold if first_rank[r["question_id"]] is None]),
        "rows": [{"question_id": r["question_id"], "category": r["category"], "class": classes[r["question_id"]],
                  "first_rank": first_rank.get(r["question_id"]),
                  "gold_answer": answered[r["question_id"]]["answer"] if r["question_id"] in answered else None,
                  "gold_credit": credit_of(answered[r["question_id"]]) if r["question_id"] in answered else None}
                 for r in wrong],
    }


def explain_failures(run_root: Path, models: RunModels | None = None) -> dict[str, Any]:
    """:func:`attribute` for the run in ``run_root``, cached in ``RUN_DIR/explain/attribution.json`` (a second
    call with the same models and prompts reads it and calls no model).

    Raises:
        FileNotFoundError / ValueError: as :class:`~aml_ray.explain.reanswer.RunModels`.
    """
    models = models or RunModels(run_root)
    return models.cached("attribution", {"analysis": "attribution", "classes": list(CLASSES)},
                         lambda: attribute(models))
