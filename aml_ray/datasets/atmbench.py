"""ATM-Bench adapter (Multimodal track): a person's memory items -> one sample, QA -> questions.

Source: JingbiaoMei/ATM-Bench (code MIT; data on Hugging Face ``Jingbiao/ATM-Bench``): ``docs/data.md``,
``docs/niah.md`` and the readers of ``memqa/qa_agent_baselines/oracle/oracle_baseline.py``
(``load_qa_list``, ``build_batch_index``, ``resolve_media_file``, ``load_email_index``,
``apply_niah_pools``) at ``c24d06ca11cf7f83d2d0f11c04f7795bb33d1a01``. The release's layout, under
``data_path`` (the snapshot root holding ``data/``, or that ``data/`` folder itself)::

    data/atm-bench/atm-bench.json                      QA, main set
    data/atm-bench/atm-bench-hard.json                 QA, Hard subset
    data/atm-bench/niah/atm-bench-hard-niah{k}.json    Hard QA with its fixed pool, k in 25, 50, 100, 200
    data/raw_memory/email/emails.json                  emails (optional upstream)
    data/raw_memory/image/<id>.<ext>                   photos, found by file stem
    data/processed_memory/image_batch_results.json     photo records (captions, place, OCR, tags)
    data/processed_memory/video_batch_results.json     video records

The same files may also lie flat in one folder (``atm-bench.json``, ``niah/``, ``emails.json``,
``image_batch_results.json``, ``video_batch_results.json``, or one ``batch_results.json`` holding both
kinds, the name upstream's processors write).

- A QA file is a JSON array, or an object ``{"qas": [...]}`` (``load_qa_list``); an entry is ``{id,
  question, answer, evidence_ids, qtype, notes?}`` with ``answer`` a string (a list is joined by
  ``", "``) and ``qtype`` one of upstream's spellings of ``number``, ``list_recall``, ``open_end``
  (``normalize_qtype_value``). ``notes`` is never read.
- An email is ``{id, timestamp, short_summary, detail}``; a photo or video record ``{image_path |
  video_path, timestamp, location_name, short_caption, caption, ocr_text, tags}`` (more keys ignored)
  whose id is the stem of its path (``build_batch_index``; a later record of the same stem replaces an
  earlier one, as upstream). ``timestamp`` is ISO or Unix time, or null for a photo without EXIF.
- A photo's image is looked up by its id in ``raw_memory/image`` with upstream's extensions (``.jpg
  .jpeg .png .tiff .bmp .webp .dng``, also upper case), else at its ``image_path`` when that exists.

Every item is Added as one message: ``[item <id>]``, the photo's image part, then its fields as the
Oracle baseline formats evidence (``Type``, ``Timestamp``, ``Location``, ``Short Caption``, ``Caption``,
``OCR``, ``Tags``; emails ``Timestamp``, ``Summary``, ``Detail``; empty fields left out). Videos are Added
as their text only. Items are grouped into one session per calendar day (UTC) in time order; undated
items (null timestamp) form a last session ``undated`` with no message timestamp.

One bad image (not found, a type the contract does not take such as BMP or DNG, over the suite's size
limits: :func:`aml_ray.media.image_problem`) is that item's error, not the bundle's: the item is Added
as its text with ``[image not available: <reason>]`` and a warning names the file, the item and the
reason. The limits are the shipped ``multimodal`` suite's.

Main set: one sample holding every item; all questions ask it. Hard subset: one sample per question,
holding only its NIAH pool (``niah_evidence_ids`` of ``niah/atm-bench-hard-niah{k}.json``, matched by
``id``; k = ``haystack``, default :data:`DEFAULT_HARD_HAYSTACK`); every Hard question must have a pool
there (upstream's ``--niah-strict``), so the subset never runs as an oracle.

Ids: ids that decide what is Added (a pool's) must name items; ``evidence_ids`` are audit only and kept
as given (upstream warns and goes on). An id is matched as given, then by its stem (``x.jpg`` -> ``x``),
then case-insensitively. Malformed files raise :class:`DatasetFormatError` naming the file, the item
(index and id) and the field.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aml_ray.contract import Message
from aml_ray.datasets.base import Question, Sample, Session
from aml_ray.datasets.validate import DatasetFormatError, Where, in_file, read_json
from aml_ray.media import data_url, image_problem, image_type, media_context
from aml_ray.media import suite_media_limits as media_limits

log = logging.getLogger(__name__)

QTYPES = ("number", "list_recall", "open_end")
#: Upstream ``normalize_qtype_value``: accepted spellings of each qtype (compared lowercased, stripped).
QTYPE_SPELLINGS = {"number": ("number", "num", "numeric"),
                   "list_recall": ("list_recall", "list-recall", "list", "listrecall"),
                   "open_end": ("open_end", "open-end", "open", "openended", "open-ended", "open_ended")}
#: The published NIAH pool sizes (``docs/niah.md``).
HARD_HAYSTACK_SIZES = (25, 50, 100, 200)
#: The pool the Hard bundle runs with when none is asked for: the largest, the most distractors.
DEFAULT_HARD_HAYSTACK = 200
#: Photo file extensions, in upstream's lookup order (``memqa/global_config.py`` ``IMAGE_PROCESSING_CONFIG``).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".tiff", ".bmp", ".webp", ".dng")
UNDATED = "undated"

#: The name this adapter's format errors had; every adapter now raises :class:`DatasetFormatError`.
AtmBenchFormatError = DatasetFormatError


@dataclass(frozen=True)
class Layout:
    """Where a bundle's files are (release layout, else flat; module docstring).

    Attributes:
        root: ``data_path`` as given.
        data: the folder holding ``atm-bench/`` (release) or every file (flat).
        qa: the folder of the QA files and of ``niah/``.
    """

    root: Path
    data: Path
    qa: Path

    @classmethod
    def of(cls, path: Path) -> Layout:
        """The layout of ``path`` (the snapshot root, its ``data/`` folder, or a flat folder)."""
        root = Path(path)
        data = root / "data" if (root / "data" / "atm-bench").is_dir() else root
        return cls(root, data, data / "atm-bench" if (data / "atm-bench").is_dir() else data)

    def first(self, *relative: str) -> Path | None:
        """The first of ``relative`` (paths under ``data``) that is a file, or None."""
        return next((self.data / r for r in relative if (self.data / r).is_file()), None)

    def qa_file(self, name: str) -> Path:
        return self.qa / name

    def niah_file(self, k: int) -> Path:
        return self.qa / "niah" / f"atm-bench-hard-niah{k}.json"

    def emails(self) -> Path | None:
        return self.first("raw_memory/email/emails.json", "emails.json")

    def records(self) -> list[Path]:
        """The photo/video record files present: image, video, then a combined ``batch_results.json``."""
        found = [self.first(f"processed_memory/{kind}_batch_results.json", f"{kind}_batch_results.json")
                 for kind in ("image", "video")]
        return [p for p in [*found, self.first("batch_results.json")] if p is not None]

    def image_of(self, item_id: str, image_path: str | None) -> Path | None:
        """A photo's file: by stem in ``raw_memory/image`` (upstream ``resolve_media_file``), else its path."""
        folder = self.data / "raw_memory" / "image"
        names = [item_id] + [item_id + e for e in IMAGE_EXTENSIONS] + [item_id + e.upper() for e in IMAGE_EXTENSIONS]
        found = next((folder / n for n in names if (folder / n).is_file()), None)
        if found is None and image_path:
            p = Path(image_path)
            found = next((c for c in ([p] if p.is_absolute() else [self.root / p, self.data / p, self.data.parent / p])
                          if c.is_file()), None)
        return found


