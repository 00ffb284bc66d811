"""BEAM rubric judge: fixed cases on the real openai SDK path (tests/fake_openai.py), Kendall tau-b, ordering."""

from __future__ import annotations

import doctest
import json
import math

import polars as pl
import pytest
from pydantic import SecretStr

from aml_ray.actors.model import ModelClient
from aml_ray.config import ModelEndpoint, model_endpoint_from_env
from aml_ray.prompts import load_prompt
from aml_ray.retry import RetryPolicy
from aml_ray.scoring.aggregate import aggregate
from aml_ray.stages import rubric
from aml_ray.stages.rubric import (
    RubricParseError,
    kendall_tau_b,
    ordering_score,
    parse_alignment,
    parse_rubric_score,
    rubric_rows,
)
from aml_ray.stages.scorers import get_scorer
from tests.fake_openai import FakeOpenAI, Reply
from tests.servers import ThreadServer

FAST = RetryPolicy(max_attempts=2, backoff_base_s=0.01, backoff_max_s=0.05)
PROMPT = load_prompt("beam_rubric_judge")
HALF_CREDIT = load_prompt("beam_rubric_judge_half_credit")
OFFLINE = model_endpoint_from_env("judge", {})


@pytest.fixture
def fake():
    server = FakeOpenAI()
    with ThreadServer(server.app) as http:
        server.base_url = f"{http.base_url}/v1"
        yield server


def judge(fake) -> ModelEndpoint:
    return ModelEndpoint(role="judge", base_url=fake.base_url, api_key=SecretStr("sk-test"), model="judge-model")


def row(rubric_items, answer="Sprint 1 ends on March 29.", category="information_extraction", **kw) -> dict:
    r = {"question_id": "conv-1:x:q0", "question": "When does my first sprint end?", "category": category,
         "rubric": list(rubric_items), "gold": json.dumps("My first sprint ends on March 29."), "answer": answer,
         "search_status": "ok", "answer_status": "ok", "judge_status": None, "verdict": None, "score": None,
         "score_detail": None, "f1": None, "bleu1": None, "excluded": False, "dataset": "beam"}
    r.update(kw)
    return r


def criterion(prompt: str) -> str:
    return prompt.split("RUBRIC CRITERION (what to check): ")[1].split("\n")[0]


ITEM_REPLIES = {
    "full": '{"score": 1.0, "reason": "stated"}',
    "half": "The date is there but the year is wrong.\n```json\n{\"score\": 0.5, \"reason\": \"partly\"}\n```",
    "none": "{'score': 0, 'reason': 'missing'}",
    "prose": "The response mostly meets the criterion, I would say.",
}


async def run(fake, rows, prompt=PROMPT, **kw):
    client = ModelClient(judge(fake), FAST)
    try:
        await rubric_rows(rows, endpoint=judge(fake), model=client, prompt=prompt, **kw)
    finally:
        await client.aclose()


def test_docstring_examples():
    result = doctest.testmod(rubric)
    assert result.failed == 0 and result.attempted >= 9


async def test_three_items_scored_one_half_zero_give_upstreams_int_mean(fake):
    fake.script = lambda p, n: Reply(ITEM_REPLIES[criterion(p)])
    rows = [row(["full", "half", "none"])]
    await run(fake, rows)
    r = rows[0]
    assert r["score"] == pytest.approx(1 / 3) and r["status"] == "scored" and r["verdict"] == "WRONG"
    detail = json.loads(r["score_detail"])
    assert [it["score"] for it in detail["items"]] == [1.0, 0.5, 0.0]  # what the judge said
    assert [it["credit"] for it in detail["items"]] == [1.0, 0.0, 0.0]  # int(), as upstream
    assert detail["credit_rule"] == "upstream_int" and detail["run_scores"] == [pytest.approx(1 / 3)]
    assert r["judge_attempts"] == 3 and len(fake.calls) == 3 and r["judge_verdicts"] == ["0.333333"]
    assert "QUESTION (what the user asked): When does my first sprint end?" in fake.calls[0]  # filled in
    assert r["f1"] > 0.5 and 0 < r["bleu1"] <= 1  # lexical metrics against the reference answer
    assert "ordering" not in detail


async def test_half_credit_prompt_credits_half_an_item_half(fake):
    fake.script = lambda p, n: Reply(ITEM_REPLIES[criterion(p)])
    rows = [row(["full", "half", "none"])]
    await run(fake, rows, prompt=HALF_CREDIT)
    detail = json.loads(rows[0]["score_detail"])
    assert rows[0]["score"] == 0.5 and detail["credit_rule"] == "half_credit"
    assert [it["credit"] for it in detail["items"]] == [1.0, 0.5, 0.0] and rows[0]["judge_verdicts"] == ["0.5"]


