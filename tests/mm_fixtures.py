"""Tiny generated images and small files in the released Mem-Gallery / ATM-Bench layouts (no dataset is copied).

The layouts are the releases' (the adapters' docstrings give their sources): Mem-Gallery's scenario files
(``character_profile`` / ``multi_session_dialogues`` / ``dialogues`` / ``round``, list-valued image fields,
``"human-annotated QAs"`` with ``point`` / ``clue``) and ATM-Bench's ``data/`` tree (``atm-bench/*.json``
with a ``{"qas": [...]}`` file and NIAH pools, ``raw_memory/``, ``processed_memory/``), or its files flat in
one folder.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from pathlib import Path

#: The 20 scenario files of the Mem-Gallery release (``benchmark/data/dialog/``), by name.
MEMGALLERY_SCENARIOS = (
    "AI_Robotics_Automation_Future_Tech", "Academic_Animal_Pet_Research_Life",
    "Architecture_Art_Culture_Exhibition_Technology", "Astronomy_Physics_Scientific_Experiments_Cosmology",
    "Baking_Dessert_Daily_Life_Skill", "Dog_Behavior_Research_Academic_Life", "Education_Career_Research_Lifestyle",
    "Entrepreneurship_Blockchain_Economics_Logistics_Nature", "Fashion_Personal_Care_Lifestyle_Shopping",
    "Global_Travel_Cultural_Sightseeing", "Global_Travel_Sustainable_Fashion_Design", "Home_Health_Lifestyle_Product",
    "Home_Repair_Maintenance_Cleaning", "Landscape_Travel_Architecture_Nature",
    "Music_Dance_Theater_Performance_Learning", "Nature_Economics_Programming_Student_Life",
    "Parenting_Commuting_Hobbies_Travel_Gear", "Python_Botany_AI_Student_Life",
    "Real_Estate_Home_Decor_DIY_Lifestyle", "Technology_Ethics_Future_Society")


def png(rgb: tuple[int, int, int] = (255, 0, 0), size: int = 1) -> bytes:
    """A valid size x size PNG of one colour, built with zlib/struct."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    raw = b"".join(b"\x00" + bytes(rgb) * size for _ in range(size))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def png_url(rgb: tuple[int, int, int] = (255, 0, 0)) -> str:
    return "data:image/png;base64," + base64.b64encode(png(rgb)).decode()


def bmp(rgb: tuple[int, int, int] = (9, 9, 9)) -> bytes:
    """A valid 1 x 1 24-bit BMP (Pillow when installed, else built by hand)."""
    try:
        import io

        from PIL import Image
    except ImportError:
        pixel = bytes(reversed(rgb)) + b"\x00"
        return (b"BM" + struct.pack("<IHHI", 58, 0, 0, 54) + struct.pack("<IiiHHIIiiII", 40, 1, 1, 1, 24, 0, 4, 0, 0,
                                                                        0, 0) + pixel)
    out = io.BytesIO()
    Image.new("RGB", (1, 1), rgb).save(out, format="BMP")
    return out.getvalue()


def scenario(stem: str, *, name: str = "Ada") -> dict:
    """One scenario in the Mem-Gallery release layout: two sessions, images in round D1:1 (two), D1:2 (one)."""
    img = f"../image/{stem}"
    return {
        "character_profile": {"name": name, "persona_summary": f"{name} likes cycling.", "traits": ["curious"]},
        "multi_session_dialogues": [
            {"session_id": "D1", "date": "2024-05-01", "dialogues": [
                {"round": "D1:1", "user": "Look at my new bicycle", "assistant": "A red bicycle, nice!",
                 "image_id": ["D1:IMG_001", "D1:IMG_002"],
                 "input_image": [f"{img}/D1_IMG_001.png", f"{img}/D1_IMG_002.png"],
                 "image_caption": ["a red bicycle bicycle", "a blue helmet"]},
                {"round": "D1:2", "user": "I also bought a blue helmet bicycle", "assistant": "Great.",
                 "image_id": ["D1:IMG_003"], "input_image": [f"{img}/D1_IMG_003.png"],
                 "image_caption": ["a blue helmet"]},
                {"round": "D1:3", "user": "", "assistant": ""}]},
            {"session_id": "D2", "date": "2024-05-08", "dialogues": [
                {"round": "D2:1", "user": "My sister lives in Oslo", "assistant": "Noted."}]}],
        "human-annotated QAs": [
            {"point": "VR", "question": "What colour is my bicycle?", "answer": "Red", "session_id": ["D1"],
             "clue": ["D1:1"]},
            {"point": "VS", "question": "Which images show bicycle gear?", "answer": "D1:IMG_001, D1:IMG_003",
             "session_id": ["D1"], "clue": ["D1:1", "D1:2"], "question_image": f"{img}/QA_IMG_001.png",
             "image_caption": "a green bicycle"},
        ],
    }


