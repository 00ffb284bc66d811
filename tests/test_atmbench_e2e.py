"""ATM-Bench end to end through Ray: a small bundle in the release's layout, the reference system
(--multimodal) and the local OpenAI-compatible server as both a vision answer model and the open_end judge.

Checks that the photos reach the answer model next to their item ids, in the order the participant
returned them, and that QS follows ATM-Bench's public evaluator on fixed cases: ``number`` by its
deterministic match, ``list_recall`` by Jaccard of the ids against the answer string, ``open_end`` by the
judge's binary accuracy (a reply without JSON read by upstream's keyword fallback, never re-asked); the
Hard subset runs one sample per question over its NIAH pool.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from pydantic import SecretStr

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import ModelEndpoint
from aml_ray.run.evaluation import EvaluationConfig, evaluate
from aml_ray.run.evidence import read_adds, read_questions
from aml_ray.reference.server import ReferenceServer
from tests.fake_openai import FakeOpenAI, Reply
from tests.mm_fixtures import BREAKFAST, COLOSSEUM, GYM, NIAH_POOLS, OLD_SCAN, png, png_url, write_atmbench
from tests.servers import ThreadServer

pytestmark = pytest.mark.usefixtures("ray_session")

COLOURS = {COLOSSEUM: (10, 20, 30), BREAKFAST: (40, 50, 60), OLD_SCAN: (70, 80, 90)}
PHOTOS = {item: png_url(rgb) for item, rgb in COLOURS.items()}
JUDGE_MARK = "You are an evaluator"  # upstream's LLM_JUDGE_PROMPT


def script(prompt: str, seen: int) -> Reply:
    if JUDGE_MARK in prompt:  # open_end judge: no JSON; upstream's keyword fallback reads "correct" as true
        return Reply("The prediction is correct.")
    if "How many nights" in prompt:
        return Reply("Three nights.")  # gold "3": number words -> 1.0
    if "Which photos" in prompt:
        return Reply(f"{COLOSSEUM} and 20240309_120000")  # gold "<colosseum>, <breakfast>": Jaccard 1/3
    if "breakfast" in prompt:
        return Reply("A cappuccino.")
    if "gym" in prompt:
        return Reply("€30")  # Hard: gold "30 euros"; upstream's rule gives 0 (golden table in test_atmbench)
    return Reply("Not mentioned.")


def endpoint(role: str, base: str, vision: bool) -> ModelEndpoint:
    return ModelEndpoint(role=role, base_url=base + "/v1", model=f"{role}-test", api_key=SecretStr("k"), vision=vision)


def text_of(content) -> str:
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


def question_of(content) -> str:
    return text_of(content).rsplit("Question:", 1)[1]


def item_of(memory: dict) -> str:
    return memory["content"].split("]", 1)[0].removeprefix("[item ").strip()


def test_atmbench_images_reach_the_answer_model_in_order_and_qs_follows_its_rules(tmp_path):
    data = write_atmbench(tmp_path / "atm", release=True)
    fake = FakeOpenAI(script)
    with ReferenceServer(tmp_path / "ref", multimodal=True) as ref, ThreadServer(fake.app) as model:
        spec = ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url)
        main = evaluate(EvaluationConfig(dataset="atmbench", participant=spec, answer=endpoint("answer", model.base_url, True),
                                         judge=endpoint("judge", model.base_url, False), out_dir=tmp_path / "main",
                                         data_path=data, top_k=10))
        hard = evaluate(EvaluationConfig(dataset="atmbench_hard", participant=ParticipantSpec(
                            add_url=ref.add_url, search_url=ref.search_url),
                            answer=endpoint("answer", model.base_url, True), judge=endpoint("judge", model.base_url, False),
                            out_dir=tmp_path / "hard", data_path=data, top_k=10))

    # scores on fixed cases
    q = {r["question_id"]: r for r in read_questions(main.run_dir).to_dicts()}
    assert {k: r["status"] for k, r in q.items()} == {"n1": "scored", "l1": "scored", "o1": "scored"}
    assert q["n1"]["score"] == 1.0 and json.loads(q["n1"]["score_detail"])["rule"] == "number"
    assert q["l1"]["score"] == pytest.approx(1 / 3) and json.loads(q["l1"]["score_detail"])["rule"] == "list_recall"
    assert q["o1"]["score"] == 1.0 and q["o1"]["judge_attempts"] == 1
    assert json.loads(q["o1"]["score_detail"]) == {"rule": "open_end_judge", "parse_fallback": True}
    table = {r["category"]: r for r in main.table.to_dicts()}
    assert table["overall"]["accuracy"] == pytest.approx((1 + 1 / 3 + 1) / 3)
    assert table["overall"]["coverage"] == 1.0
    judge_calls = [c for c in fake.calls if JUDGE_MARK in c]
    assert len(judge_calls) == 1 and "breakfast" in judge_calls[0]  # number/list: no judge; never re-asked
    assert "Ground truth: Cappuccino and cornetto  Prediction: A cappuccino." in judge_calls[0]

    # evidence: each photo stored once by hash, never inline; memories keep their image parts
    media = {p.name for p in (main.run_dir.root / "media").iterdir()}
    assert media <= {f"{hashlib.sha256(png(c)).hexdigest()}.png" for c in COLOURS.values()}
    assert all("base64" not in json.dumps(r, default=str) for r in q.values())

    # the answer model got OpenAI-style parts: each photo right after its "[item id]", in participant order
    answers = [c for c in fake.contents if JUDGE_MARK not in text_of(c)]
    assert len(answers) == 4  # three main questions + one Hard question
    by_question = {next(k for k in ("nights", "photos", "breakfast", "gym") if k in question_of(c)): c for c in answers}
    for key, qid in (("nights", "n1"), ("photos", "l1"), ("breakfast", "o1")):
        content = by_question[key]
        returned = [item_of(m) for m in q[qid]["memories"] if m["parts"]]
        assert returned, f"{qid}: the participant returned no photo"
        urls = [p["image_url"]["url"] for p in content if p["type"] == "image_url"]
        assert urls == [PHOTOS[i] for i in returned]
        for i, part in enumerate(content):
            if part["type"] == "image_url":
                item = next(k for k, v in PHOTOS.items() if v == part["image_url"]["url"])
                assert content[i - 1]["type"] == "text" and content[i - 1]["text"].rstrip().endswith(f"[item {item}]")
    photos_q = [item_of(m) for m in q["l1"]["memories"] if m["parts"]]
    assert {COLOSSEUM, BREAKFAST} <= set(photos_q)

    # Hard: one sample per question; its NIAH pool of the 200 file is all that is Added
    [h] = read_questions(hard.run_dir).to_dicts()
    assert h["question_id"] == "h1" and h["sample_id"] == "hard-h1" and h["status"] == "scored" and h["score"] == 0.0
    assert read_adds(hard.run_dir)["n_messages"].sum() == len(NIAH_POOLS[200]) and hard.run_info["dataset"]["samples"] == 1
    assert f"[item {GYM}]" in text_of(by_question["gym"])
