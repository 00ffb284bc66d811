"""Tiny generated images and small files in the Mem-Gallery / ATM-Bench layouts (no dataset is copied)."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from pathlib import Path


def png(rgb: tuple[int, int, int] = (255, 0, 0), size: int = 1) -> bytes:
    """A valid size x size PNG of one colour, built with zlib/struct."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    raw = b"".join(b"\x00" + bytes(rgb) * size for _ in range(size))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def png_url(rgb: tuple[int, int, int] = (255, 0, 0)) -> str:
    return "data:image/png;base64," + base64.b64encode(png(rgb)).decode()


def write_memgallery(root: Path) -> Path:
    """One scenario file with two images (red, blue) and a question image (green)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "img").mkdir(exist_ok=True)
    (root / "img" / "red.png").write_bytes(png((255, 0, 0)))
    (root / "img" / "blue.png").write_bytes(png((0, 0, 255)))
    (root / "img" / "green.png").write_bytes(png((0, 255, 0)))
    scenario = {
        "scenario_id": "u1",
        "user_profile": {"name": "Ada", "hobby": "cycling"},
        "sessions": [
            {"session_id": "S1", "date": "2024-05-01", "rounds": [
                {"round_id": "D1:1", "user": "Look at my new bicycle", "assistant": "A red bicycle, nice!",
                 "image": "img/red.png", "image_id": "IMG1", "image_caption": "a red bicycle bicycle"},
                {"round_id": "D1:2", "user": "I also bought a blue helmet bicycle", "assistant": "Great.",
                 "image": "img/blue.png", "image_id": "IMG2", "image_caption": "a blue helmet"}]},
            {"session_id": "S2", "date": "2024-05-08T10:00:00", "rounds": [
                {"round_id": "D2:1", "user": "My sister lives in Oslo", "assistant": "Noted."}]}],
        "qa": [
            {"question_id": "q1", "question": "What colour is my bicycle?", "question_type": "visual_detail",
             "answer": "Red", "evidence": ["D1:1"]},
            {"question_id": "q2", "question": "Which images show bicycle gear?", "question_type": "visual_search",
             "answer": "IMG1, IMG2", "evidence": ["D1:1", "D1:2"], "question_image": "img/green.png"},
        ],
    }
    (root / "scenario_001.json").write_text(json.dumps(scenario))
    return root


def write_atmbench(root: Path) -> Path:
    """Two emails, two photos, QA of each qtype, and a Hard file with NIAH ids."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "images").mkdir(exist_ok=True)
    (root / "images" / "IMG_0001.png").write_bytes(png((10, 20, 30)))
    (root / "images" / "IMG_0002.png").write_bytes(png((40, 50, 60)))
    (root / "emails.json").write_text(json.dumps([
        {"id": "email_1", "timestamp": "2024-03-02T09:00:00", "short_summary": "Hotel booking in Rome",
         "detail": "Your booking for 3 nights costs $420."},
        {"id": "email_2", "timestamp": "2024-03-05T12:00:00", "short_summary": "Gym receipt", "detail": "Paid 30 EUR."}]))
    (root / "batch_results.json").write_text(json.dumps([
        {"image_path": "images/IMG_0001.png", "timestamp": "2024-03-03 18:30:00", "location_name": "Rome",
         "short_caption": "Colosseum", "caption": "The Colosseum at sunset", "ocr_text": "", "tags": ["travel"]},
        {"image_path": "images/IMG_0002.png", "timestamp": "2024-03-04 08:00:00", "location_name": "Rome",
         "short_caption": "Breakfast", "caption": "Cappuccino and cornetto", "ocr_text": "CAFFE", "tags": ["food"]},
        {"video_path": "videos/VID_0003.mp4", "timestamp": "2024-03-04 09:00:00", "location_name": "Rome",
         "short_caption": "Street", "caption": "A busy street", "ocr_text": "", "tags": []}]))
    (root / "atm-bench.json").write_text(json.dumps([
        {"id": "n1", "question": "How many nights did I book in Rome?", "answer": "three", "evidence_ids": ["email_1"],
         "qtype": "number"},
        {"id": "l1", "question": "Which photos did I take in Rome?", "answer": ["IMG_0001", "IMG_0002"],
         "evidence_ids": ["IMG_0001", "IMG_0002"], "qtype": "list_recall"},
        {"id": "o1", "question": "What did I have for breakfast in Rome?", "answer": "Cappuccino and cornetto",
         "evidence_ids": ["IMG_0002"], "qtype": "open_end"}]))
    (root / "atm-bench-hard.json").write_text(json.dumps([
        {"id": "h1", "question": "How much was the gym?", "answer": "30 euros", "evidence_ids": ["email_2"],
         "niah_evidence_ids": ["email_1", "IMG_0001"], "qtype": "number"}]))
    return root