@dataclass(frozen=True)
class Item:
    """One memory item: its time (ms, None when undated) and its Add message."""

    at: int | None
    message: Message


def _ms(ts: Any, where: Where) -> int | None:
    """UTC ms of an ISO or Unix timestamp (naive ISO is UTC); None for null."""
    if ts is None:
        return None
    where.check(ts, (str, int, float), "an ISO timestamp, Unix time or null")
    if isinstance(ts, (int, float)):
        return int(ts * 1000) if ts < 1e11 else int(ts)
    try:
        dt = datetime.fromisoformat(ts.strip().replace("Z", "+00:00"))
    except ValueError:
        raise where.error(f"timestamp {ts!r} is neither ISO nor Unix time") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def _text(obj: dict[str, Any], key: str, where: Where) -> str:
    return str(where.get(obj, key, (str, int, float), "text", required=False, default="")).strip()


def _fields(lines: Iterable[tuple[str, str]]) -> str:
    return "\n".join(f"{k}: {v}" for k, v in lines if v)


def _emails(layout: Layout, items: dict[str, Item]) -> None:
    path = layout.emails()
    if path is None:
        return
    with in_file(path):
        for i, e in enumerate(read_json(path, list, "a JSON array of email records")):
            where = Where.item_of(i, e, "id")
            where.check(e, dict, "an email record {id, timestamp, short_summary, detail}")
            item_id = str(where.get(e, "id", (str, int), nonempty=True))
            at = _ms(e.get("timestamp"), where / "timestamp")
            body = _fields([("Timestamp", _text(e, "timestamp", where)), ("Summary", _text(e, "short_summary", where)),
                            ("Detail", _text(e, "detail", where))])
            items[item_id] = Item(at, Message(role="user", content=f"[item {item_id}]\nType: email\n{body}".strip(),
                                              timestamp=at))