async def test_a_prompt_of_another_scorers_protocol_is_refused(fake):
    with pytest.raises(ValueError, match="longmemeval-upstream"):
        await run(fake, [row(["full"])], prompt=load_prompt("longmemeval_judge_upstream"))


async def test_unparsable_item_is_asked_again_then_judge_error_and_kept_in_the_denominator(fake):
    fake.script = lambda p, n: Reply(ITEM_REPLIES[criterion(p)])
    rows = [row(["full", "prose"]), row(["full"], question_id="conv-1:x:q1")]
    await run(fake, rows, max_parse_retries=2)
    bad, good = rows
    assert bad["status"] == "judge_error" and bad["score"] is None and bad["verdict"] is None
    assert bad["judge_error"].startswith("rubric item 2: no score found")
    assert sum(1 for c in fake.calls if criterion(c) == "prose") == 3  # 1 ask + 2 bounded re-asks
    assert bad["judge_attempts"] == 1 + 3 and bad["judge_verdicts"] == ["judge_error"]
    assert json.loads(bad["score_detail"])["items"][0]["score"] == 1.0  # the parsed item is kept for audit
    assert good["status"] == "scored" and good["score"] == 1.0 and good["verdict"] == "CORRECT"
    table = aggregate(pl.DataFrame(rows).select("dataset", "category", "excluded", "status", "verdict", "score",
                                                "f1", "bleu1"))
    overall = table.filter(pl.col("category") == "overall").to_dicts()[0]
    assert overall["n_total"] == 2 and overall["n_scored"] == 1 and overall["n_errors"] == 1
    assert overall["accuracy"] == 0.5 and overall["coverage"] == 0.5


async def test_empty_reply_is_asked_again(fake):
    fake.script = lambda p, n: Reply("") if n == 0 else Reply(ITEM_REPLIES["full"])
    rows = [row(["full"])]
    await run(fake, rows)
    assert rows[0]["score"] == 1.0 and rows[0]["judge_attempts"] == 2


async def test_event_ordering_score_is_tau_norm_of_the_aligned_answer(fake):
    def script(prompt: str, n: int) -> Reply:
        if "REFERENCE EVENTS" in prompt:
            assert "1. Core functionality\n2. Transaction error handling\n3. Security and deployment" in prompt
            assert "1. 1) Set up core features\n2. 2) Hardened security" in prompt
            return Reply('{"matches": [1, 3, 2]}')
        return Reply(ITEM_REPLIES["full"])

    fake.script = script
    answer = "1) Set up core features\n\n2) Hardened security\n3) Added error handling to transactions"
    rows = [row(["Core functionality", "Transaction error handling", "Security and deployment"], answer=answer,
                category="event_ordering")]
    await run(fake, rows)
    r = rows[0]
    ordering = json.loads(r["score_detail"])["ordering"]
    assert r["score"] == pytest.approx(2 / 3) and r["status"] == "scored"  # tau_norm, as upstream reports it
    assert json.loads(r["score_detail"])["rubric_mean"] == 1.0  # kept for audit
    assert ordering["matches"] == [0, 2, 1] and ordering["answer_items"] == 3  # the blank line is no item
    assert ordering["f1"] == 1.0 and ordering["tau_b"] == pytest.approx(1 / 3)
    assert ordering["final"] == pytest.approx(2 / 3) and ordering["status"] == "ok"
    assert r["judge_attempts"] == 3 + 1


async def test_unparsable_alignment_is_a_judge_error_that_keeps_the_rubric_for_audit(fake):
    fake.script = lambda p, n: Reply("They look aligned.") if "REFERENCE EVENTS" in p else Reply(ITEM_REPLIES["full"])
    rows = [row(["a", "b", "c"], answer="x\ny", category="event_ordering")]
    await run(fake, rows, max_parse_retries=1)
    detail = json.loads(rows[0]["score_detail"])
    assert rows[0]["status"] == "judge_error" and rows[0]["score"] is None
    assert rows[0]["judge_error"].startswith("event ordering alignment: no \"matches\" list")
    assert detail["ordering"]["status"] == "judge_error" and detail["ordering"]["attempts"] == 2
    assert detail["rubric_mean"] == 1.0
    assert sum(1 for c in fake.calls if "REFERENCE EVENTS" in c) == 2


async def test_repeated_judging_records_every_run(fake):
    fake.script = lambda p, n: Reply(ITEM_REPLIES["full"] if n == 0 else ITEM_REPLIES["none"])
    rows = [row(["full"])]
    await run(fake, rows, judge_runs=2)
    detail = json.loads(rows[0]["score_detail"])
    assert rows[0]["score"] == 1.0 and detail["run_scores"] == [1.0, 0.0]
    assert rows[0]["judge_verdicts"] == ["CORRECT", "WRONG"]


