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

import json
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aml_ray.contract import Message
from aml_ray.datasets.base import Question, Sample, Session
from aml_ray.media import MediaLimits, data_url, image_type, media_context

QTYPES = ("number", "list_recall", "open_end")
HARD_HAYSTACK_SIZES = (25, 50, 100, 200)
_CTX = media_context(MediaLimits())


class AtmBenchFormatError(ValueError):
    """A bundle file does not follow the layout (names the file and the field)."""


def _ms(ts: Any, where: str) -> int:
    if isinstance(ts, (int, float)):
        return int(ts * 1000) if ts < 1e11 else int(ts)
    try:
        dt = datetime.fromisoformat(str(ts).replace("Z", "+00:00"))
    except ValueError:
        raise AtmBenchFormatError(f"{where}: timestamp {ts!r} is neither ISO nor Unix time") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def _read_json(path: Path, required: bool = True) -> list[dict[str, Any]]:
    if not path.is_file():
        if required:
            raise FileNotFoundError(f"ATM-Bench file {path} not found")
        return []
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, list):
        raise AtmBenchFormatError(f"{path.name}: must be a JSON array")
    return data


def load_items(root: Path) -> dict[str, tuple[int, Message]]:
    """Every memory item of the bundle: ``id -> (timestamp ms, Add message)``.

    Raises:
        AtmBenchFormatError: an item without an id or timestamp, a repeated id, a missing image.
    """
    items: dict[str, tuple[int, Message]] = {}
    for i, e in enumerate(_read_json(root / "emails.json", required=False)):
        where = f"emails.json[{i}]"
        if not e.get("id") or "timestamp" not in e:
            raise AtmBenchFormatError(f"{where}: needs id and timestamp")
        at = _ms(e["timestamp"], where)
        text = f"[item {e['id']}] email, {e['timestamp']}\n{e.get('short_summary', '')}\n{e.get('detail', '')}".strip()
        items[str(e["id"])] = (at, Message(role="user", content=text, timestamp=at))
    for i, r in enumerate(_read_json(root / "batch_results.json", required=False)):
        where = f"batch_results.json[{i}]"
        media_path = r.get("image_path") or r.get("video_path")
        item_id = str(r.get("id") or (Path(media_path).stem if media_path else ""))
        if not item_id or "timestamp" not in r:
            raise AtmBenchFormatError(f"{where}: needs an id (or image_path/video_path) and a timestamp")
        if item_id in items:
            raise AtmBenchFormatError(f"{where}: id {item_id!r} repeats")
        at = _ms(r["timestamp"], where)
        tags = r.get("tags") or []
        details = "\n".join(x for x in (
            f"{'photo' if r.get('image_path') else 'video'}, {r['timestamp']}"
            + (f", at {r['location_name']}" if r.get("location_name") else ""),
            str(r.get("caption") or r.get("short_caption") or ""),
            f"Text in it: {r['ocr_text']}" if r.get("ocr_text") else "",
            f"Tags: {', '.join(map(str, tags)) if isinstance(tags, list) else tags}" if tags else "") if x)
        content: Any = f"[item {item_id}] {details}"
        if r.get("image_path"):
            path = root / str(r["image_path"])
            if not path.is_file():
                raise AtmBenchFormatError(f"{where}: image {r['image_path']!r} not found under {root}")
            data = path.read_bytes()
            kind = image_type(data)
            if kind is None:
                raise AtmBenchFormatError(f"{where}: {path} is not a PNG, JPEG, WEBP or GIF image")
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


def _question(q: dict[str, Any], i: int, sample_id: str, items: dict[str, Any], name: str) -> Question:
    where = f"{name}[{i}]"
    for key in ("id", "question", "answer"):
        if key not in q:
            raise AtmBenchFormatError(f"{where}: missing {key!r}")
    qtype = q.get("qtype") or ("list_recall" if isinstance(q["answer"], list) else "open_end")
    if qtype not in QTYPES:
        raise AtmBenchFormatError(f"{where}: qtype {qtype!r} is not one of {QTYPES}")
    evidence = tuple(str(e) for e in q.get("evidence_ids") or ())
    missing = [e for e in evidence if e not in items]
    if missing:
        raise AtmBenchFormatError(f"{where}: evidence_ids {missing[:3]} are not memory items")
    answer = q["answer"]
    if qtype == "list_recall":  # gold = the item ids to name (the answer list, else the evidence)
        answer = [str(a) for a in answer] if isinstance(answer, list) else list(evidence)
    else:
        answer = str(answer)
    return Question(question_id=str(q["id"]), sample_id=sample_id, question=str(q["question"]), answer=answer,
                    category=qtype, evidence=evidence)


def load_atmbench(path: Path) -> list[Sample]:
    """The main set: one sample with every item, every question of ``atm-bench.json``.

    Raises:
        FileNotFoundError: the QA file or every item file is missing.
        AtmBenchFormatError: see :func:`load_items` and the QA rules.
    """
    root = Path(path)
    items = load_items(root)
    qa = _read_json(root / "atm-bench.json")
    questions = tuple(_question(q, i, "atm", items, "atm-bench.json") for i, q in enumerate(qa))
    return [Sample(sample_id="atm", sessions=_sessions(items, items), questions=questions)]


def load_atmbench_hard(path: Path, haystack: int | None = None) -> list[Sample]:
    """The Hard subset: one sample per question, holding its evidence plus its NIAH haystack.

    Args:
        path: the bundle directory.
        haystack: items per question (one of :data:`HARD_HAYSTACK_SIZES`), or None for the whole pool.

    Raises:
        ValueError: a haystack size that is not a published one, or larger than a question's pool.
    """
    if haystack is not None and haystack not in HARD_HAYSTACK_SIZES:
        raise ValueError(f"haystack must be one of {HARD_HAYSTACK_SIZES}, got {haystack}")
    root = Path(path)
    items = load_items(root)
    samples = []
    for i, q in enumerate(_read_json(root / "atm-bench-hard.json")):
        sample_id = f"hard-{q.get('id', i)}"
        question = _question(q, i, sample_id, items, "atm-bench-hard.json")
        pool = list(dict.fromkeys([*question.evidence, *(str(x) for x in q.get("niah_evidence_ids") or ())]))
        missing = [x for x in pool if x not in items]
        if missing:
            raise AtmBenchFormatError(f"atm-bench-hard.json[{i}]: niah_evidence_ids {missing[:3]} are not items")
        if haystack is not None:
            if len(pool) < haystack:
                raise ValueError(f"question {q.get('id')}: pool of {len(pool)} items < haystack {haystack}")
            pool = pool[:haystack]
        samples.append(Sample(sample_id=sample_id, sessions=_sessions(items, pool), questions=(question,)))
    return samples
