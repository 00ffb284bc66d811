"""Rubric judge (BEAM): an LLM rates every rubric item 1 / 0.5 / 0; the question's credit follows BEAM's rules.

Source: mohammadtavakoli78/BEAM ``evaluation.py`` (read at 5a64c992: ``evaluate_<ability>``, one judge call per
rubric item with ``unified_llm_judge_base_prompt``, ``score += int(response['score'])`` then / number of
items for nine abilities, ``float(...)`` for event ordering; ``event_ordering_score``), ``src/prompts.py``
(the 1.0 / 0.5 / 0.0 scale) and ``src/evaluation/report_results.py`` (``report_llms_accuracies``: the reported
score of an ability is the mean of ``llm_judge_score``, and of ``tau_norm`` for event ordering); DESIGN.md "Scoring contracts" (an unparsable judge reply is retried a bounded
number of times, then recorded as ``judge_error`` and kept in the denominator).

Rules:

- Every rubric item is judged on its own (prompt ``mode="item"``); the reply must hold a JSON
  ``{"score": <number in [0, 1]>}`` (:func:`parse_rubric_score`); the prompt asks for 1.0, 0.5 or 0.0, and
  another number in range (``0.7``) is read, as upstream reads it, then credited by the rule below.
  Upstream leaves the prompt's ``<question>`` placeholder unfilled; here the question is filled in.
- Item credit (:func:`item_credit`), by the credit rule of the judge prompt's protocol
  (:mod:`aml_ray.scoring.judge_protocols`):

  - ``upstream_int`` (the default, every prompt without a declaration, e.g. ``beam_rubric_judge``): as
    upstream, ``int(score)`` for the nine abilities other than event ordering, so 0.5 and 0.7 count 0;
    event ordering's rubric items keep their score (upstream reads them with ``float``).
  - ``half_credit`` (the ``beam-half-credit`` protocol, prompt ``beam_rubric_judge_half_credit``: the same
    wording): every item counts the highest step of the prompt's scale 1 / 0.5 / 0 that its score
    reaches (0.7 counts 0.5).

- A question's score: for event ordering (``category == "event_ordering"``), ``tau_norm`` of
  :func:`ordering_score`, the value upstream's ``report_results.py`` averages for that ability
  (``evaluate_event_ordering`` also returns ``final_score`` = ``tau_norm`` x F1, which the report does not
  use; ``score_detail["ordering"]["final"]`` keeps it); for the nine other abilities, the mean item
  credit. ``score_detail["rubric_mean"]`` keeps the mean item credit of every question.
- Event ordering alignment: the answer is split into items (its non-blank lines; upstream splits on
  ``"\\n"`` and keeps blank lines, which only add false positives); one judge call (prompt
  ``mode="align"``) maps each answer item to the reference event it describes (the rubric items, in gold
  order) or to none, each reference used once (upstream asks YES/NO per pair and takes the first match;
  the result is the same kind of one-to-one alignment); then :func:`ordering_score`.
- Undefined orderings (rule "one item is in order"): with one item in all (one reference event,
  answered by exactly that event) upstream's ``kendalltau`` is NaN, and so is its ``tau_norm``, which
  turns the whole ability's reported mean into NaN; here ``tau_norm`` is defined as 1.0 (a single event
  cannot be out of order), so the question scores 1.0. With no answer item at all ``tau_norm`` is 0.0
  (rule "no answer item": nothing was ordered; upstream splits a blank reply into one empty item and
  scores it low as well). ``score_detail["ordering"]["undefined_tau"]`` says
  which rule applied.
- An unparsable or empty reply is asked again, bypassing the reply cache, up to ``max_parse_retries``
  times. A question whose score needs a reply that stays unparsed (a rubric item of the nine abilities,
  the alignment of event ordering) gets ``status="judge_error"`` (score null: it counts 0 and stays in
  the denominator); what did parse is kept in ``score_detail`` for audit.
- ``verdict`` = ``CORRECT`` only for a score of 1, else ``WRONG``. ``judge_verdicts`` has one entry per
  judging run: ``CORRECT`` (1), ``WRONG`` (0), ``judge_error``, or the run's partial credit as a decimal
  string (``"0.625"``), which :func:`aml_ray.scoring.judge_runs.run_credits` reads.
- Offline (no judge endpoint) a lexical stand-in replaces the model (:func:`lexical_item_score`,
  :func:`lexical_alignment`); it is this project's rule, not BEAM's, and the run says the models were
  offline.
- Lexical ``f1``/``bleu1`` are the best token F1 / BLEU-1 against the reference answer (when the
  question has one), as for the binary judge.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from aml_ray.scoring import bleu1, stemmed_tokens, token_f1
from aml_ray.scoring.judge_parse import ReplyParseError
from aml_ray.scoring.judge_protocols import protocol_of
from aml_ray.stages.asking import ask_until_parsed
from aml_ray.stages.judge import golds_of
from aml_ray.stages.scorers import register_scorer

#: Completion limit of one rubric-item or alignment reply.
RUBRIC_MAX_TOKENS = 512
#: The steps of BEAM's item scale, which the ``half_credit`` rule rounds a score down to.
ITEM_SCORES = (0.0, 0.5, 1.0)
#: The BEAM ability whose answers are scored for order.
ORDERING_CATEGORY = "event_ordering"
#: Item credit rules (module docstring); ``upstream_int`` is the default.
CREDIT_RULES = ("upstream_int", "half_credit")
#: What ``score_detail["ordering"]["undefined_tau"]`` says when tau-b is undefined.
ONE_ITEM = "one item: nothing to order (upstream NaN); tau_norm defined as 1.0"
NO_ANSWER_ITEM = "no answer item: tau_norm defined as 0.0 (F1 is 0)"
#: Offline stand-in: token recall of a rubric item in the answer for full / half credit.
LEXICAL_FULL, LEXICAL_HALF = 0.8, 0.4
#: Offline stand-in: token recall of a reference event in an answer item to count as the same event.
LEXICAL_MATCH = 0.5

_SCORE_LINE = re.compile(
    r"""^[\s>*#_\-]*["']?score["']?[\s*_]*[:=][\s*_]*["']?(\d+(?:\.\d+)?|\.\d+)["']?[\s*_.,]*$""",
    re.IGNORECASE | re.MULTILINE)
