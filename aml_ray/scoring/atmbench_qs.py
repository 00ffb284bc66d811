"""ATM-Bench question score ("QS"): the ``number`` and ``list_recall`` rules and the judge reply reading.

Source: ATM-Bench's public evaluator (JingbiaoMei/ATM-Bench @ ``c24d06ca11cf7f83d2d0f11c04f7795bb33d1a01``,
``memqa/utils/evaluator/evaluate_qa.py`` with ``normalizer.py`` and ``config.py``; the scoring functions
are the same at ``207106f9f1a979654e3fe87e220c4dca86886aa7``). The rules are reproduced here, not the code:

- ``number`` (upstream ``_deterministic_accuracy_core``): 1.0 or 0.0 by :func:`number_score`;
- ``list_recall`` (``_list_jaccard_core``): Jaccard of the gold items (the *answer string* split on
  ``,`` ``;`` ``and`` ``/``, each lowercased) and the answer's items (its ``YYYYMMDD_HHMMSS`` media ids and
  ``email<digits>`` ids, emails lowercased; when it names none, its text split the same way);
- ``open_end``: the judge's reply read by :func:`judge_accuracy` (binary: ``"accuracy"`` is true or it is
  not).

Examples:
    >>> number_score("€62.80", "€62.8")
    1.0
    >>> number_score("30 euros", "€30"), number_score("€30", "30 euros")
    (1.0, 0.0)
    >>> list_recall_score("EMAIL202401010001 and 20220430_132212", "email202401010001, 20220502_172850")
    0.3333333333333333
"""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import date, timedelta
from decimal import Decimal, InvalidOperation

# --- vocabularies (normalizer.py and config.py constants) -------------------------------------------------

#: A text containing one of these (after :func:`normalize_text`) abstains (``config.ABSTENTION_PHRASES``).
ABSTENTION_PHRASES = ("unknown", "abstention", "no information", "not available", "no evidence", "no evidnece",
                      "insufficient information")
_MONTHS = {"january": 1, "jan": 1, "february": 2, "feb": 2, "march": 3, "mar": 3, "april": 4, "apr": 4, "may": 5,
           "june": 6, "jun": 6, "july": 7, "jul": 7, "august": 8, "aug": 8, "september": 9, "sep": 9, "sept": 9,
           "october": 10, "oct": 10, "november": 11, "nov": 11, "december": 12, "dec": 12}
_NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
_STOPWORDS = frozenset("the a an of in at on for to and or by from with into is was were be been being".split())
_ADDRESS_WORDS = frozenset("street st road rd lane ln avenue ave drive dr place pl square sq close court ct way high "
                           "highstreet boulevard blvd city town village county country oxford cambridge".split())
_WEEKDAYS = ("monday", "mon", "tuesday", "tue", "tues", "wednesday", "wed", "thursday", "thu", "thurs", "friday",
             "fri", "saturday", "sat", "sunday", "sun")
_CURRENCY_OF = {"£": "GBP", "$": "USD", "€": "EUR"}

# --- patterns (normalizer.py) -----------------------------------------------------------------------------

_M = "|".join(_MONTHS)
_ISO_DATE = re.compile(r"\b(\d{4})[-/](\d{1,2})[-/](\d{1,2})\b")
_COMPACT_DATE = re.compile(r"\b((?:19|20)\d{2})(0[1-9]|1[0-2])(0[1-9]|[12]\d|3[01])\b")
_MONTH_DAY = re.compile(rf"\b({_M})\s+(\d{{1,2}})(?:st|nd|rd|th)?(?:,?\s*(\d{{4}}))?\b", re.I)
_DAY_MONTH = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+({_M})(?:,?\s*(\d{{4}}))?\b", re.I)
_MONTH_RANGE = re.compile(
    rf"\b({_M})\s+(\d{{1,2}})(?:st|nd|rd|th)?\s*(?:-|to|–)\s*(\d{{1,2}})(?:st|nd|rd|th)?(?:,?\s*(\d{{4}}))?\b", re.I)