def write_memgallery(dialog: Path, stems: tuple[str, ...] = ("scenario_001",)) -> Path:
    """Scenario files in ``dialog`` (the release's ``data/dialog``), their images in ``dialog/../image/<stem>/``.

    Each scenario has red, blue and yellow round images and a green question image. Returns ``dialog``.
    """
    dialog.mkdir(parents=True, exist_ok=True)
    for stem in stems:
        images = dialog.parent / "image" / stem
        images.mkdir(parents=True, exist_ok=True)
        for file, rgb in (("D1_IMG_001", (255, 0, 0)), ("D1_IMG_002", (0, 0, 255)), ("D1_IMG_003", (255, 255, 0)),
                          ("QA_IMG_001", (0, 255, 0))):
            (images / f"{file}.png").write_bytes(png(rgb))
        (dialog / f"{stem}.json").write_text(json.dumps(scenario(stem)))
    return dialog


def write_memgallery_release(root: Path) -> Path:
    """The 20 scenario files of the release under ``root/dialog`` with images under ``root/image``."""
    write_memgallery(root / "dialog", MEMGALLERY_SCENARIOS)
    return root


#: ATM-Bench items of the fixtures: ids as the release names them (capture time, ``email<digits>``).
HOTEL, GYM = "email202403020900", "email202403051200"
COLOSSEUM, BREAKFAST, STREET, OLD_SCAN, RAW_BMP = ("20240303_183000", "20240304_080000", "20240304_090000",
                                                  "20230101_000000", "20240306_100000")


def atm_questions() -> tuple[list[dict], list[dict]]:
    """(main QA, Hard QA) entries in the release's schema."""
    main = [
        {"id": "n1", "question": "How many nights did I book in Rome?", "answer": "3", "evidence_ids": [HOTEL],
         "qtype": "number", "notes": "PRIVATE: never sent"},
        {"id": "l1", "question": "Which photos did I take in Rome?", "answer": f"{COLOSSEUM}, {BREAKFAST}",
         "evidence_ids": [COLOSSEUM, f"{BREAKFAST}.jpg"], "qtype": "list_recall", "notes": ""},
        {"id": "o1", "question": "What did I have for breakfast in Rome?", "answer": "Cappuccino and cornetto",
         "evidence_ids": [BREAKFAST], "qtype": "open_end", "notes": ""}]
    hard = [{"id": "h1", "question": "How much was the gym?", "answer": "30 euros", "evidence_ids": [GYM],
             "qtype": "number", "notes": ""}]
    return main, hard


def _records() -> tuple[list[dict], list[dict]]:
    image_path = "/home/someone/ATM-Bench/data/raw_memory/image/{}.jpg"  # a path from another machine: ids are stems
    photos = [
        {"image_path": image_path.format(COLOSSEUM), "timestamp": "2024-03-03 18:30:00", "location_name": "Rome",
         "short_caption": "Colosseum", "caption": "The Colosseum at sunset", "ocr_text": "", "tags": ["travel"]},
        {"image_path": image_path.format(BREAKFAST), "timestamp": "2024-03-04 08:00:00+00:00", "location_name": "Rome",
         "short_caption": "Breakfast", "caption": "Cappuccino and cornetto", "ocr_text": "CAFFE", "tags": ["food"]},
        {"image_path": image_path.format(OLD_SCAN), "timestamp": None, "location_name": "",  # no EXIF: no timestamp
         "short_caption": "A scanned postcard", "caption": "An old postcard of Oslo", "ocr_text": "", "tags": []},
        {"image_path": image_path.format(RAW_BMP), "timestamp": "2024-03-06 10:00:00", "location_name": "Rome",
         "short_caption": "Gelato", "caption": "A pistachio gelato", "ocr_text": "", "tags": ["food"]}]
    videos = [{"video_path": f"/home/someone/ATM-Bench/data/raw_memory/video/{STREET}.mp4",
               "timestamp": "2024-03-04 09:00:00", "location_name": "Rome", "short_caption": "Street",
               "caption": "A busy street", "ocr_text": "", "tags": []}]
    return photos, videos