_RUBRIC_PREFIX = re.compile(r"^\s*LLM response should [A-Za-z ]{1,40}?:\s*", re.IGNORECASE)
_DECODER = json.JSONDecoder()


class RubricParseError(ReplyParseError):
    """A rubric-judge reply holds no usable score (or alignment)."""


# ------------------------------------------------------------------------------------------ parsing


def _objects(text: str) -> list[Any]:
    """Every outermost JSON (or Python-literal) object or list in ``text``, in order."""
    found, i = [], 0
    while True:
        starts = [j for j in (text.find("{", i), text.find("[", i)) if j != -1]
        if not starts:
            return found
        i = min(starts)
        try:
            obj, end = _DECODER.raw_decode(text, i)
        except ValueError:
            obj, end = None, None
            close = {"{": "}", "[": "]"}[text[i]]
            depth = 0
            for k in range(i, min(len(text), i + 20_000)):
                depth += text[k] == text[i]
                depth -= text[k] == close
                if depth == 0:
                    try:
                        obj, end = ast.literal_eval(text[i:k + 1]), k + 1
                    except (ValueError, SyntaxError, MemoryError, RecursionError):
                        pass
                    break
        if end is not None and isinstance(obj, (dict, list)):
            found.append(obj)
            i = end
        else:
            i += 1


def _values(obj: Any, key: str) -> list[Any]:
    """Values of every ``key`` (any case) in a decoded object, depth first."""
    out: list[Any] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(k, str) and k.strip().lower() == key:
                out.append(v)
            else:
                out.extend(_values(v, key))
    elif isinstance(obj, list):
        for v in obj:
            out.extend(_values(v, key))
    return out


