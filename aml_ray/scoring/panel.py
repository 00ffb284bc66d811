"""The judge panel: one run's answers judged under several pinned protocols, and how far the verdicts agree.

A leaderboard whose order depends on one judge prompt is not neutral: the same answers can score tens of
points apart under two prompts. The panel re-judges stored answers under :data:`PANEL` and reports, per
run, each protocol's accuracy with its bootstrap interval, the pairwise agreement and Cohen's kappa
(:mod:`aml_ray.scoring.agreement`) and the questions on which the protocols disagree; against a
calibration set (:mod:`aml_ray.scoring.calibration`), each protocol's agreement and kappa with the human
verdicts; over several runs (a board), each run's rank under each protocol, Kendall's tau between the
protocols' rankings and the runs whose rank flips.

Protocols (:data:`PANEL`), each a versioned prompt file plus its reply rule
(:mod:`aml_ray.scoring.judge_protocols`):

- ``suite``: the run's own judge prompt and scorer (run.json ``prompts.judge``, pinned by its sha256);
- ``longmemeval-upstream``: LongMemEval's own yes/no prompt (``longmemeval_judge_upstream``) read as upstream
  reads it; for a dataset without LongMemEval question types its general variant (the one for
  ``single-session-user``: "answer yes if the response contains the correct answer");
- ``strict``: ``judge_strict``: one unhedged answer stating the gold, no reasoning.

Offline (no judge endpoint) every protocol has a lexical stand-in (:func:`offline_verdict`), recorded as
such: ``suite`` the offline lexical judge (:func:`aml_ray.scoring.lexical_verdict`); ``longmemeval-upstream``
"contains the correct answer" (a normalised gold occurs as a run of tokens in the normalised answer);
``strict`` a token F1 of at least :data:`STRICT_F1` with one gold (a short answer that is the gold). These
are this project's rules, not models: they show the panel's shape and the direction of each protocol,
not its size under a real judge.

Counting rules: a question's label is ``CORRECT`` when it was scored CORRECT, ``WRONG`` when scored
otherwise, else its status (``judge_error``, ``search_error``, ``answer_error``). Accuracy is over every
non-excluded question (credit 1 for CORRECT, else 0: the score table's rule, errors in the denominator);
agreement, kappa and disagreements are over the questions that were answered (those a judge saw).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from aml_ray.scoring.agreement import agreement, cohen_kappa, competition_ranks, kendall_tau
from aml_ray.scoring.bootstrap import mean_ci
from aml_ray.scoring.f1 import token_f1
from aml_ray.scoring.lexical_judge import lexical_verdict
from aml_ray.scoring.normalize import normalize_answer

STRICT_F1 = 0.8
"""Token F1 with a gold at or above which the offline stand-in of ``strict`` says CORRECT."""

GENERAL_VARIANT = "single-session-user"
"""The LongMemEval question type whose upstream prompt is used for a dataset without LongMemEval types."""

DISAGREEMENT_TEXT_CHARS = 300
"""The longest answer text kept per disagreement in the panel report (longer ones end in an ellipsis)."""


@dataclass(frozen=True)
class PanelProtocol:
    """One protocol of the panel.

    Attributes:
        name: ``suite``, ``longmemeval-upstream`` or ``strict``.
        prompt: the shipped judge prompt, None for the run's own.
        offline_rule: one line naming the lexical stand-in used without a judge endpoint.
    """

    name: str
    prompt: str | None
    offline_rule: str


PANEL: tuple[PanelProtocol, ...] = (
    PanelProtocol("suite", None, "offline lexical judge: token F1 >= 0.5 or the gold inside the answer"),
    PanelProtocol("longmemeval-upstream", "longmemeval_judge_upstream",
                  "the normalised gold occurs as a run of tokens in the normalised answer"),
    PanelProtocol("strict", "judge_strict", f"token F1 >= {STRICT_F1} with one gold"),
)

#: Scorers whose verdicts are binary labels, the only ones the panel re-judges.
PANEL_SCORERS = ("binary_judge", "category_judge")


def _contains(answer: str, gold: str) -> bool:
    gold_norm = normalize_answer(gold)
    return bool(gold_norm) and f" {gold_norm} " in f" {normalize_answer(answer)} "


def offline_verdict(protocol: str, answer: str | None, golds: str | Sequence[str]) -> tuple[str, str]:
    """The lexical stand-in verdict of ``protocol`` (module docstring), ``(label, rationale)``.

    Examples:
        >>> offline_verdict("suite", "A sunset over the lake.", ["sunset"])[0]
        'CORRECT'
        >>> offline_verdict("longmemeval-upstream", "A sunset over the lake.", ["sunset"])[0]
        'CORRECT'
        >>> offline_verdict("strict", "A sunset over the lake.", ["sunset"])[0]
        'WRONG'
        >>> offline_verdict("strict", "Sunset.", ["sunset"])[0]
        'CORRECT'

    Args:
        protocol: a :data:`PANEL` protocol name.
        answer: the stored answer (None counts as empty).
        golds: the acceptable answers, or one gold as a string (numbers as text).

    Raises:
        ValueError: unknown protocol, or no gold.
    """
    golds = [golds] if isinstance(golds, str) else [str(g) for g in golds]
    if not golds:
        raise ValueError("no gold answer: the panel needs at least one per question")
    text = "" if answer is None else str(answer)
    if protocol == "suite":
        return lexical_verdict(text, list(golds))
    if protocol == "longmemeval-upstream":
        hit = next((g for g in golds if _contains(text, g)), None)
        return ("CORRECT", f"gold {hit!r} is in the answer") if hit else ("WRONG", "no gold is in the answer")
    if protocol == "strict":
        best = max(token_f1(text, g) for g in golds)
        return ("CORRECT" if best >= STRICT_F1 else "WRONG"), f"best token F1 {best:.3f} (strict needs {STRICT_F1})"
    raise ValueError(f"unknown panel protocol {protocol!r}; known: {[p.name for p in PANEL]}")


def label_of(row: Mapping[str, Any]) -> str:
    """A judged question's label for the panel (module counting rules).

    Examples:
        >>> label_of({"status": "scored", "verdict": "CORRECT"}), label_of({"status": "scored", "verdict": "WRONG"})
        ('CORRECT', 'WRONG')
        >>> label_of({"status": "judge_error", "verdict": None})
        'judge_error'
    """
    if row.get("status") == "scored":
        return "CORRECT" if row.get("verdict") == "CORRECT" else "WRONG"
    return str(row.get("status"))


def _clip(text: Any) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= DISAGREEMENT_TEXT_CHARS else text[:DISAGREEMENT_TEXT_CHARS - 1] + "…"


def _golds(gold_json: str) -> list[str]:
    gold = json.loads(gold_json)
    return [str(g) for g in gold] if isinstance(gold, list) else [str(gold)]


def run_report(judged: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """One run's panel report from its rows judged under each protocol.

    Args:
        judged: protocol name -> that protocol's judged question rows (``question_id``, ``excluded``,
            ``answer_status``, ``status``, ``verdict``, ``question``, ``gold`` as JSON, ``answer``,
            ``category``), the same questions in the same order under every protocol.

    Returns:
        ``{"protocols": [{name, accuracy, ci_low, ci_high, questions, answered, judge_errors}],
        "pairs": [{a, b, agreement, kappa, questions}], "spread": max - min accuracy (points of a share),
        "disagreements": [{question_id, category, question, gold, answer, labels: {protocol: label}}]}``;
        accuracy and its interval are shares in [0, 1], None for a run with no question.

    Raises:
        ValueError: the protocols' rows are not the same questions in the same order.
    """
    names = list(judged)
    kept = {p: [r for r in rows if not r.get("excluded")] for p, rows in judged.items()}
    ids = [r["question_id"] for r in kept[names[0]]]
    for p in names[1:]:
        if [r["question_id"] for r in kept[p]] != ids:
            raise ValueError(f"protocol {p!r} judged other questions than {names[0]!r}; judge the same rows")
    labels = {p: [label_of(r) for r in kept[p]] for p in names}
    answered = [i for i, r in enumerate(kept[names[0]]) if r.get("answer_status") == "ok"]
    protocols = []
    for p in names:
        credits = [1.0 if label == "CORRECT" else 0.0 for label in labels[p]]
        low, high = mean_ci(credits)
        protocols.append({"name": p, "accuracy": sum(credits) / len(credits) if credits else None,
                          "ci_low": low, "ci_high": high, "questions": len(credits), "answered": len(answered),
                          "judge_errors": sum(label == "judge_error" for label in labels[p])})
    pairs = []
    for a, b in combinations(names, 2):
        la, lb = [labels[a][i] for i in answered], [labels[b][i] for i in answered]
        pairs.append({"a": a, "b": b, "agreement": agreement(la, lb), "kappa": cohen_kappa(la, lb),
                      "questions": len(answered)})
    disagreements = []
    for i in answered:
        by = {p: labels[p][i] for p in names}
        if len(set(by.values())) > 1:
            r = kept[names[0]][i]
            disagreements.append({"question_id": r["question_id"], "category": r.get("category"),
                                  "question": r.get("question"), "gold": _golds(r["gold"]),
                                  "answer": _clip(r.get("answer")), "labels": by})
    accuracies = [p["accuracy"] for p in protocols if p["accuracy"] is not None]
    return {"protocols": protocols, "pairs": pairs,
            "spread": max(accuracies) - min(accuracies) if accuracies else None, "disagreements": disagreements}


def calibration_report(human: Sequence[str], judged: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """Each protocol's agreement and Cohen's kappa with a calibration set's human verdicts.

    Examples:
        >>> r = calibration_report(["CORRECT", "CORRECT", "WRONG", "WRONG"],
        ...                        {"suite": ["CORRECT", "CORRECT", "CORRECT", "WRONG"]})
        >>> r["protocols"][0]["agreement"], round(r["protocols"][0]["kappa"], 3)
        (0.75, 0.5)

    Args:
        human: the human verdicts, one per item.
        judged: protocol name -> its label per item (same order), as :func:`label_of` gives them.

    Returns:
        ``{"items": n, "human_correct": share CORRECT, "protocols": [{name, agreement, kappa, accuracy}]}``.

    Raises:
        ValueError: a protocol's labels are not one per item.
    """
    protocols = [{"name": p, "agreement": agreement(human, labels), "kappa": cohen_kappa(human, labels),
                  "accuracy": sum(x == "CORRECT" for x in labels) / len(labels) if labels else None}
                 for p, labels in judged.items()]
    return {"items": len(human), "human_correct": sum(h == "CORRECT" for h in human) / len(human) if human else None,
            "protocols": protocols}


def board_report(scores: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    """Ranks of several runs under each protocol, Kendall's tau between protocols, and ranks that flip.

    Examples:
        >>> b = board_report({"x": {"suite": 0.9, "strict": 0.3}, "y": {"suite": 0.6, "strict": 0.7},
        ...                   "z": {"suite": 0.3, "strict": 0.2}})
        >>> b["ranks"]["x"], b["flips"]
        ({'suite': 1, 'strict': 2}, ['x', 'y'])
        >>> round(b["taus"][0]["tau"], 6)
        0.333333

    Args:
        scores: run name -> protocol name -> accuracy; every run scored under the same protocols.

    Returns:
        ``{"ranks": {run: {protocol: rank}}, "taus": [{a, b, tau}], "flips": [runs whose rank is not the
        same under every protocol]}``; rank 1 is the best, ties share a rank; tau None where undefined.

    Raises:
        ValueError: the runs were not scored under the same protocols.
    """
    runs = list(scores)
    protocols = list(next(iter(scores.values()), {}))
    for run in runs:
        if list(scores[run]) != protocols:
            raise ValueError(f"run {run!r} was scored under {list(scores[run])}, the board under {protocols}")
    by_protocol = {p: competition_ranks({run: scores[run][p] for run in runs}) for p in protocols}
    ranks = {run: {p: by_protocol[p][run] for p in protocols} for run in runs}
    taus = [{"a": a, "b": b, "tau": kendall_tau([scores[r][a] for r in runs], [scores[r][b] for r in runs])}
            for a, b in combinations(protocols, 2)]
    flips = [run for run in runs if len(set(ranks[run].values())) > 1]
    return {"ranks": ranks, "taus": taus, "flips": flips}
