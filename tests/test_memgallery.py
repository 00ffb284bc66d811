"""Mem-Gallery adapter on a small scenario file in the published layout, and its token F1."""

from __future__ import annotations

import json

import pytest

from aml_ray.datasets.memgallery import MemGalleryFormatError, load_memgallery
from aml_ray.datasets.validate import DatasetFormatError
from aml_ray.scoring.memgallery_f1 import memgallery_f1, memgallery_tokens


def test_rounds_become_messages_with_image_parts(tmp_path):
    from tests.mm_fixtures import write_memgallery

    [s] = load_memgallery(write_memgallery(tmp_path / "mg"))
    assert s.sample_id == "u1" and len(s.sessions) == 2
    first = s.sessions[0].messages
    assert first[0].role == "system" and "cycling" in first[0].content
    parts = first[1].content
    assert [p["type"] for p in parts] == ["text", "image_url", "text"]
    assert parts[0]["text"].startswith("[D1:1]") and parts[2]["text"].startswith("[image IMG1]")
    q2 = s.questions[1]
    assert q2.category == "visual_search" and q2.question_parts[1]["type"] == "image_url"
    assert q2.evidence == ("D1:1", "D1:2")


def test_evidence_must_name_existing_rounds(tmp_path):
    from tests.mm_fixtures import write_memgallery

    root = write_memgallery(tmp_path / "mg")
    f = root / "scenario_001.json"
    d = json.loads(f.read_text())
    d["qa"][0]["evidence"] = ["D9:9"]
    f.write_text(json.dumps(d))
    with pytest.raises(MemGalleryFormatError, match="D9:9"):
        load_memgallery(root)


@pytest.mark.parametrize(("change", "expected"), [
    (lambda d: d["sessions"][1].pop("date"),
     "field 'sessions[1].date': missing; expected an ISO date like '2024-05-01'"),
    (lambda d: d["sessions"][1].update(date="May 8"), "field 'sessions[1].date': date 'May 8' is not an ISO date; "
                                                      "expected a date like '2024-05-01'"),
    (lambda d: d["sessions"][0]["rounds"][1].update(image="img/none.png"),
     "field 'sessions[0].rounds[1].image': image 'img/none.png' not found at "),
    (lambda d: d["qa"][1].pop("question_type"),
     "field 'qa[1].question_type': missing; expected a string or an integer"),
    (lambda d: d.update(sessions={"S1": []}), "field 'sessions': expected a list of sessions {session_id, date, "
                                              "rounds}, got an object"),
])
def test_a_malformed_scenario_names_the_file_scenario_and_field(tmp_path, change, expected):
    from tests.mm_fixtures import write_memgallery

    root = write_memgallery(tmp_path / "mg")
    f = root / "scenario_001.json"
    d = json.loads(f.read_text())
    change(d)
    f.write_text(json.dumps(d))
    with pytest.raises(DatasetFormatError) as exc:
        load_memgallery(root)
    assert str(exc.value).startswith(f"{f}: scenario 'u1': {expected}")
    f.write_text("")
    with pytest.raises(DatasetFormatError, match=r"scenario_001.json: empty file; expected a scenario object"):
        load_memgallery(root)


def test_token_f1_normalisation():
    assert memgallery_tokens("The Brown-Fox and a dog!") == ["brown", "fox", "dog"]
    assert memgallery_f1("Not mentioned.", "not mentioned") == 1.0
    assert memgallery_f1("Yes.", "No.") == 0.0
    assert memgallery_f1("IMG1, IMG2", "IMG1, IMG2") == 1.0
    assert memgallery_f1("bikes", "bike") == 1.0  # Porter stemming