def _record(layout: Layout, path: Path, i: int, r: Any, items: dict[str, Item]) -> None:
    where = Where.item_of(i, r, "image_path")
    where.check(r, dict, "a photo/video record {image_path | video_path, timestamp, caption, ...}")
    image = where.get(r, "image_path", str, "a file path", required=False)
    media = image or where.get(r, "video_path", str, "a file path", required=False)
    if not media:
        raise (where / "image_path").error("missing; expected image_path or video_path (the item's id is its stem)")
    item_id = Path(media.replace("\\", "/")).stem
    at = _ms(r.get("timestamp"), where / "timestamp")
    tags = where.get(r, "tags", (list, str), "a list of tags", required=False, default=[])
    details = _fields([("Type", "image" if image else "video"), ("Timestamp", _text(r, "timestamp", where)),
                       ("Location", _text(r, "location_name", where)),
                       ("Short Caption", _text(r, "short_caption", where)), ("Caption", _text(r, "caption", where)),
                       ("OCR", _text(r, "ocr_text", where)),
                       ("Tags", ", ".join(map(str, tags)) if isinstance(tags, list) else tags)])
    content: Any = f"[item {item_id}]\n{details}"
    if image:
        part, problem, file = _image(layout, item_id, image)
        if part is None:
            log.warning("%s: item %d (id %r): image %s: %s; the item is Added without it", path, i, item_id,
                        file or image, problem)
            content = f"[item {item_id}] [image not available: {problem}]\n{details}"
        else:
            content = [{"type": "text", "text": f"[item {item_id}]"}, part, {"type": "text", "text": details}]
    if item_id in items:
        log.warning("%s: item %d: id %r repeats; the later record is used (upstream build_batch_index)", path, i,
                    item_id)
    items[item_id] = Item(at, Message.model_validate({"role": "user", "content": content, "timestamp": at},
                                                     context=media_context(media_limits())))


def _image(layout: Layout, item_id: str, image_path: str) -> tuple[dict[str, Any] | None, str, Path | None]:
    """``(image_url part, "", file)`` for a usable photo, else ``(None, reason, file or None)``."""
    file = layout.image_of(item_id, image_path)
    if file is None:
        return None, f"no file {item_id}.* in {layout.data / 'raw_memory' / 'image'} and none at {image_path}", None
    data = file.read_bytes()
    problem = image_problem(data, media_limits())
    if problem:
        return None, problem, file
    return {"type": "image_url", "image_url": {"url": data_url(image_type(data) or "png", data)}}, "", file


