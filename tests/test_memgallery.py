"""Mem-Gallery adapter on small files in the release's layout, and its token F1 against upstream's values."""

from __future__ import annotations

import json
import logging

import pytest

from aml_ray.datasets.memgallery import load_memgallery
from aml_ray.datasets.validate import DatasetFormatError
from aml_ray.media import MediaLimits
from aml_ray.scoring.memgallery_f1 import memgallery_f1, memgallery_tokens
from tests.mm_fixtures import MEMGALLERY_SCENARIOS, bmp, png, write_memgallery, write_memgallery_release


def texts(message) -> list[str]:
    content = message.content
    return [content] if isinstance(content, str) else [p.get("text") or p["type"] for p in content]


def test_release_rounds_become_messages_with_every_image_of_the_round(tmp_path):
    [s] = load_memgallery(write_memgallery(tmp_path / "data" / "dialog"))
    assert s.sample_id == "scenario_001" and [x.key for x in s.sessions] == ["D1", "D2"]
    d1 = s.sessions[0].messages
    # the profile is not Added (upstream stores rounds only); its name labels the user as upstream's speaker_a
    assert all(m.role in ("user", "assistant") for sess in s.sessions for m in sess.messages)
    assert texts(d1[0]) == ["[D1:1] user (Ada): Look at my new bicycle", "image_url",
                            "[image D1:IMG_001] a red bicycle bicycle", "image_url", "[image D1:IMG_002] a blue helmet"]
    assert texts(d1[1]) == ["[D1:1] assistant: A red bicycle, nice!"]
    assert len(d1) == 4  # round D1:3 has no text: skipped, as upstream
    assert {m.timestamp for m in d1} == {1714521600000}  # 2024-05-01 UTC, the session date
    q0, q1 = s.questions
    assert (q0.question_id, q0.category, q0.answer, q0.evidence) == ("scenario_001:q0000", "VR", "Red", ("D1:1",))
    assert q1.category == "VS" and [p["type"] for p in q1.question_parts] == ["text", "image_url"]
    assert q1.question_parts[0]["text"] == "Which images show bicycle gear?"


def test_the_folder_holding_dialog_loads_every_scenario_by_name(tmp_path):
    root = write_memgallery_release(tmp_path / "memgallery")
    (root / "dialog" / "Baking_results_gpt.json").write_text("[]")  # not a scenario (upstream skips *_results_*)
    samples = load_memgallery(root)
    assert [s.sample_id for s in samples] == sorted(MEMGALLERY_SCENARIOS) and len(samples) == 20
    assert load_memgallery(root / "dialog" / "Baking_Dessert_Daily_Life_Skill.json")[0].sample_id == \
        "Baking_Dessert_Daily_Life_Skill"


@pytest.mark.parametrize(("change", "expected"), [
    (lambda d: d["multi_session_dialogues"][1].pop("date"),
     "field 'multi_session_dialogues[1].date': missing; expected an ISO date like '2024-06-24'"),
    (lambda d: d["multi_session_dialogues"][1].update(date="May 8"),
     "field 'multi_session_dialogues[1].date': date 'May 8' is not an ISO date; expected a date like '2024-06-24'"),
    (lambda d: d["multi_session_dialogues"][0]["dialogues"][0].pop("round"),
     "field 'multi_session_dialogues[0].dialogues[0].round': missing; expected a round id like 'D1:1'"),
    (lambda d: d["multi_session_dialogues"][0]["dialogues"][0].update(image_caption=["only one"]),
     "field 'multi_session_dialogues[0].dialogues[0].image_caption': has 1 entries for 2 input_image entries"),
    (lambda d: d["multi_session_dialogues"][0]["dialogues"][1].update(input_image=[7]),
     "field 'multi_session_dialogues[0].dialogues[1].input_image[0]': expected a string, got an integer 7"),
    (lambda d: d["human-annotated QAs"][1].pop("point"),
     "field 'human-annotated QAs[1].point': missing; expected the question type (FR, VS, TTL, ...)"),
    (lambda d: d["human-annotated QAs"][0].update(clue="D1:1 D1:2"), None),  # one string = a list of one: loads
    (lambda d: d.update(multi_session_dialogues={"D1": []}),
     "field 'multi_session_dialogues': expected a list of sessions {session_id, date, dialogues}, got an object"),
])
def test_a_malformed_scenario_names_the_file_scenario_and_field(tmp_path, change, expected):
    dialog = write_memgallery(tmp_path / "dialog")
    f = dialog / "scenario_001.json"
    d = json.loads(f.read_text())
    change(d)
    f.write_text(json.dumps(d))
    if expected is None:
        assert load_memgallery(dialog)
        return
    with pytest.raises(DatasetFormatError) as exc:
        load_memgallery(dialog)
    assert str(exc.value).startswith(f"{f}: scenario 'scenario_001': {expected}")
    f.write_text("")
    with pytest.raises(DatasetFormatError, match=r"scenario_001.json: empty file; expected a scenario object"):
        load_memgallery(dialog)


