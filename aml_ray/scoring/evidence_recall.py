"""Evidence recall: did Search return the turns that hold a question's answer, and how high?

A question's **evidence** is what its benchmark names as the source of the answer (LoCoMo QA
``evidence`` dia_ids, LongMemEval ``answer_session_ids``; :attr:`aml_ray.datasets.base.Question.evidence`).
Each evidence id is resolved against the sample's sessions into an **evidence unit**, a list of turn
texts (:func:`resolve_units`):

- a turn id ``D<session index>:<turn position>`` (both 1-based; LoCoMo's dia_id convention, which
  :func:`aml_ray.datasets.base.turn_ids` gives every dataset's turns) -> that one turn;
- a session key (LongMemEval's haystack session ids) -> every turn of that session (the unit is found
  when any of its turns is);
- anything else is unresolved: counted (``n_unresolved``), never a miss.

A returned memory **covers** a turn by one of two rules (texts lower-cased, whitespace runs as one
space, the ``"<speaker>: "`` prefix the adapters render kept as sent):

- **exact**: the turn's text is a substring of the memory's content (a store that returns what was added,
  alone or in chunks);
- **fuzzy** (the headline, since participants rewrite text: extracted facts, summaries): at least
  :data:`FUZZY_SHARE` of the turn's distinct content words (``\\w+`` tokens of 3 or more characters that
  are not in :data:`STOPWORDS`) occur in the memory; a turn with fewer than :data:`MIN_CONTENT_WORDS`
  content words falls back to the exact rule.

Per question with at least one resolved unit: ``recall@K`` = units covered by the first K memories /
resolved units, for K in :data:`KS`; ``first_rank`` = the 1-based rank of the first memory that covers
any unit (None when none does). Per category and overall: the mean ``recall@K`` over those questions,
with a 95 % percentile bootstrap interval for the headline (fuzzy) rule (question-level, the rule of
:mod:`aml_ray.scoring.bootstrap`), the share of them with a hit, and the median ``first_rank``
of those with one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from aml_ray.contract import Message
from aml_ray.datasets.base import Sample, turn_ids
from aml_ray.scoring.bootstrap import mean_cis

#: The K of recall@K (Top K is at most 100: the formal Top K).
KS = (1, 5, 10, 25, 100)
#: Share of a turn's content words a memory must hold to cover it by the fuzzy rule.
FUZZY_SHARE = 0.5
#: Turns with fewer content words than this use the exact rule only.
MIN_CONTENT_WORDS = 3
#: Words that carry no content (English function words and the speaker-prefix noise).
STOPWORDS = frozenset(
    "the and for are but not you your yours was were what when where which who whom why how this that these those "
    "with from into onto about have has had having does did doing can could would should will shall may might must "
    "just also very really too than then there their theirs them they she her hers him his its our ours out off "
    "all any some each few more most other such only own same both once here over under again further yeah yes "
    "okay hey wow".split())
_SPACE = re.compile(r"\s+")
_WORD = re.compile(r"\w+")
_TURN_ID = re.compile(r"^D(\d+):(\d+)$")


def _norm(text: str) -> str:
    return _SPACE.sub(" ", text).strip().lower()


def content_words(text: str) -> frozenset[str]:
    """The distinct content words of ``text`` (lower-cased ``\\w+`` of 3+ characters, not stopwords)."""
    return frozenset(w for w in _WORD.findall(text.lower()) if len(w) >= 3 and w not in STOPWORDS)


@dataclass(frozen=True)
class Turn:
    """One evidence turn: its normalised text and content words."""

    text: str
    words: frozenset[str]


def _turn(content: Any) -> Turn:
    from aml_ray.media import text_of

    text = _norm(text_of(content))
    return Turn(text, content_words(text))


def evidence_messages(sample: Sample) -> dict[str, tuple[list[list[tuple[str, Message]]], int]]:
    """Each question of ``sample`` -> ``(its evidence units as source messages, how many ids did not resolve)``.

    A unit is a list of ``(turn id, message)`` in source order: one turn for a turn id, every turn of the
    session for a session key (module docstring). An id listed twice is one unit.

    Raises:
        Nothing: an id that names no turn or session is counted as unresolved.
    """
    by_turn: dict[str, tuple[str, Message]] = {}
    by_session: dict[str, list[tuple[str, Message]]] = {}
    for session in sample.sessions:
        turns = list(zip(turn_ids(session), session.messages))
        by_session[session.key] = turns
        by_turn.update((tid, (tid, m)) for tid, m in turns)
    out: dict[str, tuple[list[list[tuple[str, Message]]], int]] = {}
    for q in sample.questions:
        units, unresolved = [], 0
        for eid in dict.fromkeys(q.evidence):
            if eid in by_turn:
                units.append([by_turn[eid]])
            elif eid in by_session:
                units.append(by_session[eid])
            else:
                unresolved += 1
        out[q.question_id] = (units, unresolved)
    return out


def resolve_units(sample: Sample) -> dict[str, tuple[list[list[Turn]], int]]:
    """Each question of ``sample`` -> ``(its evidence units, how many of its ids did not resolve)``
    (:func:`evidence_messages`, each turn normalised for matching).

    Raises:
        Nothing: an id that names no turn or session is counted as unresolved.
    """
    return {qid: ([[_turn(m.content) for _, m in unit] for unit in units], unresolved)
            for qid, (units, unresolved) in evidence_messages(sample).items()}


class _Matcher:
    """Whether a memory covers a turn, by both rules; memories' normalised forms cached by content."""

    def __init__(self) -> None:
        self._memo: dict[str, tuple[str, frozenset[str]]] = {}

    def memory(self, content: str) -> tuple[str, frozenset[str]]:
        found = self._memo.get(content)
        if found is None:
            text = _norm(content)
            found = self._memo[content] = (text, content_words(text))
            if len(self._memo) > 50_000:
                self._memo.clear()
        return found

    @staticmethod
    def covers(memory: tuple[str, frozenset[str]], turn: Turn) -> tuple[bool, bool]:
        """``(exact, fuzzy)``."""
        exact = bool(turn.text) and turn.text in memory[0]
        if exact or len(turn.words) < MIN_CONTENT_WORDS:
            return exact, exact
        return exact, len(turn.words & memory[1]) >= FUZZY_SHARE * len(turn.words)


