"""ATM-Bench adapter (Multimodal track): a person's memory items -> one sample, QA -> questions.

Source: JingbiaoMei/ATM-Bench @ ``ef4e5dff1a47ec71213a06e359f02753defa8fb1`` ``docs/data.md`` (MIT; the
data is HF ``Jingbiao/ATM-Bench``, not obtained here, MANIFEST.md section 2). Layout read from the
bundle directory (``data_path``):

- ``atm-bench.json`` (``atm-bench-hard.json`` for the Hard subset): an array of
  ``{id, question, answer, evidence_ids[], qtype}``; ``qtype`` is ``number``, ``list_recall`` or
  ``open_end`` (the scoring rule, :mod:`aml_ray.stages.atmbench_scorer`); Hard/NIAH entries may add
  ``niah_evidence_ids`` (the question's fixed haystack);
- ``emails.json``: ``[{id, timestamp, short_summary, detail}]``;
- ``batch_results.json``: image/video records ``{id?, image_path | video_path, timestamp,
  location_name, short_caption, caption, ocr_text, tags}``; a record's id is ``id`` or its file stem;
  ``image_path`` is relative to the bundle directory.

Every item is Added as one message: its id as text next to its image part (so list questions can name
items), then its timestamp, location, caption, OCR text and tags (emails: summary and detail). Videos
are not an image type of the contract: a video record is Added as its text only. Items are grouped into
one session per calendar day (UTC), in time order.

Main set: one sample holding every item; all questions ask it. Hard subset: each question is its own
sample whose memory is its haystack: ``evidence_ids`` plus ``niah_evidence_ids`` (the published fixed
haystack sizes are 25, 50, 100 and 200 items); ``haystack`` picks the first N of that pool (evidence
first), or the whole pool when None.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aml_ray.contract import Message
from aml_ray.datasets.base import Question, Sample, Session
from aml_ray.datasets.validate import DatasetFormatError, Where, in_file, read_json
from aml_ray.media import MediaLimits, data_url, image_type, media_context

QTYPES = ("number", "list_recall", "open_end")
HARD_HAYSTACK_SIZES = (25, 50, 100, 200)
_CTX = media_context(MediaLimits())


#: The name this adapter's format errors had; every adapter now raises :class:`DatasetFormatError`.
AtmBenchFormatError = DatasetFormatError


def _ms(ts: Any, where: Where) -> int:
    where.check(ts, (str, int, float), "an ISO timestamp or Unix time")
    if isinstance(ts, (int, float)):
        return int(ts * 1000) if ts < 1e11 else int(ts)
    try:
        dt = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        raise where.error(f"timestamp {ts!r} is neither ISO nor Unix time") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def _read_json(path: Path, required: bool = True) -> list[Any]:
    if not path.is_file():
        if required:
            raise FileNotFoundError(f"ATM-Bench file {path} not found")
        return []
    return read_json(path, list, "a JSON array of records")


def load_items(root: Path) -> dict[str, tuple[int, Message]]:
    """Every memory item of the bundle: ``id -> (timestamp ms, Add message)``.

    Raises:
        DatasetFormatError: an item without an id or timestamp, a field of the wrong type, a repeated id,
            a missing image; the message names the file, the item (index and id) and the field.
    """
    items: dict[str, tuple[int, Message]] = {}
    emails = root / "emails.json"
    with in_file(emails):
        for i, e in enumerate(_read_json(emails, required=False)):
            where = Where.item_of(i, e, "id")
            where.check(e, dict, "an email record {id, timestamp, short_summary, detail}")
            item_id = str(where.get(e, "id", (str, int), nonempty=True))
            at = _ms(where.get(e, "timestamp", (str, int, float), "an ISO timestamp or Unix time"), where / "timestamp")
            summary, detail = (where.get(e, k, (str, int, float), "text", required=False, default="")
                               for k in ("short_summary", "detail"))
            if item_id in items:
                raise (where / "id").error(f"id {item_id!r} repeats")
            text = f"[item {item_id}] email, {e['timestamp']}\n{summary}\n{detail}".strip()
            items[item_id] = (at, Message(role="user", content=text, timestamp=at))
    records = root / "batch_results.json"
    with in_file(records):
        for i, r in enumerate(_read_json(records, required=False)):
            where = Where.item_of(i, r, "id")
            where.check(r, dict, "an image/video record {id?, image_path | video_path, timestamp, ...}")
            image = where.get(r, "image_path", str, required=False)
            media_path = image or where.get(r, "video_path", str, required=False)
            item_id = str(where.get(r, "id", (str, int), required=False)
                          or (Path(media_path).stem if media_path else ""))
            if not item_id:
                raise (where / "id").error("missing; expected an id (or image_path/video_path)")
            if item_id in items:
                raise (where / "id").error(f"id {item_id!r} repeats")
            at = _ms(where.get(r, "timestamp", (str, int, float), "an ISO timestamp or Unix time"), where / "timestamp")
            tags = where.get(r, "tags", (list, str), "a list of tags", required=False, default=[])
            details = "\n".join(x for x in (
                f"{'photo' if image else 'video'}, {r['timestamp']}"
                + (f", at {r['location_name']}" if r.get("location_name") else ""),
                str(r.get("caption") or r.get("short_caption") or ""),
                f"Text in it: {r['ocr_text']}" if r.get("ocr_text") else "",
                f"Tags: {', '.join(map(str, tags)) if isinstance(tags, list) else tags}" if tags else "") if x)
            content: Any = f"[item {item_id}] {details}"
            if image:
                path = root / image
                if not path.is_file():
                    raise (where / "image_path").error(f"image {image!r} not found under {root}")
                data = path.read_bytes()
                kind = image_type(data)
                if kind is None:
                    raise (where / "image_path").error(f"{path} is not a PNG, JPEG, WEBP or GIF image")
                content = [{"type": "text", "text": f"[item {item_id}]"},
                           {"type": "image_url", "image_url": {"url": data_url(kind, data)}},
                           {"type": "text", "text": details}]
            items[item_id] = (at, Message.model_validate({"role": "user", "content": content, "timestamp": at},
                                                         context=_CTX))
    if not items:
        raise FileNotFoundError(f"no ATM-Bench memory items (emails.json, batch_results.json) under {root}")
    return items


def _sessions(items: dict[str, tuple[int, Message]], ids: Iterable[str]) -> tuple[Session, ...]:
    by_day: dict[str, list[tuple[int, str, Message]]] = {}
    for i in ids:
        at, msg = items[i]
        day = datetime.fromtimestamp(at / 1000, tz=timezone.utc).date().isoformat()
        by_day.setdefault(day, []).append((at, i, msg))
    out = []
    for n, day in enumerate(sorted(by_day), start=1):
        msgs = sorted(by_day[day], key=lambda t: (t[0], t[1]))
        out.append(Session(key=day, index=n, started_at_ms=msgs[0][0], messages=tuple(m for _, _, m in msgs)))
    return tuple(out)


def _question(q: Any, i: int, sample_id: str, items: dict[str, Any]) -> Question:
    where = Where.item_of(i, q, "id")
    where.check(q, dict, "a question object {id, question, answer, evidence_ids, qtype}")
    qid = where.get(q, "id", (str, int), nonempty=True)
    text = where.get(q, "question", str, nonempty=True)
    answer = where.get(q, "answer", (str, int, float, list), "the gold answer: text, a number or a list of item ids")
    qtype = where.get(q, "qtype", str, required=False) or ("list_recall" if isinstance(answer, list) else "open_end")
    if qtype not in QTYPES:
        raise (where / "qtype").error(f"qtype {qtype!r} is not one of {QTYPES}")
    evidence = tuple(str(e) for e in where.get(q, "evidence_ids", list, "a list of item ids", required=False,
                                               default=[]))
    missing = [e for e in evidence if e not in items]
    if missing:
        raise (where / "evidence_ids").error(f"evidence_ids {missing[:3]} are not memory items")
    if qtype == "list_recall":  # gold = the item ids to name (the answer list, else the evidence)
        answer = [str(a) for a in answer] if isinstance(answer, list) else list(evidence)
    else:
        answer = str(answer)
    return Question(question_id=str(qid), sample_id=sample_id, question=text, answer=answer,
                    category=qtype, evidence=evidence)


def load_atmbench(path: Path) -> list[Sample]:
    """The main set: one sample with every item, every question of ``atm-bench.json``.

    Raises:
        FileNotFoundError: the QA file or every item file is missing.
        DatasetFormatError: see :func:`load_items` and the QA rules; the message names the file, the item
            and the field.
    """
    root = Path(path)
    items = load_items(root)
    qa_file = root / "atm-bench.json"
    qa = _read_json(qa_file)
    with in_file(qa_file):
        questions = tuple(_question(q, i, "atm", items) for i, q in enumerate(qa))
    return [Sample(sample_id="atm", sessions=_sessions(items, items), questions=questions)]


def load_atmbench_hard(path: Path, haystack: int | None = None) -> list[Sample]:
    """The Hard subset: one sample per question, holding its evidence plus its NIAH haystack.

    Args:
        path: the bundle directory.
        haystack: items per question (one of :data:`HARD_HAYSTACK_SIZES`), or None for the whole pool.

    Raises:
        ValueError: a haystack size that is not a published one, or larger than a question's pool.
        DatasetFormatError: see :func:`load_atmbench`.
    """
    if haystack is not None and haystack not in HARD_HAYSTACK_SIZES:
        raise ValueError(f"haystack must be one of {HARD_HAYSTACK_SIZES}, got {haystack}")
    root = Path(path)
    items = load_items(root)
    qa_file = root / "atm-bench-hard.json"
    samples = []
    with in_file(qa_file):
        for i, q in enumerate(_read_json(qa_file)):
            where = Where.item_of(i, q, "id")
            sample_id = f"hard-{q.get('id', i) if isinstance(q, dict) else i}"
            question = _question(q, i, sample_id, items)
            niah = where.get(q, "niah_evidence_ids", list, "a list of item ids", required=False, default=[])
            pool = list(dict.fromkeys([*question.evidence, *(str(x) for x in niah)]))
            missing = [x for x in pool if x not in items]
            if missing:
                raise (where / "niah_evidence_ids").error(f"niah_evidence_ids {missing[:3]} are not items")
            if haystack is not None:
                if len(pool) < haystack:
                    raise ValueError(f"question {q.get('id')}: pool of {len(pool)} items < haystack {haystack}")
                pool = pool[:haystack]
            samples.append(Sample(sample_id=sample_id, sessions=_sessions(items, pool), questions=(question,)))
    return samples
