"""ATM-Bench question score ("QS") rules that need no model: ``number`` and ``list_recall``.

Source: ATM-Bench's scoring as AML issue 9 states it: "``number`` by normalised match (dates, times,
currency, number words, abstention), ``list_recall`` by Jaccard between gold ids and ids found in the
answer, ``open_end`` by an LLM judge returning JSON with an accuracy; mean over questions". The exact
normalisation below is this module's (the official script was not obtained):

- text: lowercase; currency signs and words (``$ £ € ¥``, dollars, usd, pounds, euros, yuan, rmb) dropped;
  thousands separators in numbers dropped; number words zero..ninety (and "a hundred"/"thousand"
  multipliers on a preceding number) become digits; ``1.50`` and ``1.5`` are the same number;
- dates (``2024-05-01``, ``May 1, 2024``, ``1 May 2024``, ``05/01/2024`` read month first) become ISO;
  times (``3:05 pm``, ``15:05``) become ``HH:MM``;
- abstention: a gold that abstains ("unknown", "not mentioned", "cannot be determined", "no
  information", "I don't know") is matched only by an answer that abstains, and vice versa;
- ``number``: 1 when a value of the gold (number, date, time) is among the answer's values, or the
  normalised texts are equal; else 0;
- ``list_recall``: ids found in the answer are its tokens (split on whitespace, commas, semicolons,
  brackets and quotes) that contain a digit; score = |gold ∩ found| / |gold ∪ found|.
"""

from __future__ import annotations

import re
from datetime import datetime

_CURRENCY = re.compile(r"[$£€¥]|\b(dollars?|usd|pounds?|gbp|euros?|eur|yuan|rmb|cny)\b")
_WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                                      "fourteen fifteen sixteen seventeen eighteen nineteen twenty".split())}
_WORDS.update({"thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90})
_ABSTAIN = re.compile(r"\b(unknown|not mentioned|cannot be determined|can't be determined|no information|"
                      r"not enough information|i don't know|i do not know|not available|no record)\b")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_TIME = re.compile(r"\b(\d{1,2}):(\d{2})\s*(am|pm|a\.m\.|p\.m\.)?")
_TIME_AMPM = re.compile(r"\b(\d{1,2})\s*(am|pm)\b")
_DATE_FORMATS = ("%Y-%m-%d", "%B %d %Y", "%b %d %Y", "%d %B %Y", "%d %b %Y", "%m/%d/%Y", "%B %Y", "%b %Y")
_ID_SPLIT = re.compile(r"[\s,;()\[\]{}\"'`]+")


def abstains(text: str) -> bool:
    """Whether ``text`` declines to answer (see the module rule).

    Examples:
        >>> abstains("Not mentioned."), abstains("42")
        (True, False)
    """
    return bool(_ABSTAIN.search(str(text).lower()))


def _words_to_digits(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        return str(_WORDS[m.group(0)])
    return re.sub(r"\b(" + "|".join(sorted(_WORDS, key=len, reverse=True)) + r")\b", one, text)


def _dates(text: str) -> set[str]:
    out = set()
    cleaned = re.sub(r"(\d)(st|nd|rd|th)\b", r"\1", text.replace(",", " "))
    cleaned = re.sub(r"\s+", " ", cleaned)
    candidates = re.findall(r"\d{4}-\d{2}-\d{2}|\d{1,2}/\d{1,2}/\d{4}|[a-z]+ \d{1,2} \d{4}|\d{1,2} [a-z]+ \d{4}"
                            r"|[a-z]+ \d{4}", cleaned)
    for c in candidates:
        for fmt in _DATE_FORMATS:
            try:
                d = datetime.strptime(c, fmt.lower() if "%" not in fmt else fmt)
            except ValueError:
                try:
                    d = datetime.strptime(c.title(), fmt)
                except ValueError:
                    continue
            out.add(d.strftime("%Y-%m") if fmt in ("%B %Y", "%b %Y") else d.date().isoformat())
            break
    return out


def _times(text: str) -> set[str]:
    out = set()
    for h, m, ampm in _TIME.findall(text):
        hour = int(h) % 12 + (12 if ampm and ampm.startswith("p") else 0) if ampm else int(h)
        out.add(f"{hour:02d}:{int(m):02d}")
    for h, ampm in _TIME_AMPM.findall(text):
        out.add(f"{int(h) % 12 + (12 if ampm == 'pm' else 0):02d}:00")
    return out


def normalize_text(text: str) -> str:
    """Lowercase, currency dropped, number words as digits, separators and spacing normalised.

    Examples:
        >>> normalize_text("$1,250 dollars")
        '1250'
        >>> normalize_text("Twelve photos")
        '12 photos'
    """
    t = _CURRENCY.sub(" ", str(text).lower())
    t = re.sub(r"(?<=\d),(?=\d{3}\b)", "", t)
    t = _words_to_digits(t)
    t = re.sub(r"[^\w\s:./-]", " ", t)
    return " ".join(t.split()).strip(" .")


def values(text: str) -> set[str]:
    """The numbers, ISO dates and ``HH:MM`` times in ``text``."""
    t = normalize_text(text)
    nums = {str(float(n)).removesuffix(".0") for n in _NUMBER.findall(re.sub(r"\d{1,2}:\d{2}", " ", t))}
    return nums | _dates(t) | _times(t)


def number_score(answer: str, gold: str) -> float:
    """``number`` rule (see the module docstring).

    Examples:
        >>> number_score("It cost $1,250.", "1250 dollars")
        1.0
        >>> number_score("You took three.", "3")
        1.0
        >>> number_score("On May 1st, 2024", "2024-05-01")
        1.0
        >>> number_score("At 3:05 pm", "15:05")
        1.0
        >>> number_score("I don't know", "Not mentioned")
        1.0
        >>> number_score("4", "5")
        0.0
    """
    if abstains(gold) or abstains(answer):
        return 1.0 if abstains(gold) and abstains(answer) else 0.0
    if normalize_text(answer) == normalize_text(gold):
        return 1.0
    g = values(gold)
    return 1.0 if g and g & values(answer) else 0.0


def answer_ids(answer: str) -> set[str]:
    """Id-like tokens of an answer: split on separators, kept when they contain a digit (see the rule)."""
    return {t.strip(".:") for t in _ID_SPLIT.split(str(answer)) if any(c.isdigit() for c in t)} - {""}


def list_recall_score(answer: str, gold_ids: list[str]) -> float:
    """Jaccard between the gold ids and the ids found in the answer.

    Examples:
        >>> list_recall_score("IMG_0012.jpg, IMG_0040.jpg and email_7", ["IMG_0012.jpg", "email_7"])
        0.6666666666666666
        >>> list_recall_score("None of them.", ["a1"])
        0.0
    """
    gold, found = set(gold_ids), answer_ids(answer)
    union = gold | found
    return len(gold & found) / len(union) if union else 1.0