def _item_score(value: Any) -> float | None:
    """A score value as a number in [0, 1], or None when it is no number or out of range."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value.strip()) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        return None
    return number if 0.0 <= number <= 1.0 else None


def parse_rubric_score(text: str | None) -> float:
    """The score of one rubric-judge reply, a number in [0, 1] (the prompt asks for 1.0, 0.5 or 0.0).

    Accepted forms: a JSON object with a ``score`` key (alone, fenced, embedded in prose, nested, in a
    list, or as a Python literal with single quotes; a numeric string value is read as a number), or a
    line holding only ``score: <value>``. Several scores in one reply must agree.

    Examples:
        >>> parse_rubric_score('{"score": 0.5, "reason": "partly"}')
        0.5
        >>> parse_rubric_score("```json\\n[{'score': '1.0'}]\\n```")
        1.0
        >>> parse_rubric_score("Reason: the date is missing.\\nScore: 0")
        0.0
        >>> parse_rubric_score('{"score": 0.7}')  # off the scale, read as upstream reads it
        0.7

    Args:
        text: the judge's reply, verbatim.

    Returns:
        The item score.

    Raises:
        RubricParseError: an empty reply, no score, a score that is no number in [0, 1] (``"high"``,
            ``true``, ``1.5``), or conflicting scores.
    """
    if text is None or not str(text).strip():
        raise RubricParseError("empty judge reply", text)
    reply = str(text)
    raw = [v for obj in _objects(reply) for v in _values(obj, "score")]
    if not raw:
        raw = [m.group(1) for m in _SCORE_LINE.finditer(reply)]
    if not raw:
        raise RubricParseError('no score found (expected JSON {"score": 1.0|0.5|0.0})', reply)
    scores = [_item_score(v) for v in raw]
    if None in scores:
        raise RubricParseError("a score is not a number in [0, 1] (expected 1.0, 0.5 or 0.0)", reply)
    if len(set(scores)) > 1:
        raise RubricParseError("conflicting scores in judge reply", reply)
    return scores[0]  # type: ignore[return-value]


def parse_alignment(text: str | None, n_answer: int, n_reference: int) -> list[int | None]:
    """The alignment reply: for each answer item, the 0-based reference index it matches, or None.

    The reply must hold a JSON object ``{"matches": [...]}`` with exactly ``n_answer`` entries, each a
    1-based reference number or 0 / null for "none" (numeric strings are read as numbers). A reference
    number given twice keeps its first answer item; later ones become None (each reference is matched
    at most once, as upstream's ``align_with_llm``).

    Examples:
        >>> parse_alignment('{"matches": [2, 0, 1, 2]}', 4, 3)
        [1, None, 0, None]

    Args:
        text: the judge's reply.
        n_answer: how many answer items were sent.
        n_reference: how many reference items were sent.

    Returns:
        One entry per answer item.

    Raises:
        RubricParseError: no ``matches`` list, a list of another length, or an entry that is not a
            number in 0..``n_reference``.
    """
    if text is None or not str(text).strip():
        raise RubricParseError("empty judge reply", text)
    lists = [v for obj in _objects(str(text)) for v in _values(obj, "matches") if isinstance(v, list)]
    if not lists:
        raise RubricParseError('no "matches" list found', text)
    if any(lst != lists[0] for lst in lists):
        raise RubricParseError('conflicting "matches" lists', text)
    entries = lists[0]
    if len(entries) != n_answer:
        raise RubricParseError(f'"matches" has {len(entries)} entries for {n_answer} answer items', text)
    out: list[int | None] = []
    used: set[int] = set()
    for e in entries:
        if e is None or (isinstance(e, str) and e.strip().lower() in ("", "none", "null")):
            out.append(None)
            continue
        number = _reference_number(e)
        if number is None or not 0 <= number <= n_reference:
            raise RubricParseError(f"match {e!r} is not a reference number in 0..{n_reference}", text)
        if number == 0 or number - 1 in used:
            out.append(None)
        else:
            used.add(number - 1)
            out.append(number - 1)
    return out


def _reference_number(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


# ------------------------------------------------------------------------------------------ ordering


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b rank correlation, with the tie correction.

    ``tau_b = (P - Q) / sqrt((P + Q + T_y) * (P + Q + T_x))`` over all pairs ``i < j``: ``P`` pairs
    ordered the same way in ``x`` and ``y`` (concordant), ``Q`` ordered oppositely (discordant), ``T_x``
    tied in ``x`` only, ``T_y`` tied in ``y`` only; pairs tied in both count nowhere. Source: M. G.
    Kendall, "The treatment of ties in ranking problems", Biometrika 33 (1945) 239-251; the same
    statistic as ``scipy.stats.kendalltau(x, y, variant="b")``, which BEAM calls (scipy is not a
    dependency here, and the O(n^2) count is exact for the few items of an ordering question).

    Examples:
        >>> kendall_tau_b([1, 2, 3, 4], [2, 1, 3, 4])
        0.6666666666666666
        >>> round(kendall_tau_b([1, 2, 3, 4], [1, 2, 3, 3]), 6)
        0.912871

    Args:
        x: ranks (or any comparable numbers) of the items in one ordering.
        y: the same items' ranks in the other ordering.

    Returns:
        tau-b in [-1, 1]; NaN when undefined (fewer than two items, or one side all tied).

    Raises:
        ValueError: ``x`` and ``y`` differ in length.
    """
    if len(x) != len(y):
        raise ValueError(f"x and y must have the same length, got {len(x)} and {len(y)}")
    p = q = tx = ty = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx, dy = (x[i] > x[j]) - (x[i] < x[j]), (y[i] > y[j]) - (y[i] < y[j])
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                tx += 1
            elif dy == 0:
                ty += 1
            elif dx == dy:
                p += 1
            else:
                q += 1
    denominator = math.sqrt((p + q + ty) * (p + q + tx))
    return (p - q) / denominator if denominator else math.nan


def ordering_score(n_reference: int, matches: Sequence[int | None]) -> dict[str, Any]:
    """BEAM's event-ordering score from an alignment (upstream ``event_ordering_score``).

    The reference is events ``0 .. n_reference - 1`` in gold order; the answer is its items in answer
    order, each replaced by the reference event it matches (``matches[k]``) or kept as its own unmatched
    item. ``tp`` = matched events, ``fp`` = unmatched answer items, ``fn`` = unmatched events;
    precision, recall, F1 from those. Over the union of items (reference events first, then unmatched
    answer items), each ordering ranks its own items ``1, 2, ...`` and ties every item it lacks at
    ``len(union) + 1``; tau-b between the two rank vectors (:func:`kendall_tau_b`) is normalised to
    ``(tau + 1) / 2`` and ``final = tau_norm * f1``. Where tau-b is undefined (upstream's ``tau_norm`` is then
    NaN), ``tau_b`` is None and ``undefined_tau`` says the rule used: one item in all is in order
    (``tau_norm`` 1.0, :data:`ONE_ITEM`); an answer with no item gets ``tau_norm`` 0.0 (:data:`NO_ANSWER_ITEM`).

    Examples:
        >>> ordering_score(3, [0, 2, 1])["final"]  # all three events, one adjacent pair swapped
        0.6666666666666666
        >>> round(ordering_score(3, [0, 1, None])["final"], 4)  # two events in order, one extra item
        0.5556
        >>> ordering_score(1, [0])["final"], ordering_score(1, [0])["tau_b"]
        (1.0, None)

    Args:
        n_reference: number of reference events (rubric items), >= 1.
        matches: per answer item, the 0-based reference index it matches or None; a reference index
            appears at most once.

    Returns:
        ``{precision, recall, f1, tau_b, tau_norm, final, undefined_tau}`` (``tau_b`` and ``undefined_tau``
        None when tau-b is defined), each number in [0, 1] except ``tau_b`` in [-1, 1].

    Raises:
        ValueError: ``n_reference < 1``, an index out of range, or an index used twice.
    """
    if n_reference < 1:
        raise ValueError(f"n_reference must be >= 1, got {n_reference}")
    used = [m for m in matches if m is not None]
    if any(not 0 <= m < n_reference for m in used) or len(set(used)) != len(used):
        raise ValueError(f"matches {list(matches)} must be distinct indices in 0..{n_reference - 1} or None")
    reference = [("ref", i) for i in range(n_reference)]
    system = [("ref", m) if m is not None else ("answer", k) for k, m in enumerate(matches)]
    tp = len(used)
    fp = len(system) - tp
    fn = n_reference - tp
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    union = list(dict.fromkeys(reference + system))
    tie = len(union) + 1

    def ranks(seq: list[tuple[str, int]]) -> list[int]:
        position = {item: i + 1 for i, item in enumerate(seq)}
        return [position.get(u, tie) for u in union]

    tau = kendall_tau_b(ranks(reference), ranks(system))
    undefined = None if not math.isnan(tau) else ONE_ITEM if len(union) < 2 else NO_ANSWER_ITEM
    tau_norm = (tau + 1) / 2 if undefined is None else 1.0 if undefined == ONE_ITEM else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "tau_b": None if undefined else tau,
            "tau_norm": tau_norm, "final": tau_norm * f1, "undefined_tau": undefined}