def test_one_bad_image_is_its_rounds_error_and_names_the_file_and_round(tmp_path, caplog, monkeypatch):
    dialog = write_memgallery(tmp_path / "data" / "dialog")
    images = tmp_path / "data" / "image" / "scenario_001"
    (images / "D1_IMG_002.png").write_bytes(bmp())  # a BMP under a .png name
    (images / "D1_IMG_003.png").unlink()  # missing
    (images / "QA_IMG_001.png").write_bytes(png() + bytes(500))  # over the per-image limit set below
    monkeypatch.setattr("aml_ray.datasets.memgallery.media_limits", lambda: MediaLimits(max_image_bytes=200))
    with caplog.at_level(logging.WARNING, logger="aml_ray.datasets.memgallery"):
        [s] = load_memgallery(dialog)  # the bundle loads
    d1 = s.sessions[0].messages
    assert texts(d1[0]) == ["[D1:1] user (Ada): Look at my new bicycle", "image_url",
                            "[image D1:IMG_001] a red bicycle bicycle",
                            "[image D1:IMG_002 not available: a BMP image; allowed: png, jpeg, webp, gif] a blue helmet"]
    assert texts(d1[2])[1].startswith("[image D1:IMG_003 not available: the file cannot be read")
    q = s.questions[1]
    assert q.question_parts is None and q.excluded_reason.startswith(
        "media: question 1: ../image/scenario_001/QA_IMG_001.png: image is ") and "per-image limit of 200" in \
        q.excluded_reason
    warnings = [r.getMessage() for r in caplog.records]
    assert any(str(dialog / "scenario_001.json") in w and "round D1:1" in w and str(images / "D1_IMG_002.png") in w
               for w in warnings)
    assert any("round D1:2" in w and "D1_IMG_003.png" in w for w in warnings)
    assert any("question 1" in w and "QA_IMG_001.png" in w and "excluded" in w for w in warnings)


#: Golden values: ``f1_score(prediction, gold)`` of Mem-Gallery's evaluator
#: (benchmark/memengine/evaluate/evaluation.py @ 09d49b578bb1d32ac473776311e14b3d8d53faf0), computed once by
#: running that function on these inputs.
MEMGALLERY_F1_GOLDEN = [
    ("D8:IMG_009, D8:IMG_010", "D8:IMG_009, D8:IMG_010", 1.0),
    ("D8:IMG_010", "D8:IMG_009", 0.5),  # IMG_010 is one token: only "d8" is shared
    ("D8:IMG_009", "D8:IMG_009, D8:IMG_010", 0.6666666666666666),
    ("IMG_001", "IMG_001", 1.0),
    ("8.5", "8.6", 0.0),  # a decimal is one token
    ("8.5 cm", "8.5", 0.6666666666666666),
    ("", "", 0.0),  # no shared token: 0, even for two empty texts
    ("Not mentioned.", "Not mentioned.", 1.0),
    ("The answer is 2024-09-29", "2024-09-29", 0.7499999999999999),
    ('A "flower road."', 'A "flower road."', 1.0),
    ("Foxglove and mallow", "Foxglove and mallow.", 1.0),
    ("The top buds stay yellow", "The top buds staying yellow while the open flowers turn pink, and foxgloves "
                                 "blooming from the bottom upward.", 0.4444444444444445),
    ("Karl", "Karl.", 1.0),
    ("the-fox", "fox", 1.0),  # the article goes before punctuation does
    ("3.14 litres", "3 14 litres", 0.4),
]


@pytest.mark.parametrize(("prediction", "gold", "expected"), MEMGALLERY_F1_GOLDEN)
def test_token_f1_gives_mem_gallery_evaluator_values(prediction, gold, expected):
    assert memgallery_f1(prediction, gold) == pytest.approx(expected, abs=1e-12)


def test_token_f1_keeps_ids_and_decimals_whole():
    assert memgallery_tokens("D1:IMG_001 weighs 8.5 kg") == ["d1", "img_001", "weigh", "8.5", "kg"]
    mean = sum(memgallery_f1(p, g) for p, g, _ in MEMGALLERY_F1_GOLDEN) / len(MEMGALLERY_F1_GOLDEN)
    assert mean == pytest.approx(sum(e for *_, e in MEMGALLERY_F1_GOLDEN) / len(MEMGALLERY_F1_GOLDEN))