def _emails() -> list[dict]:
    return [{"id": HOTEL, "timestamp": "2024-03-02 09:00:00", "short_summary": "Hotel booking in Rome",
             "detail": "Your booking for 3 nights costs $420."},
            {"id": GYM, "timestamp": "2024-03-05 12:00:00", "short_summary": "Gym receipt", "detail": "Paid 30 EUR."}]


#: NIAH pools of the fixtures by size: the 25 pool is smaller than the 200 one.
NIAH_POOLS = {25: [GYM, HOTEL, COLOSSEUM], 200: [BREAKFAST, GYM, STREET, HOTEL, COLOSSEUM, OLD_SCAN]}


def write_atmbench(root: Path, *, release: bool = False) -> Path:
    """An ATM-Bench bundle: two emails, four photos (one without EXIF, one a BMP), a video, QA of each qtype,
    a Hard question with NIAH pools of 25 and 200.

    Args:
        root: where to write; what ``--data`` names.
        release: the release's ``data/`` tree (main QA as ``{"qas": [...]}``, photos in
            ``data/raw_memory/image`` found by stem); else the files flat in ``root`` (``batch_results.json``
            holding photos and videos, photos at ``images/`` found by their ``image_path``).

    Returns:
        ``root``.
    """
    main, hard = atm_questions()
    photos, videos = _records()
    pixels = {COLOSSEUM: png((10, 20, 30)), BREAKFAST: png((40, 50, 60)), OLD_SCAN: png((70, 80, 90))}
    if release:
        data = root / "data"
        qa, images = data / "atm-bench", data / "raw_memory" / "image"
        for folder in (qa / "niah", images, data / "raw_memory" / "email", data / "processed_memory"):
            folder.mkdir(parents=True, exist_ok=True)
        (qa / "atm-bench.json").write_text(json.dumps({"qas": main}))
        (data / "raw_memory" / "email" / "emails.json").write_text(json.dumps(_emails()))
        (data / "processed_memory" / "image_batch_results.json").write_text(json.dumps(photos))
        (data / "processed_memory" / "video_batch_results.json").write_text(json.dumps(videos))
        for item, data_bytes in pixels.items():
            (images / f"{item}.png").write_bytes(data_bytes)
        (images / f"{RAW_BMP}.bmp").write_bytes(bmp())
    else:
        qa, images = root, root / "images"
        (qa / "niah").mkdir(parents=True, exist_ok=True)
        images.mkdir(exist_ok=True)
        local = [{**p, "image_path": f"images/{Path(p['image_path']).stem}.png"} for p in photos]
        local[-1]["image_path"] = f"images/{RAW_BMP}.bmp"
        (qa / "atm-bench.json").write_text(json.dumps(main))
        (root / "emails.json").write_text(json.dumps(_emails()))
        (root / "batch_results.json").write_text(json.dumps(local + videos))
        for item, data_bytes in pixels.items():
            (images / f"{item}.png").write_bytes(data_bytes)
        (images / f"{RAW_BMP}.bmp").write_bytes(bmp())
    (qa / "atm-bench-hard.json").write_text(json.dumps(hard))
    for k, pool in NIAH_POOLS.items():
        (qa / "niah" / f"atm-bench-hard-niah{k}.json").write_text(
            json.dumps([{**q, "niah_evidence_ids": pool} for q in hard]))
    return root