_TIME_RANGE = re.compile(
    r"\b(\d{1,2})(?::(\d{2}))?\s*(am|pm)?\s*(?:-|to|–|and)\s*(\d{1,2})(?::(\d{2}))?\s*(am|pm)?\b", re.I)
_TIME_AMPM = re.compile(r"\b(\d{1,2})(?::(\d{2}))?\s*(am|pm)\b", re.I)
_TIME_24H = re.compile(r"\b([01]?\d|2[0-3]):([0-5]\d)\b")
_TIME_AMPM_DOTS = re.compile(r"\b(\d{1,2})(?::(\d{2}))?\s*(a\.m\.|p\.m\.)\b", re.I)
_CURRENCY_SIGN = re.compile(r"[£$€]")
_CURRENCY_CODE = re.compile(r"\b(USD|GBP|EUR|AUD|JOD)\b", re.I)
_CURRENCY_WORD = re.compile(r"\b(dollars?|usd|pounds?|gbp|euros?|eur)\b", re.I)
_AMOUNT = r"\d{1,3}(?:,\d{3})*(?:\.\d+)?"
_NUMBER = re.compile(rf"\b{_AMOUNT}\b")
_SIGN_AMOUNT = re.compile(rf"[£$€]\s*({_AMOUNT})")
_AMOUNT_UNIT = re.compile(rf"({_AMOUNT})\s*(?:USD|GBP|EUR|AUD|JOD|dollars?|pounds?|euros?)\b", re.I)
_CODE = re.compile(r"\b[A-Z0-9]{4,}\b", re.I)
_LIST_SPLIT = re.compile(r"\s*(?:,|;|\band\b|/)\s*", re.I)
_TOKEN = re.compile(r"[a-z0-9]+", re.I)
_WEEKDAY = re.compile(r"\b(" + "|".join(_WEEKDAYS) + r")\b", re.I)
_THOUSANDS = re.compile(r"(\d),(\d)")
_CONTEXT_PHRASES = tuple(re.compile(p, re.I) for p in (
    r"\bit happened on\b", r"\bstarting at\b", r"\bfrom\s+\d", r"\bonwards\b", r"\btotaling\b", r"\bcomprising\b",
    r"\bwith pre-drinks at\b", r"\bwith pre-\w+\b", r"\band dinner at\b", r"\bdress code is\b",
    r"\bthe total cost was\b", r"\bcode:\s*", r"\bexpires?\s*"))
#: ``evaluate_qa._extract_list_ids_from_text``: media ids (capture time) and email ids.
_MEDIA_ID = re.compile(r"\b(\d{8}_\d{6})\b")
_EMAIL_ID = re.compile(r"\b(email\d+)\b", re.I)


def _unique(values):
    return list(dict.fromkeys(values))


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


# --- text steps -------------------------------------------------------------------------------------------

def normalize_text(text: str) -> str:
    """Lowercase, ordinals as numbers, parentheses and thousands separators out, edge punctuation stripped.

    Upstream ``normalize_text``.

    Examples:
        >>> normalize_text("  The 3rd (of May), 1,250. ")
        'the 3 , 1250'
    """
    t = re.sub(r"\s+", " ", text.strip().lower())
    t = re.sub(r"\b(\d+)(st|nd|rd|th)\b", r"\1", t)
    t = re.sub(r"\s+", " ", re.sub(r"\([^)]+\)", "", t))
    return _THOUSANDS.sub(r"\1\2", t).strip("\t\n\r \"'`.,;:!?()[]{}")


def abstains(text: str) -> bool:
    """Whether ``text`` abstains: it contains an :data:`ABSTENTION_PHRASES` entry (upstream ``is_abstention``).

    Examples:
        >>> abstains("Unknown."), abstains("Not mentioned."), abstains("No information available")
        (True, False, True)
    """
    t = normalize_text(text)
    return any(p in t for p in ABSTENTION_PHRASES)