def load_items(path: Path) -> dict[str, Item]:
    """Every memory item of the bundle at ``path``: ``id -> Item`` (emails first, then photos, videos).

    Raises:
        FileNotFoundError: the bundle has no email and no record file.
        DatasetFormatError: a record without a path, an email without an id, a field of the wrong type, a
            timestamp that is neither ISO, Unix time nor null; the message names the file, the item and
            the field.
    """
    layout = Layout.of(path)
    items: dict[str, Item] = {}
    _emails(layout, items)
    for records in layout.records():
        with in_file(records):
            for i, r in enumerate(read_json(records, list, "a JSON array of records")):
                _record(layout, records, i, r, items)
    if not items:
        raise FileNotFoundError(f"no ATM-Bench memory items under {layout.data} (raw_memory/email/emails.json, "
                                "processed_memory/{image,video}_batch_results.json)")
    return items


def _sessions(items: dict[str, Item], ids: Iterable[str]) -> tuple[Session, ...]:
    by_day: dict[str, list[tuple[int, str, Message]]] = {}
    for i in ids:
        item = items[i]
        day = UNDATED if item.at is None else datetime.fromtimestamp(item.at / 1000, tz=timezone.utc).date().isoformat()
        by_day.setdefault(day, []).append((item.at or 0, i, item.message))
    days = sorted(d for d in by_day if d != UNDATED) + ([UNDATED] if UNDATED in by_day else [])
    out, last = [], 0
    for n, day in enumerate(days, start=1):
        msgs = sorted(by_day[day], key=lambda t: (t[0], t[1]))
        last = msgs[0][0] if day != UNDATED else last
        out.append(Session(key=day, index=n, started_at_ms=last, messages=tuple(m for _, _, m in msgs)))
    return tuple(out)


def resolve_id(item_id: str, items: dict[str, Any]) -> str | None:
    """The item an id names: as given, by its stem, then case-insensitively; None when none.

    Examples:
        >>> resolve_id("20220430_132212.jpg", {"20220430_132212": 1}), resolve_id("Email7", {"email7": 1})
        ('20220430_132212', 'email7')
    """
    for candidate in (item_id, Path(item_id).stem):
        if candidate in items:
            return candidate
    lowered = {k.lower(): k for k in items}
    return lowered.get(item_id.lower()) or lowered.get(Path(item_id).stem.lower())


def _qtype(value: Any, where: Where) -> str:
    where.check(value, str, f"a qtype: one of {QTYPES}")
    low = value.strip().lower()
    found = next((q for q, names in QTYPE_SPELLINGS.items() if low in names), None)
    if found is None:
        raise where.error(f"qtype {value!r} is not one of {QTYPES} (or upstream's spellings of them)")
    return found


def _question(q: Any, i: int, sample_id: str) -> Question:
    where = Where.item_of(i, q, "id")
    where.check(q, dict, "a QA object {id, question, answer, evidence_ids, qtype}")
    qid = where.get(q, "id", (str, int), nonempty=True)
    text = where.get(q, "question", str, nonempty=True)
    answer = where.get(q, "answer", (str, int, float, list), "the gold answer string")
    if isinstance(answer, list):
        for j, a in enumerate(answer):
            (where / "answer" / j).check(a, (str, int, float), "an id or text")
        answer = ", ".join(str(a) for a in answer)
    qtype = _qtype(q.get("qtype"), where / "qtype") if "qtype" in q else None
    if qtype is None:
        raise (where / "qtype").error(f"missing; expected one of {QTYPES}")
    evidence = where.get(q, "evidence_ids", list, "a list of item ids", required=False, default=[])
    for j, e in enumerate(evidence):
        (where / "evidence_ids" / j).check(e, (str, int), "an item id")
    return Question(question_id=str(qid), sample_id=sample_id, question=text, answer=str(answer), category=qtype,
                    evidence=tuple(str(e) for e in evidence))


