"""ATM-Bench adapter on small files in the release's layout (and flat), and its QS rules against upstream's values."""

from __future__ import annotations

import asyncio
import json
import logging
from types import SimpleNamespace

import pytest

from aml_ray.datasets.atmbench import load_atmbench, load_atmbench_hard
from aml_ray.datasets.validate import DatasetFormatError
from aml_ray.prompts import load_prompt
from aml_ray.scoring.atmbench_qs import judge_accuracy, list_recall_score, number_score
from aml_ray.stages.atmbench_scorer import JUDGE_MAX_TOKENS, atmbench_qs
from tests.mm_fixtures import (BREAKFAST, COLOSSEUM, GYM, HOTEL, NIAH_POOLS, OLD_SCAN, RAW_BMP, STREET,
                               write_atmbench)


def item_ids(sample) -> list[str]:
    def first(m):
        return m.content if isinstance(m.content, str) else m.content[0]["text"]
    return [first(m).split("]", 1)[0].removeprefix("[item ") for s in sample.sessions for m in s.messages]


@pytest.mark.parametrize("release", [True, False], ids=["release", "flat"])
def test_items_are_added_by_day_with_their_id_next_to_their_image(tmp_path, release, caplog):
    root = write_atmbench(tmp_path / "atm", release=release)
    with caplog.at_level(logging.WARNING, logger="aml_ray.datasets.atmbench"):
        [sample] = load_atmbench(root)
    assert [s.key for s in sample.sessions] == ["2024-03-02", "2024-03-03", "2024-03-04", "2024-03-05", "2024-03-06",
                                                "undated"]
    assert item_ids(sample) == [HOTEL, COLOSSEUM, BREAKFAST, STREET, GYM, RAW_BMP, OLD_SCAN]
    photo = sample.sessions[1].messages[0].content  # found by its stem, whatever its image_path says
    assert photo[0] == {"type": "text", "text": f"[item {COLOSSEUM}]"} and photo[1]["type"] == "image_url"
    assert photo[2]["text"].splitlines() == ["Type: image", "Timestamp: 2024-03-03 18:30:00", "Location: Rome",
                                             "Short Caption: Colosseum", "Caption: The Colosseum at sunset",
                                             "Tags: travel"]
    video = sample.sessions[2].messages[1].content
    assert isinstance(video, str) and video.startswith(f"[item {STREET}]\nType: video")  # videos: text only
    undated = sample.sessions[-1].messages[0]  # no EXIF: timestamp null, Added undated with its image
    assert undated.timestamp is None and undated.content[1]["type"] == "image_url"
    bad = sample.sessions[4].messages[0].content  # a BMP: that item's error, Added as its text
    assert bad.startswith(f"[item {RAW_BMP}] [image not available: a BMP image; allowed: png, jpeg, webp, gif]")
    assert any(RAW_BMP in r.getMessage() and f"{RAW_BMP}.bmp" in r.getMessage() for r in caplog.records)
    q = {x.question_id: x for x in sample.questions}
    assert {x.category for x in q.values()} == {"number", "list_recall", "open_end"}
    assert q["l1"].answer == f"{COLOSSEUM}, {BREAKFAST}"  # the gold is the answer string


def test_hard_runs_each_question_over_its_niah_pool_not_as_an_oracle(tmp_path):
    root = write_atmbench(tmp_path / "atm", release=True)
    [h] = load_atmbench_hard(root)  # default: the 200 pool
    assert h.sample_id == "hard-h1" and sorted(item_ids(h)) == sorted(NIAH_POOLS[200])
    [h25] = load_atmbench_hard(root, haystack=25)
    assert sorted(item_ids(h25)) == sorted(NIAH_POOLS[25]) and GYM in item_ids(h25)
    with pytest.raises(ValueError, match="one of"):
        load_atmbench_hard(root, haystack=30)
    with pytest.raises(FileNotFoundError, match="atm-bench-hard-niah50.json"):
        load_atmbench_hard(root, haystack=50)