def _prepare(text: str, reference: date | None) -> str:
    """Upstream's cleaning before matching, in its order: relative dates resolved against the question's
    date, trailing dots, thousands separators, unit words after a number (spots, hours, sessions, days),
    parentheses, currency breakdowns, ``between X and Y`` as ``X to Y``, a leading article."""
    if reference is not None:
        for word, day in (("today", reference), ("tonight", reference), ("tomorrow", reference + timedelta(days=1)),
                          ("yesterday", reference - timedelta(days=1))):
            if word in text.lower():
                form = next((f for f in (word, word.capitalize(), word.upper()) if f in text), None)
                if form is not None:
                    text = text.replace(form, day.strftime("%B %d"))
        text = re.sub(r"(today|tonight|tomorrow|yesterday)\s*\([^)]+\)", r"\1", text, flags=re.I)
    t = _THOUSANDS.sub(r"\1\2", text.rstrip("."))
    t = re.sub(r"\b(\d+)\s+(spots?|hours?|sessions?|days?)\b", r"\1", t, flags=re.I)
    t = _squash(re.sub(r"\([^)]+\)", "", t))
    t = re.sub(r",?\s*totaling\s+[£$€]\d+(?:\.\d+)?\s+for\s+\w+\s+sessions?", "", t, flags=re.I)
    t = re.sub(r",?\s*comprising\s+.*$", "", t, flags=re.I)
    t = _squash(re.sub(r"per\s+\d+[- ]minute\s+session", "per session", t, flags=re.I))
    t = re.sub(r"\s+and\s+", " to ", re.sub(r"\bbetween\s+", "", t, flags=re.I), flags=re.I)
    return re.sub(r"^\s*(a|an|the)\s+", "", t, flags=re.I)


def _without_context(text: str) -> str:
    t = text.lower()
    for p in _CONTEXT_PHRASES:
        t = p.sub(" ", t)
    return _squash(_WEEKDAY.sub(" ", t))


def _tokens(text: str) -> list[str]:
    return [t.lower() for t in _TOKEN.findall(text)]


def split_items(text: str) -> list[str]:
    """List items of a text: split on ``,`` ``;`` ``and`` ``/``, each item :func:`normalize_text`-ed.

    Upstream ``split_list_items``.

    Examples:
        >>> split_items("20220430_132212, Email0001 and the cafe")
        ['20220430_132212', 'email0001', 'the cafe']
    """
    return [normalize_text(i.strip()) for i in _LIST_SPLIT.split(text) if i.strip()]


def _all_tokens_in(gold: str, answer: str) -> bool:
    """Upstream ``token_subset_match``: every non-stopword gold token is an answer token (vacuous when none)."""
    want = [t for t in _tokens(gold) if t not in _STOPWORDS]
    have = set(_tokens(answer))
    return all(t in have for t in want)


def _address_match(gold: str, answer: str) -> bool:
    """Upstream ``location_token_match``: a gold with an address word matches when all its words are present."""
    words = _tokens(gold)
    if not any(w in _ADDRESS_WORDS for w in words):
        return False
    want = [w for w in words if w not in _STOPWORDS and not w.isdigit()]
    have = set(_tokens(answer))
    return bool(want) and all(w in have for w in want)


# --- values -----------------------------------------------------------------------------------------------

def _date_value(year: str | None, month: int, day: int) -> str:
    y = int(year) if year else 0  # upstream tests the year as a number: year 0000 counts as none
    return f"{y:04d}{month:02d}{day:02d}" if y else f"{month:02d}{day:02d}"


