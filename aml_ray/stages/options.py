"""Option-letter scoring for multiple-choice questions (ScriptMem): deterministic, no model.

Source: memorax-ai/ScriptMem @ 22ac7e7e ``src/evaluate.py`` (the official evaluator; ``src/score_mcq.py``
has the same rules): ``normalize_prediction_text``, ``predicted_letters``, ``predicted_ordered_letters``,
``predicted_option_letters`` and ``score_item``; README "Predicted answer format". Answers are read as
upstream reads them, so a number from here can stand beside one from upstream's evaluator.

Reading an answer (:func:`read_letters`):

1. Normalise (:func:`normalize_prediction`): the answer stripped; if it holds ``\\box{...}`` or
   ``\\boxed{...}`` (a missing ``}`` at the end is tolerated), the inside of the last one is the answer;
   else the text after the first ``final answer:`` (any case), then the text after the first ``</think>``.
2. ``multi_select`` and ``ordering``: the inside of the last ``(...)`` or ``[...]`` (else the whole
   answer); every letter A-F in it, in order, upper-cased (``D -> A -> C -> B`` reads D, A, C, B; so does
   ``(D, A, C, B)``). A repeated letter is malformed (upstream's ``malformed_prediction``).
3. ``single_choice``: the whole answer when it is 1 to 5 letters A-F (``B``; ``AB`` reads A, B); two
   letter groups side by side (``(A)(B)``, ``[A][B]``) are malformed; else, from every ``(...)`` or
   ``[...]``: a lone letter (``(B)``), a labelled option (``(B. Juror 8)``, ``[B: Juror 8]``), or a short
   word of letters and spaces whose first letter is A-F (``(Bob)`` reads B: upstream's rule); the set
   of letters found, sorted.

Scoring (:func:`score_letters`, upstream ``score_item``), per question type (the row's ``category``):

- ``single_choice``: 1 when exactly one letter is read and it is the gold letter.
- ``multi_select``: 1 when the set of letters equals the gold set and no letter repeats (order free).
- ``ordering``: 1 when the letter sequence equals the gold sequence exactly (one swap is 0).
- A malformed answer scores 0. Upstream reads letters A-F only (ScriptMem has at most six options) and
  does not check them against the question's options: a letter that is not an option simply does not
  match the gold.

A malformed or unreadable answer is still ``scored`` (the participant's answer was judged), not an
error. Errors upstream of scoring (search, answer) keep their status and stay in the denominator.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from aml_ray.stages.scorers import register_scorer

#: The question types and their rule names.
RULES = ("single_choice", "multi_select", "ordering")

_BOX = re.compile(r"\\box(?:ed)?\{([^}]*)(?:\}|$)")
_FINAL = "final answer:"
_THINK_END = "</think>"
_LAST_GROUP = re.compile(r"[\(\[]([^)\]]*)[\)\]]")
_GROUP = re.compile(r"\([^)]*\)|\[[^\]]*\]")
_BARE = re.compile(r"[A-Fa-f]{1,5}")
_SIDE_BY_SIDE = (re.compile(r"\(\s*[A-Fa-f]\s*\)\(\s*[A-Fa-f]\s*\)"), re.compile(r"\[\s*[A-Fa-f]\s*\]\[\s*[A-Fa-f]\s*\]"))
_LONE = re.compile(r"([A-Fa-f])")
_LABELLED = re.compile(r"^([A-Fa-f])\s*[.:]\s*.+$")
_WORD = re.compile(r"[A-Za-z ]+")


@dataclass(frozen=True)
class Extraction:
    """Letters read from an answer.

    Attributes:
        letters: the option letters, upper case (in the answer's order for ``multi_select`` and
            ``ordering``, sorted and distinct for ``single_choice``); empty when none were read.
        malformed: True when upstream flags the answer as malformed (then it scores 0).
        reason: ``"ok"``, or why nothing usable was read.
    """

    letters: tuple[str, ...]
    malformed: bool
    reason: str


def normalize_prediction(answer: str | None) -> str:
    """The part of an answer that holds the letters (upstream ``normalize_prediction_text``; rule 1).

    Examples:
        >>> normalize_prediction("Reasoning... \\\\boxed{B}")
        'B'
        >>> normalize_prediction("<think>(A)?</think> Final Answer: (B)")
        '(B)'
    """
    cleaned = str(answer or "").strip()
    boxes = list(_BOX.finditer(cleaned))
    if boxes:
        return boxes[-1].group(1).strip()
    lower = cleaned.lower()
    if _FINAL in lower:
        cleaned = cleaned[lower.index(_FINAL) + len(_FINAL):].strip()
    if _THINK_END in cleaned:
        cleaned = cleaned.split(_THINK_END, 1)[1].strip()
    return cleaned


def _ordered(text: str) -> Extraction:
    groups = list(_LAST_GROUP.finditer(text))
    content = groups[-1].group(1) if groups else text
    letters = tuple(c.upper() for c in re.findall(r"[A-Fa-f]", content))
    if not letters:
        return Extraction((), False, "no option letters found")
    repeated = next((c for i, c in enumerate(letters) if c in letters[:i]), None)
    if repeated:
        return Extraction(letters, True, f"duplicate letter {repeated}")
    return Extraction(letters, False, "ok")


def _single(text: str) -> Extraction:
    if _BARE.fullmatch(text):
        return Extraction(tuple(c.upper() for c in text), False, "ok")
    if any(p.search(text) for p in _SIDE_BY_SIDE):
        return Extraction((), True, "letter groups side by side")
    found: set[str] = set()
    for m in _GROUP.finditer(text):
        inner = m.group(0)[1:-1].strip()
        if not inner:
            continue
        if lone := _LONE.fullmatch(inner):
            found.add(lone.group(1).upper())
        elif labelled := _LABELLED.match(inner):
            found.add(labelled.group(1).upper())
        else:
            letters_only = re.sub(r"[^A-Za-z]", "", inner)
            if letters_only and len(letters_only) <= 5 and inner[0].upper() in "ABCDEF" and _WORD.fullmatch(inner):
                found.add(inner[0].upper())
    if not found:
        return Extraction((), False, "no option letters found")
    return Extraction(tuple(sorted(found)), False, "ok")


def read_letters(answer: str | None, rule: str) -> Extraction:
    """Read the option letters of an answer as upstream does (rules 1-3 of the module docstring).

    Examples:
        >>> read_letters("D -> A -> C -> B", "ordering").letters
        ('D', 'A', 'C', 'B')
        >>> read_letters("(B. Juror 8)", "single_choice").letters
        ('B',)
        >>> read_letters("(A, A, C)", "multi_select").reason
        'duplicate letter A'
        >>> read_letters("I am not sure.", "single_choice").letters
        ()

    Args:
        answer: the answer model's reply; None counts as empty.
        rule: ``single_choice``, ``multi_select`` or ``ordering``.

    Returns:
        The :class:`Extraction`.

    Raises:
        ValueError: an unknown rule.
    """
    if rule not in RULES:
        raise ValueError(f"unknown option rule {rule!r}; expected one of {RULES}")
    text = normalize_prediction(answer)
    if not text:
        return Extraction((), False, "empty answer")
    return _single(text) if rule == "single_choice" else _ordered(text)


def score_letters(rule: str, gold: list[str] | tuple[str, ...], predicted: Extraction) -> float:
    """Score extracted letters against the gold letters under one rule (upstream ``score_item``).

    Examples:
        >>> score_letters("ordering", ["D", "A", "C", "B"], read_letters("(D, C, A, B)", "ordering"))
        0.0
        >>> score_letters("multi_select", ["A", "C"], read_letters("(C, A)", "multi_select"))
        1.0

    Args:
        rule: ``single_choice``, ``multi_select`` or ``ordering``.
        gold: the gold letters (upper case; in order for ``ordering``).
        predicted: the answer's :class:`Extraction`.

    Returns:
        1.0 or 0.0; 0.0 for a malformed answer.

    Raises:
        ValueError: an unknown rule or an empty gold.
    """
    if rule not in RULES:
        raise ValueError(f"unknown option rule {rule!r}; expected one of {RULES}")
    if not gold:
        raise ValueError("gold letters are empty")
    if predicted.malformed:
        return 0.0
    pred, gold = list(predicted.letters), [str(g).upper() for g in gold]
    if rule == "single_choice":
        ok = len(gold) == 1 and pred == gold
    elif rule == "multi_select":
        ok = set(pred) == set(gold) and len(pred) == len(set(pred))
    else:
        ok = pred == gold
    return 1.0 if ok else 0.0


def score_row(row: dict[str, Any]) -> None:
    """Fill one answered row's verdict, score and score_detail (the rule is the row's ``category``).

    Raises:
        ValueError: the row's category is not a rule, it has no options, or its gold is not a letter list.
    """
    rule, options = row["category"], row.get("options") or []
    if not options:
        raise ValueError(f"question {row.get('question_id')!r} has no options")
    gold = json.loads(row["gold"])
    gold = [gold] if isinstance(gold, str) else gold
    if not isinstance(gold, list) or not all(isinstance(g, str) and len(g) == 1 for g in gold):
        raise ValueError(f"question {row.get('question_id')!r}: gold {row['gold']} is not a list of letters")
    extraction = read_letters(row["answer"], rule)
    score = score_letters(rule, gold, extraction)
    verdict = "CORRECT" if score == 1.0 else "WRONG"
    detail = {"rule": rule, "gold": gold, **asdict(extraction)}
    row.update(verdict=verdict, score=score, score_detail=json.dumps(detail), judge_raw=None, judge_status="ok",
               judge_error=None, judge_attempts=0, judge_verdicts=[verdict])


@register_scorer("option_match")
async def option_rows(rows: list[dict[str, Any]], *, endpoint=None, model=None, prompt=None, f1_rule: str = "token",
                      max_parse_retries: int = 2, judge_runs: int = 1) -> None:
    """Score multiple-choice rows by their option letters, in place (no model is called).

    Follows :func:`aml_ray.stages.judge.judge_rows`' row conventions: fills ``verdict`` (CORRECT when the
    score is 1), ``score`` (1.0 / 0.0), ``score_detail`` (JSON: rule, gold, letters read, malformed,
    reason), the ``judge_*`` columns (status ``ok``, 0 model attempts) and the final ``status``. Lexical
    ``f1``/``bleu1`` do not apply to letters and stay null. A row that cannot be scored (unknown rule,
    no options, bad gold) gets ``status="judge_error"`` with the reason and stays in the denominator.

    Args:
        rows: question rows after Answer (``category`` is the rule, ``options`` the options, ``gold`` the
            JSON list of gold letters).
        endpoint, model, prompt, f1_rule, max_parse_retries, judge_runs: accepted for the scorer
            signature; unused (the scoring is deterministic).
    """
    for r in rows:
        if r["answer_status"] == "ok":
            try:
                score_row(r)
            except ValueError as exc:
                r.update(verdict=None, score=None, judge_status="error", judge_error=str(exc), judge_attempts=0,
                         judge_verdicts=["judge_error"])
        r["status"] = ("search_error" if r["search_status"] != "ok" else
                       "answer_error" if r["answer_status"] != "ok" else
                       "judge_error" if r["judge_status"] != "ok" else "scored")
