"""Mem-Gallery end to end through Ray: reference system (--multimodal) and a vision answer model on the
local OpenAI-compatible server; images reach the model interleaved in participant order."""

from __future__ import annotations

import hashlib
import json

import pytest
from pydantic import SecretStr

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import ModelEndpoint, model_endpoint_from_env
from aml_ray.run.evaluation import EvaluationConfig, evaluate
from aml_ray.run.evidence import read_questions
from aml_ray.reference.server import ReferenceServer
from tests.fake_openai import FakeOpenAI, Reply
from tests.mm_fixtures import MEMGALLERY_SCENARIOS, png, png_url, write_memgallery, write_memgallery_release
from tests.servers import ThreadServer

pytestmark = pytest.mark.usefixtures("ray_session")
JUDGE = model_endpoint_from_env("judge", {})
FIRST = sorted(MEMGALLERY_SCENARIOS)[0]  # the sample limit_samples=1 keeps


def answer_endpoint(base: str, vision: bool) -> ModelEndpoint:
    return ModelEndpoint(role="answer", base_url=base + "/v1", model="vision-test", api_key=SecretStr("k"),
                         vision=vision)


def test_text_only_answer_model_is_refused_at_start(tmp_path):
    data = write_memgallery(tmp_path / "data" / "dialog")
    cfg = EvaluationConfig(dataset="memgallery", participant=ParticipantSpec(add_url="http://x/add",
                           search_url="http://x/search"), answer=answer_endpoint("http://127.0.0.1:9", False),
                           judge=JUDGE, out_dir=tmp_path / "run", data_path=data)
    with pytest.raises(ValueError, match="text-only.*ANSWER_VISION=1"):
        evaluate(cfg)
    assert not (tmp_path / "run" / "run.json").exists()


def test_memgallery_images_reach_the_answer_model_in_order(tmp_path):
    data = write_memgallery_release(tmp_path / "memgallery")  # the release: dialog/ (20 files) and image/
    fake = FakeOpenAI(lambda prompt, n: Reply("Red" if "colour" in prompt else "D1:IMG_001, D1:IMG_003"))
    with ReferenceServer(tmp_path / "ref", multimodal=True) as ref, ThreadServer(fake.app) as model:
        spec = ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url)
        result = evaluate(EvaluationConfig(dataset="memgallery", participant=spec, judge=JUDGE,
                                           answer=answer_endpoint(model.base_url, True), out_dir=tmp_path / "run",
                                           data_path=data, top_k=10, limit_samples=1))
    q = read_questions(result.run_dir).sort("question_id")  # F1 1.0 each: exact answers
    assert q["status"].to_list() == ["scored", "scored"]
    assert q["score"].to_list() == [1.0, 1.0]
    # evidence: images by hash, never inline; question image stored; each distinct image once
    colours = {"red": (255, 0, 0), "blue": (0, 0, 255), "yellow": (255, 255, 0), "green": (0, 255, 0)}
    sha = {name: hashlib.sha256(png(rgb)).hexdigest() for name, rgb in colours.items()}
    media = sorted(p.name for p in (result.run_dir.root / "media").iterdir())
    assert media == sorted(f"{h}.png" for h in sha.values())
    for row in q.to_dicts():
        assert "base64" not in json.dumps(row, default=str)
    mems = q.filter(q["question_id"] == f"{FIRST}:q0000")["memories"].to_list()[0]
    with_parts = [m for m in mems if m["parts"]]
    assert with_parts and all(p["media"].startswith("media:") for m in with_parts for p in m["parts"]
                              if p["type"] == "image")
    assert q.filter(q["question_id"] == f"{FIRST}:q0001")["question_parts"].to_list()[0][1]["type"] == "image"
    # the answer model received OpenAI-style parts: text and images interleaved in participant order
    url_of = {f"media:{sha[name]}": png_url(rgb) for name, rgb in colours.items()}
    for content in fake.contents:
        assert isinstance(content, list)
        kinds = [p["type"] for p in content]
        assert "image_url" in kinds and "text" in kinds
    by_q = {("colour" in "".join(p.get("text", "") for p in c)): c for c in fake.contents}
    urls = [p["image_url"]["url"] for p in by_q[True] if p["type"] == "image_url"]
    expected = [url_of[p["media"]] for m in with_parts for p in m["parts"] if p["type"] == "image"]
    assert urls == expected and len(expected) == 3  # red and blue (round D1:1), yellow (D1:2)
    q2_urls = [p["image_url"]["url"] for p in by_q[False] if p["type"] == "image_url"]
    assert q2_urls[-1] == url_of[f"media:{sha['green']}"]  # the question image comes last, where the question is
    info = result.run_info
    assert info["models"]["answer"]["vision"] is True and info["media"]["image_tokens"] == "openai_tiles"
