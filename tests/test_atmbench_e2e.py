"""ATM-Bench end to end through Ray: a small file set in the published layout, the reference system
(--multimodal) and the local OpenAI-compatible server as both a vision answer model and the open_end judge.

Checks that the photos reach the answer model next to their item ids, in the order the participant
returned them, and that QS follows its rules on fixed cases: ``number`` by normalised match,
``list_recall`` by Jaccard of item ids, ``open_end`` by the judge's JSON accuracy (re-asked once when the
first reply has no JSON); the Hard subset runs one sample per question over its haystack.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from pydantic import SecretStr

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import ModelEndpoint
from aml_ray.evaluation import EvaluationConfig, evaluate
from aml_ray.evidence import read_adds, read_questions
from aml_ray.reference.server import ReferenceServer
from tests.fake_openai import FakeOpenAI, Reply
from tests.mm_fixtures import png, png_url, write_atmbench
from tests.servers import ThreadServer

pytestmark = pytest.mark.usefixtures("ray_session")

PHOTOS = {"IMG_0001": png_url((10, 20, 30)), "IMG_0002": png_url((40, 50, 60))}
JUDGE_MARK = "Reply with JSON only"


def script(prompt: str, seen: int) -> Reply:
    if JUDGE_MARK in prompt:  # open_end judge: no JSON the first time, then a partial credit
        return Reply("I think it is mostly right." if seen == 0 else '```json\n{"accuracy": 0.5}\n```')
    if "How many nights" in prompt:
        return Reply("Three nights.")  # gold "three": number rule, number words -> 1.0
    if "Which photos" in prompt:
        return Reply("IMG_0001 and IMG_0009")  # gold [IMG_0001, IMG_0002]: Jaccard 1/3
    if "breakfast" in prompt:
        return Reply("A cappuccino.")
    if "gym" in prompt:
        return Reply("€30")  # Hard: gold "30 euros" -> 1.0
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
    data = write_atmbench(tmp_path / "atm")
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
    assert q["o1"]["score"] == 0.5 and q["o1"]["judge_attempts"] == 2
    assert json.loads(q["o1"]["score_detail"])["rule"] == "open_end_judge"
    table = {r["category"]: r for r in main.table.to_dicts()}
    assert table["overall"]["accuracy"] == pytest.approx((1 + 1 / 3 + 0.5) / 3)
    assert table["overall"]["coverage"] == 1.0
    judge_calls = [c for c in fake.calls if JUDGE_MARK in c]
    assert len(judge_calls) == 2 and all("breakfast" in c for c in judge_calls)  # number/list: no judge

    # evidence: each photo stored once by hash, never inline; memories keep their image parts
    media = sorted(p.name for p in (main.run_dir.root / "media").iterdir())
    assert media == sorted(f"{hashlib.sha256(png(c)).hexdigest()}.png" for c in ((10, 20, 30), (40, 50, 60)))
    assert all("base64" not in json.dumps(r, default=str) for r in q.values())

    # the answer model got OpenAI-style parts: each photo right after its "[item id]", in participant order
    answers = [c for c in fake.contents if JUDGE_MARK not in text_of(c)]
    assert len(answers) == 4  # three main questions + one Hard question
    by_question = {next(k for k in ("nights", "photos", "breakfast", "gym") if k in question_of(c)): c for c in answers}
    for key, qid in (("nights", "n1"), ("photos", "l1"), ("breakfast", "o1")):
        content = by_question[key]
        assert isinstance(content, list)
        returned = [item_of(m) for m in q[qid]["memories"] if m["parts"]]
        assert returned, f"{qid}: the participant returned no photo"
        urls = [p["image_url"]["url"] for p in content if p["type"] == "image_url"]
        assert urls == [PHOTOS[i] for i in returned]
        for i, part in enumerate(content):
            if part["type"] == "image_url":
                item = next(k for k, v in PHOTOS.items() if v == part["image_url"]["url"])
                assert content[i - 1]["type"] == "text" and content[i - 1]["text"].rstrip().endswith(f"[item {item}]")
    photos_q = [item_of(m) for m in q["l1"]["memories"] if m["parts"]]
    assert sorted(photos_q) == ["IMG_0001", "IMG_0002"]

    # Hard: one sample per question; its haystack (email_2 + email_1 + IMG_0001) is all that is Added
    [h] = read_questions(hard.run_dir).to_dicts()
    assert h["question_id"] == "h1" and h["sample_id"] == "hard-h1" and h["status"] == "scored" and h["score"] == 1.0
    assert read_adds(hard.run_dir)["n_messages"].sum() == 3 and hard.run_info["dataset"]["samples"] == 1
    assert "[item email_2]" in text_of(by_question["gym"])
