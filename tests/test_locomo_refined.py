"""LoCoMo-Refined adapter on a small file built here in the documented layout (MANIFEST.md 3.2): the real
file is not available on this machine."""

from __future__ import annotations

import json

import pytest

from aml_ray.datasets.fetch import DatasetHashMismatch
from aml_ray.datasets.locomo import parse_locomo
from aml_ray.datasets.locomo_refined import CATEGORY_NAMES, load_locomo_refined, parse_locomo_refined
from aml_ray.datasets.registry import get_dataset
from aml_ray.prompts import load_prompt
from aml_ray.scoring import locomo_f1
from aml_ray.suite import DatasetCountMismatch, load_suite, resolve_bundle_path, verify_loaded_bundle
from aml_ray.datasets.validate import DatasetFormatError


def refined_layout() -> list[dict]:
    """Two conversations in the LoCoMo layout with LoCoMo-Refined's qa items."""
    conv = {
        "speaker_a": "Caroline", "speaker_b": "Melanie",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Caroline", "dia_id": "D1:1", "text": "I went to a LGBTQ support group yesterday."},
            {"speaker": "Melanie", "dia_id": "D1:2", "text": "That is great!", "blip_caption": "a rainbow flag",
             "img_url": ["https://example.invalid/x.jpg"]},
        ],
        "session_2_date_time": "10:00 am on 20 May, 2023",
        "session_2": [{"speaker": "Melanie", "dia_id": "D2:1", "text": "I ran a charity race on Saturday."}],
        "session_10_date_time": "9:00 am on 1 June, 2023",
        "session_10": [{"speaker": "Caroline", "dia_id": "D10:1", "text": "I have 3 kids."}],
    }
    qa = [
        {"question": "When did Caroline go to the support group?", "answer": ["7 May 2023", "May 7, 2023"],
         "evidence": ["D1:1"], "category": "2", "is_multi_modality": False},
        {"question": "How many kids does Caroline have?", "answer": [3], "evidence": ["D10:1"],
         "category": "4", "is_multi_modality": False},
        {"question": "What did Melanie do?", "answer": ["ran a charity race", "a charity race"],
         "evidence": ["D2:1; D1:2"], "category": "1", "is_multi_modality": True},
        {"question": "Would Melanie support LGBTQ people?", "answer": ["Likely yes"], "evidence": [],
         "category": "3", "is_multi_modality": False},
    ]
    second = {"speaker_a": "Jon", "speaker_b": "Gina", "session_1_date_time": "4:04 pm on 20 January, 2023",
              "session_1": [{"speaker": "Jon", "dia_id": "D1:1", "text": "I lost my job."}]}
    return [{"sample_id": "conv-26", "conversation": conv, "qa": qa},
            {"sample_id": "conv-30", "conversation": second,
             "qa": [{"question": "What did Jon lose?", "answer": ["his job"], "evidence": ["D1:1"], "category": "4",
                     "is_multi_modality": False}]}]


@pytest.fixture
def refined_file(tmp_path):
    path = tmp_path / "locomo_refined" / "locomo_refined.json"
    path.parent.mkdir()
    path.write_text(json.dumps(refined_layout()), encoding="utf-8")
    return path


def test_loads_the_layout_with_lists_of_answers_and_string_categories(refined_file):
    samples = load_locomo_refined(refined_file)
    assert [s.sample_id for s in samples] == ["conv-26", "conv-30"]
    q = samples[0].questions
    assert [x.question_id for x in q] == [f"conv-26:q{i:04d}" for i in range(4)]
    assert q[0].answer == ["7 May 2023", "May 7, 2023"] and q[1].answer == ["3"]
    assert [x.category for x in q] == ["2", "4", "1", "3"]
    assert q[2].evidence == ("D2:1", "D1:2")
    assert all(x.excluded_reason is None for s in samples for x in s.questions)