def item_credit(score: float, category: str, rule: str = "upstream_int") -> float:
    """The credit of one rubric item's score under a credit rule (module docstring).

    Examples:
        >>> item_credit(0.5, "information_extraction"), item_credit(0.5, "event_ordering")
        (0.0, 0.5)
        >>> item_credit(0.7, "information_extraction"), item_credit(0.7, "event_ordering")
        (0.0, 0.7)
        >>> item_credit(0.5, "information_extraction", "half_credit"), item_credit(0.7, "x", "half_credit")
        (0.5, 0.5)

    Args:
        score: the judge's item score in [0, 1] (the prompt asks for 1.0, 0.5 or 0.0).
        category: the question's BEAM ability.
        rule: one of :data:`CREDIT_RULES`.

    Raises:
        ValueError: an unknown rule.
    """
    if rule not in CREDIT_RULES:
        raise ValueError(f"unknown credit rule {rule!r}; expected one of {CREDIT_RULES}")
    if rule == "half_credit":
        return max(step for step in ITEM_SCORES if step <= score + 1e-9)
    if category != ORDERING_CATEGORY:
        return float(int(score))
    return float(score)


def answer_items(answer: str | None) -> list[str]:
    """The items of an ordered answer: its non-blank lines, stripped, in order."""
    return [line.strip() for line in str(answer or "").splitlines() if line.strip()]


