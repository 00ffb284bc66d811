"""The embedded offline answerer, used when no answer model endpoint is configured.

It is NOT an official model and every output that uses it says so (``OFFLINE_ANSWER_MODEL``). It lets a
fresh machine run the whole pipeline without a model API: extractive, deterministic, free.

Rule: among the first ``window`` retrieved memories (participant order), pick the one sharing the most
content words with the question (ties: earlier wins). For a "when" question, answer with that
memory's date (``created_at``, rendered ``7 May 2023``) when it has one; otherwise answer with the
memory's text without its ``speaker:`` prefix. No memories -> "Not mentioned."
"""

from __future__ import annotations

import re
from datetime import datetime

_WORD = re.compile(r"[a-z0-9']+")
_STOP = frozenset(
    "a an the and or but of to in on at for with by from is are was were be been being do does did what "
    "when where who whom which why how that this these those it its he she they them his her their i you "
    "we me my your our as about into than then so if not no yes has have had will would can could".split())


def _content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def _render_date(created_at: str) -> str | None:
    try:
        dt = datetime.fromisoformat(created_at.replace("Z", "+00:00"))
    except ValueError:
        return None
    return f"{dt.day} {dt.strftime('%B')} {dt.year}"


def extractive_answer(question: str, memories: list[dict], *, window: int = 10) -> str:
    """Answer ``question`` from ``memories`` (dicts with ``content`` and optional ``created_at``).

    Returns:
        A short answer string (see the module docstring for the rule).
    """
    if not memories:
        return "Not mentioned."
    q = _content_words(question)
    best = max(enumerate(memories[:window]),
               key=lambda im: (len(q & _content_words(str(im[1].get("content", "")))), -im[0]))[1]
    if question.strip().lower().startswith("when") and best.get("created_at"):
        date = _render_date(str(best["created_at"]))
        if date:
            return date
    text = str(best.get("content", ""))
    head, sep, tail = text.partition(": ")
    return (tail if sep and len(head) < 40 else text).strip() or "Not mentioned."