def dates(text: str) -> list[str]:
    """Dates of a text as ``YYYYMMDD`` (``MMDD`` without a year; ranges ``start-end``), first seen first.

    Upstream ``extract_dates``: ISO (``2024-05-01``, ``2024/5/1``), compact (``20240501``), ``May 1-3[, 2024]``,
    ``May 1st[, 2024]`` and ``1 May[ 2024]``.

    Examples:
        >>> dates("from 2024-05-01 to May 3rd, 2024; and 4 June")
        ['20240501', '20240503', '0604']
    """
    out = [_date_value(m[1], int(m[2]), int(m[3])) for m in _ISO_DATE.finditer(text)]
    out += [_date_value(m[1], int(m[2]), int(m[3])) for m in _COMPACT_DATE.finditer(text)]
    for m in _MONTH_RANGE.finditer(text):
        month = _MONTHS[m[1].lower()]
        out.append(f"{_date_value(m[4], month, int(m[2]))}-{_date_value(m[4], month, int(m[3]))}")
    rest = _MONTH_RANGE.sub(" ", text)
    out += [_date_value(m[3], _MONTHS[m[1].lower()], int(m[2])) for m in _MONTH_DAY.finditer(rest)]
    out += [_date_value(m[3], _MONTHS[m[2].lower()], int(m[1])) for m in _DAY_MONTH.finditer(rest)]
    return _unique(out)


def _clock(hour: int, minute: int, half: str | None) -> str:
    if half:
        hour = (0 if hour == 12 else hour) + (12 if half.lower() == "pm" else 0)
    return f"{hour:02d}:{minute:02d}"


def times(text: str) -> list[str]:
    """Times of a text as ``HH:MM`` (ranges ``HH:MM-HH:MM``), first seen first (upstream ``extract_times``).

    ``noon``/``midday`` are 12:00, ``midnight`` 00:00, ``a.m.``/``p.m.`` as am/pm; 12 am is 00:00.

    Examples:
        >>> times("9 to 11am; 3:05 pm; noon")
        ['09:00-11:00', '03:05', '12:00', '15:05']
    """
    t = text.lower().replace("noon", "12:00").replace("midday", "12:00").replace("midnight", "00:00")
    t = t.replace("a.m.", "am").replace("p.m.", "pm").replace("a. m.", "am").replace("p. m.", "pm")
    t = _TIME_AMPM_DOTS.sub(lambda m: f"{m[1]}:{m[2] or '00'}{m[3][0]}m", t)
    out = [f"{_clock(int(m[1]), int(m[2] or 0), m[3] or m[6])}-{_clock(int(m[4]), int(m[5] or 0), m[6])}"
           for m in _TIME_RANGE.finditer(t)]
    rest = _TIME_RANGE.sub(" ", t)
    out += [_clock(int(m[1]), int(m[2]), None) for m in _TIME_24H.finditer(rest)]
    out += [_clock(int(m[1]), int(m[2] or 0), m[3]) for m in _TIME_AMPM.finditer(rest)]
    return _unique(out)


def _without_dates_and_times(text: str) -> str:
    """Upstream ``remove_date_time_text``."""
    for p in (_ISO_DATE, _COMPACT_DATE, _MONTH_RANGE, _MONTH_DAY, _DAY_MONTH, _TIME_RANGE, _TIME_24H, _TIME_AMPM,
              _TIME_AMPM_DOTS):
        text = p.sub(" ", text)
    for word in ("noon", "midday", "midnight", "a.m.", "p.m.", "a. m.", "p. m."):
        text = text.replace(word, " ")
    return text


def _number_words_as_digits(text: str) -> str:
    for token in _TOKEN.findall(text):
        if token.lower() in _NUMBER_WORDS:
            text = re.sub(rf"\b{re.escape(token)}\b", str(_NUMBER_WORDS[token.lower()]), text)
    return text


def _decimal(value: str) -> Decimal | None:
    try:
        return Decimal(value.replace(",", "")).normalize()
    except (InvalidOperation, ValueError):
        return None