# ------------------------------------------------------------------------------------------ offline


def _recall(needle: str, haystack: str) -> float:
    tokens = set(stemmed_tokens(needle))
    return len(tokens & set(stemmed_tokens(haystack))) / len(tokens) if tokens else 0.0


def lexical_item_score(item: str, answer: str | None) -> float:
    """Offline stand-in for the item judge (this project's rule, not BEAM's): token recall.

    The item's ``"LLM response should <verb>:"`` prefix is dropped; the share of its normalised, stemmed
    tokens found in the answer gives 1.0 at >= :data:`LEXICAL_FULL`, 0.5 at >= :data:`LEXICAL_HALF`, else 0.

    Examples:
        >>> lexical_item_score("LLM response should state: 8 weeks", "It is 8 weeks.")
        1.0
    """
    recall = _recall(_RUBRIC_PREFIX.sub("", item), str(answer or ""))
    return 1.0 if recall >= LEXICAL_FULL else 0.5 if recall >= LEXICAL_HALF else 0.0


def lexical_alignment(reference: Sequence[str], items: Sequence[str]) -> list[int | None]:
    """Offline stand-in for the alignment judge: each answer item, in order, takes the first unused
    reference event whose token recall in the item is >= :data:`LEXICAL_MATCH` (greedy, as upstream)."""
    used: set[int] = set()
    out: list[int | None] = []
    for item in items:
        match = next((i for i, ref in enumerate(reference) if i not in used and _recall(ref, item) >= LEXICAL_MATCH),
                     None)
        if match is not None:
            used.add(match)
        out.append(match)
    return out


# ------------------------------------------------------------------------------------------ judging


async def _ask(model, prompts: list[str], parse: Callable[[str, int], Any], prompt_sha256: str,
               max_parse_retries: int, first_uses_cache: bool) -> list[dict[str, Any]]:
    """:func:`aml_ray.stages.asking.ask_until_parsed` with the rubric judge's completion limit."""
    return await ask_until_parsed(model, prompts, parse, prompt_sha256=prompt_sha256, max_tokens=RUBRIC_MAX_TOKENS,
                                  max_parse_retries=max_parse_retries, first_uses_cache=first_uses_cache)


