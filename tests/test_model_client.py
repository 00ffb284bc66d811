"""ModelClient and the answer/judge code paths against a local OpenAI-compatible server (no Ray)."""

from __future__ import annotations

import json
import time

import pytest
from pydantic import SecretStr

from aml_ray.actors.model import ModelClient
from aml_ray.config import ModelEndpoint, model_endpoint_from_env
from aml_ray.prompts import load_prompt
from aml_ray.retry import RetryPolicy
from aml_ray.stages.judge import judge_rows
from tests.fake_openai import FakeOpenAI, Reply
from tests.servers import ThreadServer

FAST = RetryPolicy(max_attempts=3, backoff_base_s=0.01, backoff_max_s=0.05)
MSG = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def fake():
    server = FakeOpenAI()
    with ThreadServer(server.app) as http:
        server.base_url = f"{http.base_url}/v1"
        yield server


def endpoint(fake, **kw) -> ModelEndpoint:
    kw.setdefault("model", "gpt-4o-mini")
    return ModelEndpoint(role="answer", base_url=fake.base_url, api_key=SecretStr("sk-test-secret"), **kw)


async def test_completion_at_temperature_zero_with_usage_and_cost(fake):
    fake.script = lambda p, n: Reply("Paris")
    client = ModelClient(endpoint(fake), FAST)
    out = await client.complete(MSG)
    await client.aclose()
    assert out["status"] == "ok" and out["text"] == "Paris" and out["attempts"] == 1
    assert fake.temperatures == [0] and fake.models == ["gpt-4o-mini"]
    assert fake.auth == ["Bearer sk-test-secret"]
    assert out["prompt_tokens"] == 6 and out["completion_tokens"] == 1
    assert out["cost_usd"] == pytest.approx((6 * 0.15 + 1 * 0.60) / 1e6)


async def test_429_with_retry_after_then_success(fake):
    fake.script = lambda p, n: Reply(status=429, headers={"Retry-After": "1"}) if n == 0 else Reply("Paris")
    client = ModelClient(endpoint(fake), FAST)
    t0 = time.perf_counter()
    out = await client.complete(MSG)
    await client.aclose()
    assert out["status"] == "ok" and out["attempts"] == 2 and out["text"] == "Paris"
    assert time.perf_counter() - t0 >= 0.95


async def test_500_then_success(fake):
    fake.script = lambda p, n: Reply(status=500) if n == 0 else Reply("Paris")
    client = ModelClient(endpoint(fake), FAST)
    out = await client.complete(MSG)
    await client.aclose()
    assert (out["status"], out["attempts"], len(fake.calls)) == ("ok", 2, 2)


async def test_timeout_is_retried_then_reported(fake):
    fake.script = lambda p, n: Reply("late", delay_s=1.0)
    client = ModelClient(endpoint(fake, timeout_s=0.2), RetryPolicy(max_attempts=2, backoff_base_s=0.01))
    out = await client.complete(MSG)
    await client.aclose()
    assert out["status"] == "error" and out["attempts"] == 2
    assert out["error"] == "gave up after 2 attempts: APITimeoutError"


async def test_400_is_not_retried(fake):
    fake.script = lambda p, n: Reply(status=400)
    client = ModelClient(endpoint(fake), FAST)
    out = await client.complete(MSG)
    await client.aclose()
    assert out["status"] == "error" and out["attempts"] == 1 and "HTTP 400" in out["error"]
    assert "sk-test-secret" not in out["error"]


async def test_empty_reply_is_an_error(fake):
    fake.script = lambda p, n: Reply("")
    client = ModelClient(endpoint(fake), FAST)
    out = await client.complete(MSG)
    await client.aclose()
    assert out["status"] == "error" and out["error"] == "empty reply"


async def test_a_reply_that_is_not_a_chat_completion_is_retried_then_reported(fake):
    fake.script = lambda p, n: Reply(body="<html>bad gateway</html>") if n == 0 else Reply("Paris")
    client = ModelClient(endpoint(fake), FAST)
    out = await client.complete(MSG)
    assert (out["status"], out["text"], out["attempts"]) == ("ok", "Paris", 2)
    fake.script = lambda p, n: Reply(body='{"choices": "none"}')
    out = await client.complete([{"role": "user", "content": "again"}])
    await client.aclose()
    assert out["status"] == "error" and out["attempts"] == 3
    assert out["error"] == "gave up after 3 attempts: malformed reply (not a chat completion)"


def test_reply_fields_missing_read_as_empty_and_zero():
    from aml_ray.actors.model import _reply

    assert _reply(b'{"choices": [{"message": {"content": null}}]}') == ("", {"prompt_tokens": 0, "completion_tokens": 0})
    assert _reply(b'{"choices": [], "usage": {"prompt_tokens": 7}}') == ("", {"prompt_tokens": 7, "completion_tokens": 0})
    assert _reply('{"choices": [{"message": {"content": "é"}}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}'
                  .encode()) == ("é", {"prompt_tokens": 3, "completion_tokens": 1})