def numbers(text: str) -> list[Decimal]:
    """Every number of a text (number words zero..twenty as digits), as normalised decimals, in order.

    Upstream ``extract_numbers`` (values part): ``1.50`` and ``1.5`` are the same value. A number is one to
    three digits, then groups of ``,ddd`` (pattern ``\\b\\d{1,3}(?:,\\d{3})*(?:\\.\\d+)?\\b``), so a run of
    four or more digits without separators (``2024``, ``1250``) is no number at all, as upstream.

    Examples:
        >>> numbers("three nights for 1,250.50 and 12")
        [Decimal('3'), Decimal('1250.5'), Decimal('12')]
    """
    found = (_decimal(m[0]) for m in _NUMBER.finditer(_number_words_as_digits(text)))
    return [d for d in found if d is not None]


def currencies(text: str) -> list[str]:
    """Currency codes a text names: codes, then words, then signs (upstream ``extract_numbers``).

    Examples:
        >>> currencies("€30 or 30 euros or EUR 30")
        ['EUR', 'EUR', 'EUR', 'EUR']
    """
    out = [m[1].upper() for m in _CURRENCY_CODE.finditer(text)]
    for m in _CURRENCY_WORD.finditer(text):
        w = m[1].lower()
        out.append("USD" if "usd" in w or "dollar" in w else "GBP" if "gbp" in w or "pound" in w else "EUR")
    return out + [_CURRENCY_OF[m[0]] for m in _CURRENCY_SIGN.finditer(text)]


def amounts(text: str) -> list[Decimal]:
    """Money amounts of a text: a number after a currency sign or before a currency code or word.

    Upstream ``extract_currency_amounts`` (distinct values, first seen first).

    Examples:
        >>> amounts("£12.50 then 12.5 pounds and 3 dollars")
        [Decimal('12.5'), Decimal('3')]
    """
    t = _THOUSANDS.sub(r"\1\2", _number_words_as_digits(text))
    found = [_decimal(m[1]) for m in _SIGN_AMOUNT.finditer(t)] + [_decimal(m[1]) for m in _AMOUNT_UNIT.finditer(t)]
    return _unique(d for d in found if d is not None)


def codes(text: str) -> list[str]:
    """Booking-code-like tokens: 4+ letters/digits mixing both, upper-cased, ordinals (``25TH``) skipped.

    Upstream ``extract_codes``.

    Examples:
        >>> codes("ref AB12CD, flight BA2490 on the 25th")
        ['AB12CD', 'BA2490']
    """
    out = []
    for m in _CODE.finditer(text):
        v = m[0].upper()
        if re.match(r"^\d{1,2}(ST|ND|RD|TH)$", v) or not (any(c.isalpha() for c in v) and any(c.isdigit() for c in v)):
            continue
        out.append(v)
    return _unique(out)


def _same_date(gold: str, answer: str) -> bool:
    """One date component: with a year on both sides the whole value, else month and day."""
    return gold[-4:] == answer[-4:] if len(gold) == 4 or len(answer) == 4 else gold == answer


def _dates_covered(gold: list[str], answer: list[str]) -> bool:
    """Upstream ``dates_match``: each gold date (or range) takes a distinct matching answer date."""
    left = list(answer)
    for g in gold:
        for i, a in enumerate(left):
            if ("-" in a and all(_same_date(x, y) for x, y in zip(g.split("-", 1), a.split("-", 1)))
                    if "-" in g else _same_date(g, a)):
                del left[i]
                break
        else:
            return False
    return True


def _units_match(gold: str, answer: str) -> bool:
    """Upstream ``semantic_units_match``: dates, times and amounts agree and 80% of the gold's words appear."""
    gd, ad = dates(gold), dates(answer)
    if gd and not (ad and any(g[-4:] == a[-4:] for g in gd for a in ad)):
        return False
    gt, at = times(gold), times(answer)
    if gt and at and not set(gt) & set(at):
        return False
    ga = amounts(gold)
    if ga and set(ga) != set(amounts(answer)):
        return False
    want = {t for t in _tokens(gold) if t not in _STOPWORDS and len(t) > 2}
    if not want:
        return True
    have = {t for t in _tokens(answer) if t not in _STOPWORDS and len(t) > 2}
    return len(want & have) / len(want) >= 0.8