async def judge_rubric_items(rows: list[dict[str, Any]], *, model, prompt, max_parse_retries: int = 2,
                             use_cache: bool = True) -> list[list[dict[str, Any]]]:
    """Judge every rubric item of every row once; the building block of rubric scorers.

    Args:
        rows: answered question rows with ``question``, ``rubric`` and ``answer``.
        model: an object with ``async complete_batch(batch, **kw)``; None for the offline stand-in.
        prompt: the judge prompt, rendered with ``mode="item"``, ``question``, ``rubric_item``, ``answer``.
        max_parse_retries: extra asks after an unparsable or empty reply.
        use_cache: read the reply cache on the first ask (a repeated judging run passes False).

    Returns:
        Per row, per rubric item: ``{"item", "score" (None when it failed), "raw", "error", "attempts"}``.
    """
    pairs = [(r, item) for r in rows for item in (r["rubric"] or [])]
    if model is None:
        flat = [{"value": lexical_item_score(item, r["answer"]), "raw": "offline lexical stand-in", "error": None,
                 "attempts": 0} for r, item in pairs]
    else:
        texts = [prompt.render(mode="item", question=r["question"], rubric_item=item, answer=r["answer"])
                 for r, item in pairs]
        flat = await _ask(model, texts, lambda text, _: parse_rubric_score(text), prompt.sha256,
                          max_parse_retries, use_cache)
    out, k = [], 0
    for r in rows:
        n = len(r["rubric"] or [])
        out.append([{"item": item, "score": res["value"], "raw": res["raw"], "error": res["error"],
                     "attempts": res["attempts"]} for item, res in zip(r["rubric"] or [], flat[k:k + n])])
        k += n
    return out


async def _ordering(rows: list[dict[str, Any]], model, prompt, max_parse_retries: int,
                    use_cache: bool = True) -> list[dict[str, Any]]:
    items = [answer_items(r["answer"]) for r in rows]
    refs = [list(r["rubric"] or []) for r in rows]
    if model is None:
        aligned = [{"value": lexical_alignment(ref, its), "error": None, "attempts": 0} for ref, its in zip(refs, items)]
    else:
        ask = [k for k, its in enumerate(items) if its]
        texts = [prompt.render(mode="align", question=rows[k]["question"], reference_items=refs[k],
                               answer_items=items[k]) for k in ask]
        got = await _ask(model, texts, lambda text, i: parse_alignment(text, len(items[ask[i]]), len(refs[ask[i]])),
                         prompt.sha256, max_parse_retries, use_cache)
        aligned = [{"value": [], "error": None, "attempts": 0} for _ in rows]
        for k, res in zip(ask, got):
            aligned[k] = res
    out = []
    for ref, its, res in zip(refs, items, aligned):
        if res["value"] is None:
            out.append({"status": "judge_error", "error": res["error"], "attempts": res["attempts"]})
        else:
            out.append({"status": "ok", **ordering_score(len(ref), res["value"]), "matches": res["value"],
                        "answer_items": len(its), "attempts": res["attempts"]})
    return out


def _mean(scores: list[float]) -> float:
    return sum(scores) / len(scores)


def run_verdict(score: float | None) -> str:
    """One judging run's entry in ``judge_verdicts``: CORRECT (1), WRONG (0), judge_error (None), else the
    credit as a decimal string.

    Examples:
        >>> [run_verdict(s) for s in (1.0, 0.0, None, 0.625)]
        ['CORRECT', 'WRONG', 'judge_error', '0.625']
    """
    if score is None:
        return "judge_error"
    return "CORRECT" if score == 1.0 else "WRONG" if score == 0.0 else str(round(score, 6))


def _run_score(items: list[dict[str, Any]], ordering: dict[str, Any] | None, category: str,
               rule: str) -> tuple[float | None, float | None, str | None]:
    """``(score, rubric_mean, error)`` of one question in one judging run."""
    failed = next((k for k, it in enumerate(items) if it["score"] is None), None)
    rubric_mean = None if failed is not None else _mean([item_credit(it["score"], category, rule) for it in items])
    if ordering is not None:
        if ordering["status"] != "ok":
            return None, rubric_mean, f"event ordering alignment: {ordering['error']}"
        return ordering["tau_norm"], rubric_mean, None
    if failed is not None:
        return None, None, f"rubric item {failed + 1}: {items[failed]['error']}"
    return rubric_mean, rubric_mean, None


