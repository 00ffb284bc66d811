"""The binary judge's replies through the real client path (issue 24): an explicit negative is WRONG at
once, a conflicting reply is asked again, and every reply of every ask stays in the evidence."""

from __future__ import annotations

import json

import pytest
from pydantic import SecretStr

from aml_ray.actors.model import ModelClient
from aml_ray.config import OFFLINE_JUDGE_MODEL, ModelEndpoint
from aml_ray.run.evidence import QUESTION_SCHEMA, to_table
from aml_ray.prompts import load_prompt
from aml_ray.retry import RetryPolicy
from aml_ray.stages.judge import judge_rows
from tests.fake_openai import FakeOpenAI, Reply
from tests.servers import ThreadServer

FAST = RetryPolicy(max_attempts=3, backoff_base_s=0.01, backoff_max_s=0.05)
LABEL_CORRECT = '{"label": "CORRECT"}'
OFFLINE_JUDGE = ModelEndpoint(role="judge", base_url=None, model=OFFLINE_JUDGE_MODEL)


@pytest.fixture
def fake():
    server = FakeOpenAI()
    with ThreadServer(server.app) as http:
        server.base_url = f"{http.base_url}/v1"
        yield server


def judge_endpoint(fake) -> ModelEndpoint:
    return ModelEndpoint(role="judge", base_url=fake.base_url, model="judge-model", api_key=SecretStr("sk-j"))


def answered(answer: str) -> dict:
    return {"question": "Where did Caroline go?", "gold": json.dumps("Paris"), "answer": answer, "category": "4",
            "search_status": "ok", "answer_status": "ok", "judge_status": None}


def answer_of(prompt: str) -> str:
    return prompt.split("Generated answer: ")[1].split("\n")[0]


async def judge(fake, rows, **kw) -> None:
    client = ModelClient(judge_endpoint(fake), FAST)
    try:
        await judge_rows(rows, endpoint=judge_endpoint(fake), model=client, prompt=load_prompt("locomo_judge"), **kw)
    finally:
        await client.aclose()


NEGATIVES = ["The answer is INCORRECT.", "WRONG", "label: wrong", "Incorrect", "NOT CORRECT", "not correct",
             '{"label":"WRONG"}', '{"label": "INCORRECT"}', "Different city.\nVerdict: incorrect"]


async def test_explicit_negative_is_wrong_without_a_reask(fake):
    # each answer's first reply is a negative in some form; a re-ask would say CORRECT (the defect: 21 of
    # 152 questions in one run turned CORRECT that way)
    fake.script = lambda p, n: Reply(NEGATIVES[int(answer_of(p).split()[-1])] if n == 0 else LABEL_CORRECT)
    rows = [answered(f"Rome {i}") for i in range(len(NEGATIVES))]
    await judge(fake, rows)
    assert [r["verdict"] for r in rows] == ["WRONG"] * len(NEGATIVES)
    assert [r["status"] for r in rows] == ["scored"] * len(NEGATIVES)
    assert [r["judge_attempts"] for r in rows] == [1] * len(NEGATIVES)
    assert len(fake.calls) == len(NEGATIVES)  # nobody was asked twice
    assert [r["judge_raw_all"] for r in rows] == [[reply] for reply in NEGATIVES]
    assert [r["judge_raw"] for r in rows] == NEGATIVES


async def test_conflicting_reply_is_asked_again_and_both_replies_are_kept(fake):
    first = 'label: WRONG\n{"label": "CORRECT"}'
    fake.script = lambda p, n: Reply(first if n == 0 else 'Different city.\n{"label": "WRONG"}')
    rows = [answered("Rome")]
    await judge(fake, rows)
    row = rows[0]
    assert row["verdict"] == "WRONG" and row["status"] == "scored" and row["judge_attempts"] == 2
    assert row["judge_raw_all"] == [first, 'Different city.\n{"label": "WRONG"}']
    assert row["judge_raw"] == 'Different city.\n{"label": "WRONG"}'  # the reply the verdict comes from


async def test_unusable_replies_are_all_kept_with_the_judge_error(fake):
    fake.script = lambda p, n: Reply(["The answer is not incorrect.", "Maybe.", "It might be wrong."][n])
    rows = [answered("Paris, France")]
    await judge(fake, rows, max_parse_retries=2)
    row = rows[0]
    assert row["verdict"] is None and row["status"] == "judge_error" and row["judge_attempts"] == 3
    assert row["judge_raw_all"] == ["The answer is not incorrect.", "Maybe.", "It might be wrong."]
    assert row["judge_error"].startswith("no label found")  # the last reply's parse error


async def test_repeated_runs_keep_every_reply_in_asking_order(fake):
    replies = ['label: CORRECT\n{"label": "WRONG"}', LABEL_CORRECT, "The answer is wrong."]
    fake.script = lambda p, n: Reply(replies[n])
    rows = [answered("Paris")]
    await judge(fake, rows, judge_runs=2)
    row = rows[0]
    # run 1: a reply with two labels that disagree (asked again), then CORRECT; run 2: a negative, WRONG at once
    assert row["judge_verdicts"] == ["CORRECT", "WRONG"] and row["verdict"] == "CORRECT"
    assert row["judge_attempts"] == 3 and row["judge_raw_all"] == replies


async def test_every_reply_column_is_written_as_a_list_of_strings(fake):
    fake.script = lambda p, n: Reply("Incorrect." if n == 0 else LABEL_CORRECT)
    rows = [answered("Rome"), {**answered("x"), "answer_status": "error", "answer": None}]
    await judge(fake, rows)
    table = to_table(rows, QUESTION_SCHEMA)
    assert str(table.schema.field("judge_raw_all").type) == "list<item: string>"
    assert table.column("judge_raw_all").to_pylist() == [["Incorrect."], None]  # an unanswered row is not judged


async def test_offline_judge_records_its_one_explanation(fake):
    rows = [answered("Paris")]
    await judge_rows(rows, endpoint=OFFLINE_JUDGE, model=None, prompt=load_prompt("locomo_judge"))
    assert rows[0]["verdict"] == "CORRECT" and rows[0]["judge_raw_all"] == [rows[0]["judge_raw"]]
    assert fake.calls == []


async def test_an_empty_reply_is_kept_as_an_empty_string(fake):
    # an empty reply is asked again; the audit lists it too, so judge_raw_all has one entry per reply
    fake.script = lambda p, n: Reply("" if n == 0 else LABEL_CORRECT)
    rows = [answered("Paris")]
    await judge(fake, rows)
    row = rows[0]
    assert row["verdict"] == "CORRECT" and row["judge_raw_all"] == ["", LABEL_CORRECT]
    assert len(fake.calls) == 2