def _question_date(question: str) -> date | None:
    """The first full date of the question (upstream ``extract_reference_date``), for today/tomorrow/yesterday."""
    for v in dates(question):
        if len(v) == 8:
            return date(int(v[:4]), int(v[4:6]), int(v[6:]))
    return None


# --- the rules --------------------------------------------------------------------------------------------

def number_score(answer: str, gold: str, question: str = "") -> float:
    """The ``number`` rule: 1.0 when the answer matches the gold, else 0.0.

    Upstream ``_deterministic_accuracy_core``, in its order (both texts first cleaned as :func:`_prepare`
    says, against the question's own date):

    1. abstention: when either side abstains (:func:`abstains`), 1 only if both do;
    2. codes: every code of the gold (:func:`codes`) must appear in the upper-cased answer;
    3. dates: every gold date must be matched by a distinct answer date (year ignored when a side has none);
    4. times: when both have times, the same multiset;
    5. with a date or time, the gold's other words (context phrases and weekdays dropped) all in the answer
       -> 1;
    6. currencies: when the gold names one and the answer too, the same set; amounts: the same multiset
       of money amounts; then the other numbers: the same multiset;
    7. a gold list of two or more items: each item in the normalised answer -> 1, else 0;
    8. yes/no; an address-like gold with all its words present; either normalised text (3+ characters)
       inside the other; all gold words present; :func:`_units_match`; else exact normalised equality.

    Args:
        answer: the answer model's reply.
        gold: the gold answer string (the QA file's ``answer``).
        question: the question, for its reference date.

    Examples:
        >>> number_score("It cost $1,250.", "$1250")
        1.0
        >>> number_score("Three nights.", "3")
        1.0
        >>> number_score("On May 1st, 2024", "2024-05-01")
        1.0
        >>> number_score("At 15:05", "15:05"), number_score("At 3:05 pm", "15:05")  # 3:05 pm is also read as 03:05
        (1.0, 0.0)
        >>> number_score("Unknown", "Not available")
        1.0
        >>> number_score("4", "5")
        0.0
    """
    reference = _question_date(question or "")
    g, a = _prepare(gold, reference), _prepare(answer, reference)
    gn, an = normalize_text(g), normalize_text(a)
    if abstains(gold) or abstains(answer):
        return float(abstains(gold) and abstains(answer))
    gold_codes = codes(g)
    if gold_codes:
        shown = re.sub(r"\b(?:CODE|ID|REFERENCE|REF|NUMBER|NUM|LABEL):\s*", "", a.upper())
        if not all(c in shown for c in gold_codes):
            return 0.0
    gd = dates(g)
    if gd and not (dates(a) and _dates_covered(gd, dates(a))):
        return 0.0
    gt, at = times(g), times(a)
    if gt and at and Counter(gt) != Counter(at):
        return 0.0
    if gd or gt:
        rest = _without_context(normalize_text(_without_dates_and_times(g)))
        if not rest or _all_tokens_in(rest, _without_context(normalize_text(_without_dates_and_times(a)))):
            return 1.0
    g0, a0 = _without_dates_and_times(g), _without_dates_and_times(a)
    gc, ac = currencies(g0), currencies(a0)
    if gc and ac and sorted(set(gc)) != sorted(set(ac)):
        return 0.0
    g_nums, a_nums = numbers(g0), numbers(a0)
    g_amounts = amounts(g0)
    if g_amounts:
        a_amounts = amounts(a0)
        if not a_amounts or Counter(g_amounts) != Counter(a_amounts):
            return 0.0
        g_nums = [n for n in g_nums if n not in g_amounts]
        a_nums = [n for n in a_nums if n not in a_amounts]
    if g_nums and (not a_nums or Counter(g_nums) != Counter(a_nums)):
        return 0.0
    items = split_items(g)
    if len(items) >= 2:
        return float(all(i in an for i in items))
    if gn.startswith(("yes", "no")) and an in ("yes", "no"):
        return float(gn.startswith(an))
    if (_address_match(g, a) or (len(gn) >= 3 and gn in an) or (len(an) >= 3 and an in gn)
            or _all_tokens_in(g, a) or _units_match(g, a)):
        return 1.0
    return float(gn == an)