def test_conversation_is_read_exactly_as_locomo_reads_it(refined_file):
    raw = refined_layout()
    refined = load_locomo_refined(refined_file)
    for item in raw:  # the LoCoMo adapter on the same conversation (its qa stripped) gives the same sessions
        item["qa"] = []
    assert [s.sessions for s in parse_locomo(raw)] == [s.sessions for s in refined]
    sessions = refined[0].sessions
    assert [s.key for s in sessions] == ["session_1", "session_2", "session_10"]
    assert sessions[0].messages[1].content == "Melanie: That is great! [shares an image: a rainbow flag]"
    assert sessions[0].messages[0].role == "user" and sessions[0].messages[1].role == "assistant"


@pytest.mark.parametrize(("patch", "needle"), [
    ({"category": "5"}, "category '5' is not one of"),
    ({"category": 6}, "category 6"),
    ({"answer": "7 May 2023"}, "'qa[1].answer': expected a non-empty list of acceptable answers, got a string"),
    ({"answer": []}, "'qa[1].answer': expected a non-empty list of acceptable answers, got an empty list"),
    ({"answer": [""]}, "'qa[1].answer[0]': expected a non-empty string or number, got a string ''"),
    ({"answer": [None]}, "'qa[1].answer[0]': expected a non-empty string or number, got null"),
])
def test_refuses_items_outside_the_refined_layout(patch, needle):
    data = refined_layout()
    data[0]["qa"][1].update(patch)
    with pytest.raises(DatasetFormatError) as exc:
        parse_locomo_refined(data)
    assert needle in str(exc.value) and "item 0 (sample_id 'conv-26')" in str(exc.value)


def test_a_malformed_file_is_named_with_the_item_and_field(tmp_path):
    data = refined_layout()
    del data[1]["qa"][0]["question"]
    f = tmp_path / "locomo_refined.json"
    f.write_text(json.dumps(data))
    with pytest.raises(DatasetFormatError) as exc:
        load_locomo_refined(f)
    assert str(exc.value) == (f"{f}: item 1 (sample_id 'conv-30'): field 'qa[0].question': missing; "
                              "expected a non-empty string")
    f.write_text("")
    with pytest.raises(DatasetFormatError, match=r"locomo_refined.json: empty file; expected a JSON list"):
        load_locomo_refined(f)


def test_int_category_is_accepted_as_text():
    data = refined_layout()
    data[0]["qa"][0]["category"] = 2
    assert parse_locomo_refined(data)[0].questions[0].category == "2"


def test_malformed_session_date_names_the_key():
    data = refined_layout()
    data[0]["conversation"]["session_2_date_time"] = "someday"
    with pytest.raises(ValueError, match="session_2_date_time='someday'"):
        parse_locomo_refined(data)


def test_any_acceptable_answer_scores_for_f1_and_the_judge_sees_them_all():
    assert locomo_f1("May 7, 2023", ["7 May 2023", "May 7, 2023"], "2") == 1.0
    text = load_prompt("locomo_refined_judge").render(question="When?", gold="7 May 2023 | May 7, 2023",
                                                      answer="on 7 May")
    assert "7 May 2023 | May 7, 2023" in text and '{"label": "CORRECT"}' in text


def test_the_layout_file_is_refused_by_hash_and_counts_unless_allowed(refined_file):
    with pytest.raises(DatasetHashMismatch, match="1aef6da7"):
        resolve_bundle_path("locomo_refined", refined_file)
    assert resolve_bundle_path("locomo_refined", refined_file, allow_hash_mismatch=True) == refined_file
    samples = load_locomo_refined(refined_file)
    # a pinned bundle read from other files: the count check is left to resolve, which refused it
    assert verify_loaded_bundle("locomo_refined", refined_file, samples)["counts_checked"] is False
    bundle = load_suite().bundle("locomo_refined")
    assert bundle.expected.total == 1382 and bundle.expected.by_category == {"1": 213, "2": 299, "3": 68, "4": 802}
    from aml_ray.suite import check_counts

    with pytest.raises(DatasetCountMismatch, match="category '1': 1 != 213"):
        check_counts(bundle, samples, refined_file)


def test_registry_declaration():
    spec = get_dataset("locomo_refined")
    assert spec.f1_rule == "locomo" and spec.judge_prompt == "locomo_refined_judge"
    assert spec.category_names == CATEGORY_NAMES and "5" not in CATEGORY_NAMES
