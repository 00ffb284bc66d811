"""The LoCoMo run on the model path end to end: Ray, the reference participant, and a local
OpenAI-compatible server as the answer model and the judge."""

from __future__ import annotations

import polars as pl
import pytest
from pydantic import SecretStr

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import ModelEndpoint
from aml_ray.run.evaluation import EvaluationConfig, evaluate
from aml_ray.prompts import PromptHashMismatch, load_prompt
from aml_ray.reference.server import ReferenceServer
from tests.fake_openai import FakeOpenAI, Reply
from tests.servers import ThreadServer

pytestmark = pytest.mark.usefixtures("ray_session")


def script(prompt: str, n: int) -> Reply:
    if prompt.startswith("You are grading"):
        answer = prompt.split("Generated answer: ")[1].split("\n")[0]
        if answer.startswith("Unsure"):
            return Reply("I cannot tell; it might be right or wrong.")  # no label, ever -> judge_error
        if answer.startswith("Off") and n == 0:
            return Reply("The answer is INCORRECT.")  # a plain negative: WRONG, never asked again
        return Reply('Matches.\n```json\n{"label": "correct"}\n```')
    question = prompt.split("Question: ")[-1].split("\n")[0]
    if n == 0 and len(question) % 3 == 0:
        return Reply(status=429, headers={"Retry-After": "0"})  # every third question is throttled once
    return Reply("Unsure" if "when" in question.lower() else "Off the mark" if judged_off(question) else "An answer")


def judged_off(question: str) -> bool:
    """The questions whose answer the judge calls INCORRECT (a re-ask would say CORRECT)."""
    return "when" not in question.lower() and question.lower().startswith("what")


def test_locomo_on_the_model_path(tmp_path, locomo_file):
    fake = FakeOpenAI(script)
    with ThreadServer(fake.app) as http, ReferenceServer(tmp_path / "ref") as ref:
        base = f"{http.base_url}/v1"
        answer = ModelEndpoint(role="answer", base_url=base, model="gpt-4o-mini", api_key=SecretStr("sk-a"),
                               cache_path=str(tmp_path / "replies.sqlite3"))
        judge = ModelEndpoint(role="judge", base_url=base, model="judge-model", api_key=SecretStr("sk-j"),
                              timeout_s=360.0)
        result = evaluate(EvaluationConfig(
            dataset="locomo", participant=ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url),
            answer=answer, judge=judge, out_dir=tmp_path / "run", data_path=locomo_file, limit_samples=1))
    q = result.questions.filter(~pl.col("excluded"))
    when = q.filter(pl.col("question").str.to_lowercase().str.contains("when"))
    assert q.height == 152 and when.height > 0
    # "when" questions get an answer the judge cannot label: bounded re-asks, then judge_error; all three
    # replies stay in the evidence
    assert when["status"].unique().to_list() == ["judge_error"]
    assert when["judge_attempts"].to_list() == [3] * when.height
    # an explicit negative is WRONG at once: one ask, that reply kept, no re-ask turning it CORRECT
    off = q.filter(pl.col("question").map_elements(judged_off, return_dtype=pl.Boolean))
    assert off.height > 0 and off["status"].unique().to_list() == ["scored"]
    assert off["verdict"].unique().to_list() == ["WRONG"] and off["judge_attempts"].unique().to_list() == [1]
    assert when["judge_raw_all"].to_list() == [["I cannot tell; it might be right or wrong."] * 3] * when.height
    assert off["judge_raw_all"].to_list() == [["The answer is INCORRECT."]] * off.height
    others = q.filter(~pl.col("question").str.to_lowercase().str.contains("when")
                      & ~pl.col("question").map_elements(judged_off, return_dtype=pl.Boolean))
    assert others["status"].unique().to_list() == ["scored"] and others["verdict"].unique().to_list() == ["CORRECT"]
    assert others["judge_raw_all"].list.len().unique().to_list() == [1]
    throttled = q.filter(pl.col("answer_attempts") == 2)
    assert throttled.height > 0 and throttled.height == q.filter(pl.col("question").str.len_chars() % 3 == 0).height
    overall = result.table.filter(pl.col("category") == "overall").to_dicts()[0]
    assert overall["coverage"] == pytest.approx((others.height + off.height) / 152) and overall["coverage"] < 1
    assert overall["accuracy"] == pytest.approx(others.height / 152)  # judge errors count as wrong
    assert overall["n_errors"] == when.height
    info = result.run_info
    assert info["offline_models"] is False and info["models"]["judge"]["model"] == "judge-model"
    assert info["tokens"]["prompt"] > 0 and info["context_tokens"]["mean"] > 0
    assert info["cost_usd_estimate"] > 0  # gpt-4o-mini is in the price table
    assert set(fake.temperatures) == {0}
    assert "sk-a" not in result.run_dir.run_json.read_text()


def test_prompt_hash_changes_with_the_file(tmp_path):
    path = tmp_path / "answer.j2"
    path.write_text("Question: {{ question }}\n")
    first = load_prompt(path)
    path.write_text("Question: {{ question }}\nAnswer briefly.\n")
    second = load_prompt(path)
    assert first.sha256 != second.sha256 and len(first.sha256) == 64
    assert load_prompt(path, second.sha256).render(question="q") == "Question: q\nAnswer briefly.\n"
    with pytest.raises(PromptHashMismatch, match="the pin is"):
        load_prompt(path, first.sha256)
    with pytest.raises(ValueError, match="pinned sha256"):
        load_prompt("https://prompts.example/answer.j2")


def test_rejudge_rescores_without_new_answers(tmp_path, locomo_file):
    from aml_ray.config import model_endpoint_from_env
    from aml_ray.run.evidence import read_questions
    from aml_ray.run.rejudge import rejudge

    with ReferenceServer(tmp_path / "ref") as ref:
        result = evaluate(EvaluationConfig(
            dataset="locomo", participant=ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url),
            answer=model_endpoint_from_env("answer", {}), judge=model_endpoint_from_env("judge", {}),
            out_dir=tmp_path / "run", data_path=locomo_file, limit_samples=1))
    before = read_questions(result.run_dir)
    fake = FakeOpenAI(lambda p, n: Reply('Strict.\n{"label": "WRONG"}'))
    with ThreadServer(fake.app) as http:
        judge = ModelEndpoint(role="judge", base_url=f"{http.base_url}/v1", model="strict-judge")
        out = rejudge(result.run_dir.root, judge, label="strict")
    assert len(fake.calls) == 152 and all(c.startswith("You are grading") for c in fake.calls)
    overall = out.table.filter(pl.col("category") == "overall").to_dicts()[0]
    assert overall["accuracy"] == 0.0 and overall["coverage"] == 1.0 and overall["n_excluded"] == 47
    assert read_questions(result.run_dir).equals(before)  # the original evidence is untouched
    rejudged = pl.read_parquet(out.out_dir / "questions.parquet")
    assert rejudged["answer"].to_list() == before["answer"].to_list()
    with pytest.raises(ValueError, match="exists"):
        rejudge(result.run_dir.root, judge, label="strict")