def answer_items(answer: str) -> list[str]:
    """The items an answer names: its media and email ids when it has any, else its list items.

    Upstream ``_prediction_list_items``: media ids ``YYYYMMDD_HHMMSS`` first, then ``email<digits>`` ids
    lowercased, each once; an answer with neither is split by :func:`split_items`.

    Examples:
        >>> answer_items("Photos 20220430_132212 and EMAIL0007; also 20220430_132212")
        ['20220430_132212', 'email0007']
        >>> answer_items("IMG_0001 and IMG_0009")
        ['img_0001', 'img_0009']
    """
    ids = _unique([m[1] for m in _MEDIA_ID.finditer(answer or "")]
                  + [m[1].lower() for m in _EMAIL_ID.finditer(answer or "")])
    return ids or [i for i in split_items(answer or "") if i]


def list_recall_score(answer: str, gold: str) -> float:
    """The ``list_recall`` rule: Jaccard of the gold items and the answer's items.

    Upstream ``_list_jaccard_core``: gold items = :func:`split_items` of the gold *string*; answer items =
    :func:`answer_items`; both empty -> 1.0, no gold item -> 0.0.

    Args:
        answer: the answer model's reply.
        gold: the gold answer string, e.g. ``"20220430_132212, email202401010001"``.

    Examples:
        >>> list_recall_score("20220430_132212, 20220502_172850", "20220502_172850, 20220430_132212")
        1.0
        >>> list_recall_score("None of them.", "20220430_132212")
        0.0
    """
    want = {i for i in split_items(gold) if i}
    have = set(answer_items(answer))
    if not want:
        return 1.0 if not have else 0.0
    return len(want & have) / len(want | have)


def judge_accuracy(reply: str) -> tuple[float, bool]:
    """The credit of an ``open_end`` judge reply, read as ATM-Bench reads it.

    Upstream ``parse_judge_response`` and ``run_llm_judge``: the text from the first ``{`` to the last
    ``}`` is parsed as JSON; when it is an object (or list) holding ``"accuracy"``, the credit is 1.0 iff
    ``str(accuracy).lower() == "true"`` (``true`` and ``"true"`` are; ``1`` and ``0.5`` are not). Otherwise
    the lowercased reply is searched: ``"accuracy": true`` -> 1, ``"accuracy": false`` -> 0, else any of
    ``accurate``, ``correct``, ``matches``, ``true``, ``yes`` -> 1 (so ``"incorrect"`` reads as 1, as
    upstream), else 0. That search is upstream's ``parse_fallback``.

    Args:
        reply: the judge's reply text.

    Returns:
        ``(credit, fallback)``: credit 1.0 or 0.0, and whether the keyword fallback decided it.

    Examples:
        >>> judge_accuracy('{"explanation": "same date", "accuracy": "true"}')
        (1.0, False)
        >>> judge_accuracy('{"accuracy": 1}')
        (0.0, False)
        >>> judge_accuracy("The prediction is correct.")
        (1.0, True)
    """
    start, end = reply.find("{"), reply.rfind("}")
    if start != -1 and end > start:
        try:
            payload = json.loads(reply[start:end + 1])
        except json.JSONDecodeError:
            payload = None
        if isinstance(payload, dict) and "accuracy" in payload:
            return float(str(payload["accuracy"]).lower() == "true"), False
    low = reply.lower()
    if '"accuracy": true' in low or '"accuracy":true' in low:
        return 1.0, True
    if '"accuracy": false' in low or '"accuracy":false' in low:
        return 0.0, True
    return float(any(w in low for w in ("accurate", "correct", "matches", "true", "yes"))), True
