"""ATM-Bench adapter on a small file set in the published layout, and its QS rules on fixed cases."""

from __future__ import annotations

import asyncio
import json

import pytest

from aml_ray.datasets.atmbench import AtmBenchFormatError, load_atmbench, load_atmbench_hard
from aml_ray.scoring.atmbench_qs import list_recall_score, number_score
from aml_ray.stages.atmbench_scorer import atmbench_qs, parse_accuracy
from aml_ray.datasets.validate import DatasetFormatError
from tests.mm_fixtures import write_atmbench


def test_items_are_added_with_their_id_next_to_their_image(tmp_path):
    [sample] = load_atmbench(write_atmbench(tmp_path / "atm"))
    assert [s.key for s in sample.sessions] == ["2024-03-02", "2024-03-03", "2024-03-04", "2024-03-05"]
    photo = sample.sessions[1].messages[0].content
    assert photo[0] == {"type": "text", "text": "[item IMG_0001]"} and photo[1]["type"] == "image_url"
    assert "Rome" in photo[2]["text"]
    video = sample.sessions[2].messages[1].content
    assert isinstance(video, str) and video.startswith("[item VID_0003]")  # videos: text only
    assert {q.category for q in sample.questions} == {"number", "list_recall", "open_end"}
    assert [q for q in sample.questions if q.category == "list_recall"][0].answer == ["IMG_0001", "IMG_0002"]


def test_hard_subset_is_one_sample_per_question_with_its_haystack(tmp_path):
    root = write_atmbench(tmp_path / "atm")
    [s] = load_atmbench_hard(root)
    assert s.sample_id == "hard-h1" and sum(len(x.messages) for x in s.sessions) == 3
    with pytest.raises(ValueError, match="one of"):
        load_atmbench_hard(root, haystack=30)
    bad = json.loads((root / "atm-bench.json").read_text())
    bad[0]["evidence_ids"] = ["nope"]
    (root / "atm-bench.json").write_text(json.dumps(bad))
    with pytest.raises(AtmBenchFormatError, match="evidence_ids"):
        load_atmbench(root)


@pytest.mark.parametrize(("name", "change", "expected"), [
    ("atm-bench.json", lambda d: d[1].pop("question"), "item 1 (id 'l1'): field 'question': missing; expected a "
                                                       "non-empty string"),
    ("atm-bench.json", lambda d: d[0].update(evidence_ids="email_1"), "item 0 (id 'n1'): field 'evidence_ids': "
                                                                     "expected a list of item ids, got a string"),
    ("emails.json", lambda d: d[1].pop("timestamp"), "item 1 (id 'email_2'): field 'timestamp': missing; expected "
                                                     "an ISO timestamp or Unix time"),
    ("batch_results.json", lambda d: d[0].update(timestamp="last week"),
     "item 0: field 'timestamp': timestamp 'last week' is neither ISO nor Unix time"),
    ("batch_results.json", lambda d: d[1].update(tags={"food": 1}), "item 1: field 'tags': expected a list of tags, "
                                                                    "got an object"),
    ("atm-bench-hard.json", lambda d: d[0].update(niah_evidence_ids=["x"]),
     "item 0 (id 'h1'): field 'niah_evidence_ids': niah_evidence_ids ['x'] are not items"),
])
def test_a_malformed_bundle_file_names_the_file_item_and_field(tmp_path, name, change, expected):
    root = write_atmbench(tmp_path / "atm")
    d = json.loads((root / name).read_text())
    change(d)
    (root / name).write_text(json.dumps(d))
    with pytest.raises(DatasetFormatError) as exc:
        load_atmbench_hard(root) if "hard" in name else load_atmbench(root)
    assert str(exc.value).startswith(f"{root / name}: {expected}")
    (root / name).write_text('{"id": 1}')
    with pytest.raises(DatasetFormatError, match=rf"{name}: top level: expected a JSON array of records, got an obj"):
        load_atmbench_hard(root) if "hard" in name else load_atmbench(root)


@pytest.mark.parametrize("answer,gold,score", [
    ("Three nights.", "3", 1.0), ("$420", "420 dollars", 1.0), ("2 March 2024", "2024-03-02", 1.0),
    ("6:30 pm", "18:30", 1.0), ("Not mentioned.", "unknown", 1.0), ("4", "3", 0.0), ("unknown", "3", 0.0)])
def test_number_rule(answer, gold, score):
    assert number_score(answer, gold) == score


def test_list_recall_is_jaccard_of_ids():
    assert list_recall_score("IMG_0001, IMG_0002", ["IMG_0001", "IMG_0002"]) == 1.0
    assert list_recall_score("IMG_0001 and IMG_0009", ["IMG_0001", "IMG_0002"]) == pytest.approx(1 / 3)


def test_scorer_rows_and_judge_json():
    rows = [{"answer_status": "ok", "search_status": "ok", "judge_status": None, "category": c, "gold": json.dumps(g),
             "answer": a, "question": "q"} for c, g, a in
            [("number", "3", "three"), ("list_recall", ["a1", "b2"], "a1"), ("open_end", "red bike", "a red bike")]]
    asyncio.run(atmbench_qs(rows))
    assert [r["score"] for r in rows] == [1.0, 0.5, 1.0]
    assert all(r["status"] == "scored" for r in rows)
    assert parse_accuracy('{"accuracy": 0.5}') == 0.5 and parse_accuracy('{"accuracy": 2}') is None