def read_qas(path: Path) -> list[Any]:
    """A QA file's entries: a JSON array, or the ``qas`` list of an object (upstream ``load_qa_list``).

    Raises:
        FileNotFoundError: no such file.
        DatasetFormatError: not JSON, or neither an array nor an object with a ``qas`` array.
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"ATM-Bench QA file {path} not found")
    data = read_json(path, (list, dict), 'a JSON array of QA entries, or {"qas": [...]}')
    if isinstance(data, dict):
        with in_file(path):
            return Where("top level").get(data, "qas", list, "a list of QA entries")
    return data


def _unknown_evidence(questions: Iterable[Question], items: dict[str, Item], path: Path) -> None:
    unknown = sorted({e for q in questions for e in q.evidence if resolve_id(e, items) is None})
    if unknown:
        log.warning("%s: %d evidence id(s) name no memory item (audit only, kept as given): %s", path, len(unknown),
                    ", ".join(unknown[:5]))


def load_atmbench(path: Path) -> list[Sample]:
    """The main set: one sample ``atm`` with every item, and every question of ``atm-bench.json``.

    Raises:
        FileNotFoundError: the QA file or every item file is missing.
        DatasetFormatError: see :func:`load_items` and :func:`read_qas`; a question without ``id``,
            ``question``, ``answer`` or a known ``qtype``.
    """
    layout = Layout.of(path)
    qa_file = layout.qa_file("atm-bench.json")
    qas = read_qas(qa_file)
    items = load_items(path)
    with in_file(qa_file):
        questions = tuple(_question(q, i, "atm") for i, q in enumerate(qas))
    _unknown_evidence(questions, items, qa_file)
    return [Sample(sample_id="atm", sessions=_sessions(items, items), questions=questions)]


def load_atmbench_hard(path: Path, haystack: int | None = None) -> list[Sample]:
    """The Hard subset: one sample per question of ``atm-bench-hard.json``, holding its NIAH pool.

    Args:
        path: the bundle (module docstring).
        haystack: the pool size ``k`` (one of :data:`HARD_HAYSTACK_SIZES`): the pools of
            ``niah/atm-bench-hard-niah{k}.json``; None: :data:`DEFAULT_HARD_HAYSTACK`.

    Raises:
        ValueError: a size that is not a published one.
        FileNotFoundError: the QA file, the pool file or every item file is missing.
        DatasetFormatError: as :func:`load_atmbench`; a Hard question with no pool in the pool file, an
            empty pool, or a pool id that names no item (the pool file, the entry and the field named).
    """
    k = DEFAULT_HARD_HAYSTACK if haystack is None else haystack
    if k not in HARD_HAYSTACK_SIZES:
        raise ValueError(f"haystack must be one of {HARD_HAYSTACK_SIZES}, got {haystack}")
    layout = Layout.of(path)
    qa_file, pool_file = layout.qa_file("atm-bench-hard.json"), layout.niah_file(k)
    qas = read_qas(qa_file)
    if not pool_file.is_file():
        raise FileNotFoundError(f"ATM-Bench-Hard NIAH pool file {pool_file} not found (the Hard subset runs over "
                                f"its fixed pools of {k} items; docs/niah.md)")
    items = load_items(path)
    pools: dict[str, list[str]] = {}
    with in_file(pool_file):
        for i, entry in enumerate(read_qas(pool_file)):
            where = Where.item_of(i, entry, "id")
            where.check(entry, dict, "a QA entry with niah_evidence_ids")
            qid = str(where.get(entry, "id", (str, int), nonempty=True))
            pool = where.get(entry, "niah_evidence_ids", list, "the question's pool: a list of item ids", nonempty=True)
            resolved = []
            for j, x in enumerate(pool):
                (where / "niah_evidence_ids" / j).check(x, (str, int), "an item id")
                found = resolve_id(str(x), items)
                if found is None:
                    raise (where / "niah_evidence_ids" / j).error(f"id {x!r} names no memory item")
                resolved.append(found)
            pools[qid] = list(dict.fromkeys(resolved))
    samples = []
    with in_file(qa_file):
        for i, q in enumerate(qas):
            sample_id = f"hard-{q.get('id', i) if isinstance(q, dict) else i}"
            question = _question(q, i, sample_id)
            if question.question_id not in pools:
                raise Where.item_of(i, q, "id").error(f"has no pool in {pool_file.name}; every Hard question needs one")
            samples.append(Sample(sample_id=sample_id, sessions=_sessions(items, pools[question.question_id]),
                                  questions=(question,)))
    _unknown_evidence((s.questions[0] for s in samples), items, qa_file)
    return samples
