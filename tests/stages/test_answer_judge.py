"""The model stage judges a task's answered rows while the task's other rows are still being answered
(aml_ray.stages.answer_judge)."""

from __future__ import annotations

import asyncio
import threading

import polars as pl
import pyarrow as pa
import pytest
from pydantic import SecretStr

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import ModelEndpoint
from aml_ray.reference.server import ReferenceServer
from aml_ray.run.evaluation import EvaluationConfig, evaluate
from aml_ray.run.pipeline import PipelineOptions
from tests.fake_openai import FakeOpenAI, Reply
from tests.servers import ThreadServer

#: How long the held answer waits for a judge call before it is answered anyway (seconds): far longer than
#: a slice's answers and judgement take on a loaded machine, so only a missing behaviour reaches it.
HOLD_S = 90.0


def _judge_prompt(prompt: str) -> bool:
    return prompt.startswith("You are grading")


@pytest.mark.usefixtures("ray_session")
def test_a_tasks_answered_rows_are_judged_while_one_of_its_answers_is_still_out(tmp_path, locomo_file):
    """One model task holds the sample's 152 scorable questions; the answer model holds its first request
    until the judge model has been called. The judge is called for the task's other rows meanwhile, so
    the held answer is let go by a judge call, not by the timeout, and every question is scored."""
    judged = threading.Event()
    held: list[str] = []

    async def hold(prompt: str) -> None:
        if _judge_prompt(prompt):
            judged.set()
        elif not held:
            held.append("held")
            released = await asyncio.to_thread(judged.wait, HOLD_S)
            held.append("by a judge call" if released else "by the timeout")

    def script(prompt: str, n: int) -> Reply:
        return Reply('```json\n{"label": "correct"}\n```') if _judge_prompt(prompt) else Reply("An answer")

    fake = FakeOpenAI(script, hold=hold)
    with ThreadServer(fake.app) as http, ReferenceServer(tmp_path / "ref") as ref:
        base = f"{http.base_url}/v1"
        answer = ModelEndpoint(role="answer", base_url=base, model="gpt-4o-mini", api_key=SecretStr("sk-a"))
        judge = ModelEndpoint(role="judge", base_url=base, model="judge-model", api_key=SecretStr("sk-j"))
        result = evaluate(EvaluationConfig(
            dataset="locomo", participant=ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url),
            answer=answer, judge=judge, out_dir=tmp_path / "run", data_path=locomo_file, limit_samples=1,
            options=PipelineOptions(model_batch_size=256)))
    assert held == ["held", "by a judge call"]
    q = result.questions.filter(~pl.col("excluded"))
    assert q.height == 152 and q["status"].unique().to_list() == ["scored"]
    assert q["verdict"].unique().to_list() == ["CORRECT"]


def test_slices_come_back_in_the_batchs_order(monkeypatch):
    """Each slice goes through Answer, then Judge; the batch comes back whole, in its order, whatever order
    the slices end in."""
    from aml_ray.stages.answer_judge import AnswerJudgeStage

    stage = AnswerJudgeStage.__new__(AnswerJudgeStage)
    stage.slice_rows = 3
    seen: list[list[int]] = []

    async def answer(rows: pa.Table) -> pa.Table:
        ids = rows.column("i").to_pylist()
        await asyncio.sleep(0.01 * (10 - ids[0]))  # later slices end first
        return rows.append_column("answered", pa.array([True] * rows.num_rows))

    async def judge(rows: pa.Table) -> pa.Table:
        seen.append(rows.column("i").to_pylist())
        assert rows.column("answered").to_pylist() == [True] * rows.num_rows
        return rows

    stage.answer, stage.judge = answer, judge
    out = asyncio.run(stage(pa.table({"i": list(range(10))})))
    assert out.column("i").to_pylist() == list(range(10))
    assert seen == [[9], [6, 7, 8], [3, 4, 5], [0, 1, 2]]


def test_a_slice_of_no_rows_is_refused():
    from aml_ray.stages.answer_judge import AnswerJudgeStage

    with pytest.raises(ValueError, match="slice_rows must be >= 1, got 0"):
        AnswerJudgeStage({}, {}, slice_rows=0)


def test_pipeline_options_refuse_a_slice_of_no_rows_before_anything_runs():
    with pytest.raises(ValueError, match="PipelineOptions.judge_slice_rows must be 1 or more rows, got 0"):
        PipelineOptions(judge_slice_rows=0)
    assert PipelineOptions().judge_slice_rows == 8