@register_scorer("rubric_judge")
async def rubric_rows(rows: list[dict[str, Any]], *, endpoint, model, prompt, f1_rule: str = "token",
                      max_parse_retries: int = 2, judge_runs: int = 1) -> None:
    """Score question rows with the rubric judge (rules in the module docstring), in place.

    Fills, per the row conventions of :func:`aml_ray.stages.judge.judge_rows`: ``score`` (the question's
    credit in [0, 1]), ``verdict`` (CORRECT only for a score of 1), ``score_detail`` (JSON: ``credit_rule``,
    ``items`` with each item's score, credit and error, ``rubric_mean``, ``run_scores`` with every judging
    run's score, and ``ordering`` for event ordering), ``judge_raw`` (JSON list of the first run's item
    replies), ``judge_status``/``judge_error``/``judge_attempts``/``judge_verdicts`` (:func:`run_verdict`),
    ``f1``/``bleu1`` and the final ``status``.

    Args:
        rows: question rows after Answer, each with a non-empty ``rubric``.
        endpoint: the judge endpoint; offline uses the lexical stand-in.
        model: an object with ``async complete_batch(batch, **kw)``; None when offline.
        prompt: the judge prompt (``beam_rubric_judge``, or ``beam_rubric_judge_half_credit`` for the
            ``half_credit`` rule), rendered with ``mode="item"`` / ``"align"``.
        f1_rule: accepted for the scorer signature; the lexical F1 is always the token F1.
        max_parse_retries: extra asks after an unparsable or empty reply.
        judge_runs: how many times every item (and every alignment) is judged; runs after the first
            bypass the cache; the first run gives ``score``.

    Raises:
        ValueError: ``judge_runs < 1``, or the prompt declares a protocol of another scorer.
    """
    if judge_runs < 1:
        raise ValueError(f"judge_runs must be >= 1, got {judge_runs}")
    protocol = protocol_of(prompt)
    if protocol.scorer not in (None, "rubric_judge"):
        raise ValueError(f"prompt {prompt.name!r} declares judge protocol {protocol.name!r}, which is for the "
                         f"{protocol.scorer!r} scorer, not rubric_judge")
    rule = protocol.credit or "upstream_int"
    model = None if endpoint.offline else model
    answered = [r for r in rows if r["answer_status"] == "ok"]
    judgeable = [r for r in answered if r["rubric"]]
    for r in answered:
        if not r["rubric"]:
            r.update(verdict=None, score=None, judge_status="error", judge_error="the question has no rubric items",
                     judge_attempts=0, judge_verdicts=["judge_error"])
    ordered = [r for r in judgeable if r["category"] == ORDERING_CATEGORY]
    runs, orderings = [], []
    for n in range(judge_runs):
        runs.append(await judge_rubric_items(judgeable, model=model, prompt=prompt,
                                             max_parse_retries=max_parse_retries, use_cache=(n == 0)))
        aligned = await _ordering(ordered, model, prompt, max_parse_retries, use_cache=(n == 0))
        orderings.append(dict(zip(map(id, ordered), aligned)))
    for i, r in enumerate(judgeable):
        scored = [_run_score(run[i], orderings[n].get(id(r)), r["category"], rule) for n, run in enumerate(runs)]
        score, rubric_mean, error = scored[0]
        items = runs[0][i]
        detail: dict[str, Any] = {
            "credit_rule": rule,
            "items": [{"item": it["item"], "score": it["score"], "error": it["error"], "attempts": it["attempts"],
                       "credit": None if it["score"] is None else item_credit(it["score"], r["category"], rule)}
                      for it in items],
            "rubric_mean": rubric_mean, "run_scores": [s for s, _, _ in scored]}
        if id(r) in orderings[0]:
            detail["ordering"] = orderings[0][id(r)]
        r.update(score=score, verdict=None if score is None else "CORRECT" if score == 1.0 else "WRONG",
                 score_detail=json.dumps(detail), judge_raw=json.dumps([it["raw"] for it in items]),
                 judge_status="ok" if error is None else "error", judge_error=error,
                 judge_attempts=sum(it["attempts"] for run in runs for it in run[i])
                 + sum(int(o.get(id(r), {}).get("attempts", 0)) for o in orderings),
                 judge_verdicts=[run_verdict(s) for s, _, _ in scored])
    for r in rows:
        if r["answer_status"] == "ok" and r.get("gold") is not None and json.loads(r["gold"]) is not None:
            golds = golds_of(r["gold"])
            r["f1"] = max(token_f1(r["answer"], g) for g in golds)
            r["bleu1"] = max(bleu1(r["answer"], g) for g in golds)
        r["status"] = ("search_error" if r["search_status"] != "ok" else
                       "answer_error" if r["answer_status"] != "ok" else
                       "judge_error" if r["judge_status"] != "ok" else "scored")