async def test_offline_lexical_stand_in_and_upstream_errors():
    rows = [row(["LLM response should state: March 29", "LLM response should mention: a deadline in June"]),
            row(["Core features", "Security"], answer="Core features first\nthen security", category="event_ordering"),
            row(["x"], search_status="error", answer_status="skipped"),
            row([], question_id="conv-1:x:q9")]
    await rubric_rows(rows, endpoint=OFFLINE, model=None, prompt=PROMPT)
    assert rows[0]["score"] == 0.5  # token recall 1.0 -> 1.0; recall 0 -> 0.0
    assert json.loads(rows[1]["score_detail"])["ordering"]["final"] == 1.0 == rows[1]["score"]
    assert [r["status"] for r in rows] == ["scored", "scored", "search_error", "judge_error"]
    assert rows[3]["judge_error"] == "the question has no rubric items"


@pytest.mark.parametrize("reply, expected", [
    ('{"score": 1.0, "reason": "ok"}', 1.0),
    ('{"score": "0.5"}', 0.5),
    ("```json\n{\"Score\": 0}\n```", 0.0),
    ('Reasoning first. {"score": 0.5, "reason": "partial"}', 0.5),
    ("**Score:** 1", 1.0),
    ('{"score": 0.7}', 0.7),
])
def test_parse_rubric_score_accepts(reply, expected):
    assert parse_rubric_score(reply) == expected


@pytest.mark.parametrize("reply, problem", [
    ("", "empty judge reply"),
    ("It partly complies.", "no score found"),
    ('{"score": "high"}', "not a number in"),
    ('{"score": true}', "not a number in"),
    ('{"score": 1.5}', "not a number in"),
    ('{"score": -0.5}', "not a number in"),
    ('{"score": 1} and later {"score": 0}', "conflicting scores"),
])
def test_parse_rubric_score_refuses(reply, problem):
    with pytest.raises(RubricParseError, match=problem):
        parse_rubric_score(reply)


def test_parse_alignment():
    assert parse_alignment('{"matches": [3, null, "1"]}', 3, 3) == [2, None, 0]
    assert parse_alignment('```json\n{"matches": [1, 1]}\n```', 2, 2) == [0, None]  # a reference is used once
    for reply, problem in (('{"matches": [1]}', "1 entries for 2"), ('{"matches": [1, 5]}', "not a reference"),
                           ("[1, 2]", 'no "matches"'), ('{"matches": [1, 1.5]}', "not a reference")):
        with pytest.raises(RubricParseError, match=problem):
            parse_alignment(reply, 2, 3)


@pytest.mark.parametrize("x, y, expected", [
    ([1, 2, 3, 4], [1, 2, 3, 4], 1.0),
    ([1, 2, 3, 4], [4, 3, 2, 1], -1.0),
    ([1, 2, 3, 4], [2, 1, 3, 4], 4 / 6),  # one adjacent swap: 5 concordant, 1 discordant
    ([1, 2, 3, 4], [1, 2, 3, 3], 5 / math.sqrt(30)),  # a tie in y only: 0.912871 (= scipy variant "b")
    ([1, 1, 2, 3], [1, 2, 2, 3], 4 / 5),  # ties on both sides: (4 - 0) / sqrt(5 * 5)
])
def test_kendall_tau_b(x, y, expected):
    assert kendall_tau_b(x, y) == pytest.approx(expected)


def test_kendall_tau_b_undefined_and_errors():
    assert math.isnan(kendall_tau_b([1, 2, 3], [5, 5, 5])) and math.isnan(kendall_tau_b([1], [1]))
    with pytest.raises(ValueError, match="same length"):
        kendall_tau_b([1, 2], [1])


def test_ordering_score_cases():
    perfect = ordering_score(4, [0, 1, 2, 3])
    assert perfect["final"] == 1.0 and perfect["tau_norm"] == 1.0
    swap = ordering_score(4, [0, 2, 1, 3])
    assert swap["f1"] == 1.0 and swap["tau_norm"] == pytest.approx((4 / 6 + 1) / 2)
    missing = ordering_score(3, [0, 1, None])  # 2 of 3 events in order, one extra answer item
    assert (missing["precision"], missing["recall"]) == pytest.approx((2 / 3, 2 / 3))
    assert missing["final"] == pytest.approx(5 / 6 * 2 / 3)
    assert ordering_score(3, [])["final"] == 0.0  # an empty answer
    one = ordering_score(1, [0])  # one event: nothing to order (upstream NaN)
    assert one["final"] == 1.0 and one["tau_b"] is None and one["undefined_tau"] == rubric.ONE_ITEM
    assert ordering_score(3, [])["undefined_tau"] == rubric.NO_ANSWER_ITEM
    with pytest.raises(ValueError, match="distinct indices"):
        ordering_score(3, [0, 0])


def test_registered_as_rubric_judge():
    assert get_scorer("rubric_judge") is rubric_rows
