"""Option-letter scoring for multiple-choice questions (ScriptMem): deterministic, no model.

Source: memorax-ai/ScriptMem ``src/score_mcq.py`` / ``src/evaluate.py`` (``score_item``) and its README
("Predicted answer format": single choice ``(B)``, multi-select ``(A, C, D)`` "must include all and only
correct options", ordering ``(D, A, C, B)`` "must match exact correct order"); DESIGN.md "Scoring
contracts". Rules, per question type (the row's ``category``):

- ``single_choice``: 1 when exactly one letter is given and it is the gold letter, else 0.
- ``multi_select``: 1 when the set of letters equals the gold set (order free), else 0.
- ``ordering``: 1 when the letter sequence equals the gold sequence exactly, else 0 (one swap is 0).

Letter extraction (:func:`extract_letters`), this project's rule, stricter than upstream's lenient
parser so that it never guesses:

1. The text after the last ``</think>`` is read (reasoning models); an empty answer is malformed.
2. A *letter group* is the inside of ``(...)`` or ``[...]`` that is only single letters separated by
   commas, semicolons or spaces: ``(B)``, ``(a, c)``, ``[D; A; C; B]``. Prose in parentheses is not a
   letter group, and neither are run-together letters (``(AC)``). If the answer has letter groups, they must all say the same thing (``(B) ... so (B)``
   is fine; ``(A) ... no, (B)`` is malformed).
3. Without a letter group, the whole answer (an ``Answer:`` or ``Final answer:`` label and a final
   period removed) may itself be a letter list: ``B``, ``A, C, D``.
4. Letters are case-insensitive and must name an option (``A`` .. the last option's letter); ``(X)``
   echoed from an example, or ``(G)`` with six options, is malformed.
5. **A repeated letter is malformed** (``(A, A, C)``, ``(D, A, D, B)``): as upstream (``score_item``
   requires ``len(pred) == len(set(pred))``; ``predicted_ordered_letters`` flags duplicates), a duplicate
   earns no extra credit and no benefit of the doubt: the question scores 0, even when the distinct
   letters equal the gold set.

A malformed answer scores 0; it is still ``scored`` (the participant's answer was judged), not an error.
Errors upstream of scoring (search, answer) keep their status and stay in the denominator.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from aml_ray.stages.scorers import register_scorer

#: The question types and their rule names.
RULES = ("single_choice", "multi_select", "ordering")

_THINK_END = "</think>"
_GROUP = re.compile(r"\(([^()]*)\)|\[([^\[\]]*)\]")
_LETTER_LIST = re.compile(r"^\s*[A-Za-z](?:(?:\s*[,;]\s*|\s+)[A-Za-z])*\s*$")
_LABEL = re.compile(r"^\s*(?:final\s+)?answer\s*[:：]\s*", re.IGNORECASE)


@dataclass(frozen=True)
class Extraction:
    """Letters read from an answer.

    Attributes:
        letters: the option letters, upper case, in the answer's order (empty when malformed).
        malformed: True when the answer breaks the format (then it scores 0).
        reason: why it is malformed, or ``"ok"``.
    """

    letters: tuple[str, ...]
    malformed: bool
    reason: str


def _letters(group: str) -> tuple[str, ...]:
    return tuple(ch.upper() for ch in group if ch.isalpha())


def extract_letters(answer: str | None, n_options: int) -> Extraction:
    """Read the option letters of an answer (rules 1-5 of the module docstring).

    Examples:
        >>> extract_letters("(D, A, C, B)", 4).letters
        ('D', 'A', 'C', 'B')
        >>> extract_letters("Answer: b.", 4).letters
        ('B',)
        >>> extract_letters("(A, A, C)", 4).reason
        'duplicate letter A'
        >>> extract_letters("I am not sure.", 4).malformed
        True

    Args:
        answer: the answer model's reply; None counts as empty.
        n_options: how many options the question has (letters ``A`` .. ``chr(ord("A") + n - 1)``).

    Returns:
        The :class:`Extraction`.

    Raises:
        ValueError: ``n_options`` is not in 1..26.
    """
    if not 1 <= n_options <= 26:
        raise ValueError(f"n_options must be in 1..26, got {n_options}")
    text = "" if answer is None else str(answer)
    if _THINK_END in text:
        text = text.rsplit(_THINK_END, 1)[1]
    if not text.strip():
        return Extraction((), True, "empty answer")
    groups = [g for m in _GROUP.finditer(text) if _LETTER_LIST.match(g := (m.group(1) or m.group(2) or ""))]
    if groups:
        distinct = {_letters(g) for g in groups}
        if len(distinct) > 1:
            return Extraction((), True, f"conflicting letter groups {sorted(distinct)}")
        letters = distinct.pop()
    else:
        bare = _LABEL.sub("", text.strip()).rstrip(". ")
        if not _LETTER_LIST.match(bare):
            return Extraction((), True, "no option letters found (expected e.g. '(B)' or '(A, C, D)')")
        letters = _letters(bare)
    valid = {chr(ord("A") + i) for i in range(n_options)}
    outside = [c for c in letters if c not in valid]
    if outside:
        return Extraction((), True, f"letter {outside[0]} is not an option (A-{chr(ord('A') + n_options - 1)})")
    seen: set[str] = set()
    for c in letters:
        if c in seen:
            return Extraction((), True, f"duplicate letter {c}")
        seen.add(c)
    return Extraction(letters, False, "ok")


def score_letters(rule: str, gold: list[str] | tuple[str, ...], predicted: Extraction) -> float:
    """Score extracted letters against the gold letters under one rule (module docstring).

    Examples:
        >>> score_letters("ordering", ["D", "A", "C", "B"], extract_letters("(D, C, A, B)", 4))
        0.0
        >>> score_letters("multi_select", ["A", "C"], extract_letters("(C, A)", 4))
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
        ok = set(pred) == set(gold)
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
    extraction = extract_letters(row["answer"], len(options))
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