@pytest.mark.parametrize(("name", "change", "expected"), [
    ("atm-bench.json", lambda d: d[1].pop("question"),
     "item 1 (id 'l1'): field 'question': missing; expected a non-empty string"),
    ("atm-bench.json", lambda d: d[0].update(evidence_ids="x"),
     "item 0 (id 'n1'): field 'evidence_ids': expected a list of item ids, got a string"),
    ("atm-bench.json", lambda d: d[2].update(qtype="essay"),
     "item 2 (id 'o1'): field 'qtype': qtype 'essay' is not one of ('number', 'list_recall', 'open_end')"),
    ("atm-bench.json", lambda d: d[2].pop("qtype"), "item 2 (id 'o1'): field 'qtype': missing; expected one of"),
    ("emails.json", lambda d: d[1].update(timestamp="last week"),
     f"item 1 (id '{GYM}'): field 'timestamp': timestamp 'last week' is neither ISO nor Unix time"),
    ("batch_results.json", lambda d: d[1].update(tags={"food": 1}),
     "item 1 (image_path 'images/20240304_080000.png'): field 'tags': expected a list of tags, got an object"),
    ("batch_results.json", lambda d: d[0].pop("image_path"),
     "item 0: field 'image_path': missing; expected image_path or video_path"),
    ("niah/atm-bench-hard-niah200.json", lambda d: d[0]["niah_evidence_ids"].append("x"),
     "item 0 (id 'h1'): field 'niah_evidence_ids[6]': id 'x' names no memory item"),
    ("niah/atm-bench-hard-niah200.json", lambda d: d[0].update(id="h2"),
     None),  # h1 has no pool: refused, never run as an oracle (message checked below)
])
def test_a_malformed_bundle_file_names_the_file_item_and_field(tmp_path, name, change, expected):
    root = write_atmbench(tmp_path / "atm")
    d = json.loads((root / name).read_text())
    change(d)
    (root / name).write_text(json.dumps(d))
    load = load_atmbench_hard if "niah" in name else load_atmbench
    with pytest.raises(DatasetFormatError) as exc:
        load(root)
    if expected is None:
        assert str(exc.value).startswith(f"{root / 'atm-bench-hard.json'}: item 0 (id 'h1'): has no pool in "
                                         "atm-bench-hard-niah200.json")
        return
    assert str(exc.value).startswith(f"{root / name}: {expected}")
    (root / name).write_text('{"id": 1}')
    with pytest.raises(DatasetFormatError, match=rf"{name}: (top level|field 'qas')"):
        load(root)


def test_a_qa_file_may_be_a_qas_object_and_evidence_ids_are_audit_only(tmp_path, caplog):
    root = write_atmbench(tmp_path / "atm", release=True)
    qa = root / "data" / "atm-bench" / "atm-bench.json"
    d = json.loads(qa.read_text())
    assert list(d) == ["qas"]
    d["qas"][0]["evidence_ids"] = ["email999"]
    qa.write_text(json.dumps(d))
    with caplog.at_level(logging.WARNING, logger="aml_ray.datasets.atmbench"):
        [s] = load_atmbench(root)
    assert s.questions[0].evidence == ("email999",) and "email999" in caplog.text


#: Golden values of ATM-Bench's public evaluator (memqa/utils/evaluator/evaluate_qa.py with normalizer.py @
#: c24d06ca11cf7f83d2d0f11c04f7795bb33d1a01), computed once by running ``_deterministic_accuracy_core(gold,
#: answer, question)`` on these inputs: (gold, answer, question, credit).
NUMBER_GOLDEN = [
    ("3", "Three nights.", "", 1.0),
    ("3", "3 nights", "", 1.0),
    ("€62.8", "€62.80", "", 1.0),
    ("€30", "30 euros", "", 1.0),
    ("30 euros", "€30", "", 0.0),
    ("$1,250", "1250 dollars", "", 0.0),
    ("£12.50", "$12.50", "", 0.0),
    ("£12.50", "12.50", "", 0.0),
    ("2024-05-01", "May 1st, 2024", "", 1.0),
    ("2024-05-01", "May 1", "", 1.0),
    ("2024-05-01", "2023-05-01", "", 0.0),
    ("15:05", "15:05", "", 1.0),
    ("15:05", "3:05 pm", "", 0.0),
    ("9am to 11am", "from 9 to 11 am", "", 0.0),
    ("Unknown", "Not available", "", 1.0),
    ("Unknown", "5", "", 0.0),
    ("5", "No information", "", 0.0),
    ("AB12CD", "Your code is ab12cd", "", 1.0),
    ("AB12CD", "AB12CE", "", 0.0),
    ("Yes", "yes", "", 1.0),
    ("No", "Yes", "", 0.0),
    ("Tomorrow", "March 2", "What is due on 2024-03-01?", 1.0),
    ("12 Oxford Street", "Oxford Street", "", 0.0),
    ("2024", "2023", "", 0.0),
    ("2", "two", "", 1.0),
    ("4", "5", "", 0.0),
    ("Rome and Paris", "Paris, Rome", "", 1.0),
    ("1,500 steps", "1500", "", 1.0),
]
#: ``_list_jaccard_core(gold, answer)`` on these inputs, same source: (gold, answer, credit).
LIST_GOLDEN = [
    ("20220430_132212, 20220502_172850", "20220502_172850 and 20220430_132212", 1.0),
    ("email202401010001, 20220502_172850", "EMAIL202401010001 and 20220430_132212", 0.3333333333333333),
    ("20220430_132212", "The photo is 20220430_132212.jpg", 1.0),
    ("20220430_132212.jpg", "20220430_132212", 0.0),
    ("IMG_0001, IMG_0002", "img_0001 and IMG_0009", 0.3333333333333333),
    ("", "", 1.0),
    ("", "20220430_132212", 0.0),
    ("20220430_132212", "None of them.", 0.0),
]
#: ``parse_judge_response`` then ``str(accuracy).lower() == "true"`` (run_llm_judge), same source:
#: (reply, credit, keyword fallback used).
JUDGE_GOLDEN = [
    ('{"explanation": "Same date.", "accuracy": "true"}', 1.0, False),
    ('{"accuracy": true}', 1.0, False),
    ('{"accuracy": 1}', 0.0, False),
    ('{"accuracy": 0.5}', 0.0, False),
    ('{"explanation": "Wrong city.", "accuracy": "false"}', 0.0, False),
    ("The prediction is incorrect.", 1.0, True),
    ("I cannot tell.", 0.0, True),
    ('```json\n{"accuracy": "TRUE"}\n```', 1.0, False),
]


