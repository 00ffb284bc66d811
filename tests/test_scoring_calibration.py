"""Calibration sets: the shipped example loads; a bad file is refused naming its line and field."""

from __future__ import annotations

import json

import pytest

from aml_ray.scoring.calibration import EXAMPLE, CalibrationError, load_calibration


def test_the_example_set_loads():
    items = load_calibration(EXAMPLE)
    assert len(items) == 12 and len({i.id for i in items}) == 12
    assert {i.human_verdict for i in items} == {"CORRECT", "WRONG"}
    multi = next(i for i in items if i.id == "cal-08")
    assert multi.gold == ("clarinet", "violin")
    row = multi.as_row()
    assert json.loads(row["gold"]) == ["clarinet", "violin"] and row["answer_status"] == "ok"


@pytest.mark.parametrize("line, message", [
    ('{"question": "Q", "gold": "g", "answer": "a"}', "line 2: field 'human_verdict': Field required"),
    ('{"question": "Q", "gold": "g", "answer": "a", "human_verdict": "yes"}', "line 2: field 'human_verdict'"),
    ('{"question": "", "gold": "g", "answer": "a", "human_verdict": "WRONG"}', "line 2: field 'question'"),
    ('{"question": "Q", "gold": [], "answer": "a", "human_verdict": "WRONG"}', "line 2: field 'gold'"),
    ('{"question": "Q", "gold": "g", "answer": "a", "human_verdict": "WRONG", "score": 1}', "line 2: field 'score'"),
    ('{"id": "x", "question": "Q", "gold": "g", "answer": "a", "human_verdict": "WRONG"}',
     "line 2: field 'id': 'x' repeats"),
    ("not json", "line 2: not JSON"),
    ("[1, 2]", "line 2: expected a JSON object"),
])
def test_a_bad_line_is_named(tmp_path, line, message):
    path = tmp_path / "cal.jsonl"
    path.write_text('{"id": "x", "question": "Q", "gold": "g", "answer": "a", "human_verdict": "CORRECT"}\n'
                    + line + "\n")
    with pytest.raises(CalibrationError) as info:
        load_calibration(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_a_missing_or_empty_file_is_refused(tmp_path):
    with pytest.raises(CalibrationError, match="not found"):
        load_calibration(tmp_path / "none.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(CalibrationError, match="no calibration item"):
        load_calibration(tmp_path / "empty.jsonl")