async def test_reply_cache_avoids_paying_twice(fake, tmp_path):
    fake.script = lambda p, n: Reply(f"Paris #{n}")
    client = ModelClient(endpoint(fake, cache_path=str(tmp_path / "cache.sqlite3")), FAST)
    first = await client.complete(MSG, prompt_sha256="abc")
    second = await client.complete(MSG, prompt_sha256="abc")
    other_prompt = await client.complete(MSG, prompt_sha256="def")
    fresh = await client.complete(MSG, prompt_sha256="abc", use_cache=False)
    await client.aclose()
    assert first["text"] == second["text"] == "Paris #0" and second["cached"] and second["cost_usd"] == 0.0
    assert not other_prompt["cached"] and other_prompt["text"] == "Paris #1"
    assert fresh["text"] == "Paris #2" and len(fake.calls) == 3


async def test_rpm_limit_spaces_requests(fake):
    fake.script = lambda p, n: Reply("ok")
    client = ModelClient(endpoint(fake, rpm=120), FAST)  # 1.9 per second (5 % headroom), one at once
    t0 = time.perf_counter()
    await client.complete_batch([MSG] * 4)
    elapsed = time.perf_counter() - t0
    await client.aclose()
    assert elapsed >= 1.5, f"4 requests at 120/min finished in {elapsed:.2f} s"


def test_endpoint_from_env_validates_and_hides_the_key():
    env = {"JUDGE_API_BASE": "http://127.0.0.1:9/v1", "JUDGE_MODEL": "gpt-4o-mini", "JUDGE_API_KEY": "sk-x",
           "JUDGE_RPM": "600", "AML_MODEL_CACHE": "off"}
    ep = model_endpoint_from_env("judge", env)
    assert (ep.timeout_s, ep.rpm, ep.cache_path) == (360.0, 600.0, None)
    assert "sk-x" not in repr(ep) and "sk-x" not in json.dumps(ep.describe())
    with pytest.raises(ValueError, match="JUDGE_MODEL"):
        model_endpoint_from_env("judge", {"JUDGE_API_BASE": "http://x/v1"})
    with pytest.raises(ValueError, match="JUDGE_RPM"):
        model_endpoint_from_env("judge", {**env, "JUDGE_RPM": "-3"})
    assert model_endpoint_from_env("answer", {}).offline


def judged_row(answer: str) -> dict:
    return {"question": "Where did Caroline go?", "gold": json.dumps("Paris"), "answer": answer,
            "category": "4", "search_status": "ok", "answer_status": "ok", "judge_status": None}


JUDGE_REPLIES = {
    "fenced": "The answer names the same city.\n```json\n{\"label\": \"CORRECT\"}\n```",
    "lower": "Same city.\n{\"label\": \"correct\"}",
    "prose": "I think this is probably right but I am not sure.",
    "wrong": "Different city.\n{'label': 'WRONG'}",
}


async def test_judge_parsing_retries_and_errors(fake):
    def script(prompt: str, n: int) -> Reply:
        kind = prompt.split("Generated answer: ")[1].split("\n")[0]
        if kind == "empty":
            return Reply("") if n == 0 else Reply(JUDGE_REPLIES["fenced"])
        return Reply(JUDGE_REPLIES[kind])

    fake.script = script
    client = ModelClient(endpoint(fake), FAST)
    rows = [judged_row(k) for k in ("fenced", "lower", "prose", "wrong", "empty")]
    ep = endpoint(fake)
    await judge_rows(rows, endpoint=ep, model=client, prompt=load_prompt("locomo_judge"), max_parse_retries=2)
    await client.aclose()
    assert [r["verdict"] for r in rows] == ["CORRECT", "CORRECT", None, "WRONG", "CORRECT"]
    assert [r["status"] for r in rows] == ["scored", "scored", "judge_error", "scored", "scored"]
    prose = rows[2]
    assert prose["judge_attempts"] == 3 and prose["judge_error"].startswith("no label found")
    assert sum(1 for c in fake.calls if "Generated answer: prose" in c) == 3  # 1 ask + 2 bounded re-asks
    assert rows[4]["judge_attempts"] == 2  # the empty reply was asked again


async def test_repeated_judging_records_every_run(fake):
    fake.script = lambda p, n: Reply(JUDGE_REPLIES["fenced"] if n % 2 == 0 else JUDGE_REPLIES["wrong"])
    client = ModelClient(endpoint(fake), FAST)
    rows = [judged_row("Paris")]
    await judge_rows(rows, endpoint=endpoint(fake), model=client, prompt=load_prompt("locomo_judge"), judge_runs=3)
    await client.aclose()
    assert rows[0]["judge_verdicts"] == ["CORRECT", "WRONG", "CORRECT"] and rows[0]["verdict"] == "CORRECT"