@pytest.mark.parametrize(("gold", "answer", "question", "expected"), NUMBER_GOLDEN)
def test_number_rule_gives_the_public_evaluators_values(gold, answer, question, expected):
    assert number_score(answer, gold, question) == expected


@pytest.mark.parametrize(("gold", "answer", "expected"), LIST_GOLDEN)
def test_list_recall_gives_the_public_evaluators_values(gold, answer, expected):
    assert list_recall_score(answer, gold) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(("reply", "expected", "fallback"), JUDGE_GOLDEN)
def test_judge_reply_is_read_as_the_public_evaluator_reads_it(reply, expected, fallback):
    assert judge_accuracy(reply) == (expected, fallback)


class Judge:
    """A judge model answering each prompt from a list of replies (None: a failed call)."""

    def __init__(self, replies):
        self.replies, self.calls = list(replies), []

    async def complete_batch(self, batch, *, max_tokens, prompt_sha256):
        self.calls.append((batch, max_tokens))
        out = []
        for _ in batch:
            text = self.replies.pop(0)
            out.append({"status": "error", "text": None, "error": "boom"} if text is None else
                       {"status": "ok", "text": text})
        return out


def row(category, gold, answer, question="q"):
    return {"answer_status": "ok", "search_status": "ok", "judge_status": None, "category": category,
            "gold": json.dumps(gold), "answer": answer, "question": question}


def test_scorer_uses_the_gold_string_and_a_binary_judge():
    rows = [row("number", "3", "three"), row("list_recall", f"{COLOSSEUM}, {BREAKFAST}", f"{COLOSSEUM} only"),
            row("open_end", "red bike", "a red bike"), row("open_end", "Rome", "Paris"),
            row("open_end", "Oslo", "Oslo"), row("open_end", "Bergen", "Bergen")]
    judge = Judge(['{"explanation": "x", "accuracy": "true"}', '{"accuracy": 1}', "It is correct.", None,
                   '{"accuracy": false}'])
    endpoint = SimpleNamespace(offline=False)
    asyncio.run(atmbench_qs(rows, endpoint=endpoint, model=judge, prompt=load_prompt("atmbench_judge"),
                            max_parse_retries=1))
    assert [r["score"] for r in rows] == [1.0, 0.5, 1.0, 0.0, 1.0, 0.0]
    assert [json.loads(r["score_detail"]).get("parse_fallback") for r in rows[2:]] == [False, False, True, False]
    assert rows[5]["judge_attempts"] == 2 and all(r["status"] == "scored" for r in rows)
    prompt, max_tokens = judge.calls[0][0][0][0]["content"], judge.calls[0][1]
    assert max_tokens == JUDGE_MAX_TOKENS == 600
    assert prompt.endswith("Question: q  Ground truth: red bike  Prediction: a red bike")
    assert '"accuracy" field which is "true" or "false"' in prompt  # upstream's LLM_JUDGE_PROMPT wording


def test_scorer_offline_open_end_is_a_labelled_token_f1_stand_in():
    rows = [row("open_end", "red bike", "a red bike"), row("list_recall", ["a1", "b2"], "a1")]
    asyncio.run(atmbench_qs(rows))
    assert [r["score"] for r in rows] == [1.0, 0.5]  # a list gold (not the release's) is joined by ", "
    assert json.loads(rows[0]["score_detail"])["rule"] == "open_end_offline_token_f1"