def question_recall(units: list[list[Turn]], memories: Sequence[dict[str, Any]], matcher: _Matcher | None = None,
                    ks: Sequence[int] = KS) -> dict[str, Any]:
    """One question's recall by both rules.

    Args:
        units: its resolved evidence units (each a list of turns; a unit is covered when any turn is).
        memories: its returned memories in rank order (``content`` read; None counts as empty).

    Returns:
        ``{"first_rank", "first_rank_exact", "recall@K", "recall_exact@K" for K in ks}`` (None values when
        ``units`` is empty).
    """
    matcher = matcher or _Matcher()
    names = [f"recall@{k}" for k in ks] + [f"recall_exact@{k}" for k in ks]
    if not units:
        return {"first_rank": None, "first_rank_exact": None, **{n: None for n in names}}
    first = {"fuzzy": None, "exact": None}
    covered_at = {"fuzzy": [None] * len(units), "exact": [None] * len(units)}  # rank that first covered each unit
    for rank, memory in enumerate(memories, start=1):
        m = matcher.memory(str(memory.get("content") or ""))
        for u, unit in enumerate(units):
            if covered_at["fuzzy"][u] is not None and covered_at["exact"][u] is not None:
                continue
            exact = fuzzy = False
            for turn in unit:
                e, f = matcher.covers(m, turn)
                exact, fuzzy = exact or e, fuzzy or f
                if exact:
                    break
            for rule, hit in (("fuzzy", fuzzy), ("exact", exact)):
                if hit and covered_at[rule][u] is None:
                    covered_at[rule][u] = rank
                    first[rule] = first[rule] or rank
    out: dict[str, Any] = {"first_rank": first["fuzzy"], "first_rank_exact": first["exact"]}
    for k in ks:
        out[f"recall@{k}"] = sum(1 for r in covered_at["fuzzy"] if r is not None and r <= k) / len(units)
        out[f"recall_exact@{k}"] = sum(1 for r in covered_at["exact"] if r is not None and r <= k) / len(units)
    return out


def recall_rows(samples: Iterable[Sample], rows: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Per-question recall rows for the run's question evidence.

    Args:
        samples: the run's samples (their sessions and questions' evidence).
        rows: question evidence rows with ``question_id``, ``sample_id``, ``category``, ``excluded``,
            ``search_status`` and ``memories``; a Streaming row's id ``<question_id>@<step>`` is resolved
            by its question.

    Yields:
        ``{"question_id", "category", "n_evidence", "n_unresolved", "first_rank", "first_rank_exact",
        "recall@K"..., "recall_exact@K"...}`` for every non-excluded row whose Search succeeded.
    """
    units = {}
    for sample in samples:
        for qid, found in resolve_units(sample).items():
            units[(sample.sample_id, qid)] = found
    matcher = _Matcher()
    for row in rows:
        if row.get("excluded") or row.get("search_status") != "ok":
            continue
        qid = row["question_id"].split("@", 1)[0]
        found, unresolved = units.get((row["sample_id"], qid), ([], 0))
        yield {"question_id": row["question_id"], "category": row["category"], "n_evidence": len(found),
               "n_unresolved": unresolved, **question_recall(found, row.get("memories") or (), matcher)}


def recall_table(rows: Sequence[dict[str, Any]], ks: Sequence[int] = KS) -> list[dict[str, Any]]:
    """Per category, then ``overall``: questions with evidence, mean recall@K by both rules with the fuzzy
    rule's bootstrap interval, hit share and the median first rank (module docstring).

    Returns:
        ``[{"category", "n", "n_unresolved", "recall@K"..., "recall@K_ci_low"..., "recall@K_ci_high"...,
        "recall_exact@K"..., "hit_share", "median_first_rank"}, ...]``; a category whose questions have no
        evidence has ``n`` 0 and None figures.
    """
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(str(r["category"]), []).append(r)
    out = []
    for category, members in [*sorted(groups.items()), ("overall", list(rows))]:
        scored = [r for r in members if r["n_evidence"]]
        entry: dict[str, Any] = {"category": category, "n": len(scored),
                                 "n_unresolved": sum(r["n_unresolved"] for r in members)}
        for name in [f"recall@{k}" for k in ks] + [f"recall_exact@{k}" for k in ks]:
            entry[name] = sum(r[name] for r in scored) / len(scored) if scored else None
        for k, ci in zip(ks, mean_cis([[r[f"recall@{k}"] for r in scored] for k in ks])):  # one draw for all K
            entry[f"recall@{k}_ci_low"], entry[f"recall@{k}_ci_high"] = ci
        ranks = [r["first_rank"] for r in scored if r["first_rank"] is not None]
        entry["hit_share"] = len(ranks) / len(scored) if scored else None
        entry["median_first_rank"] = float(median(ranks)) if ranks else None
        out.append(entry)
    return out
