"""Where a job's models run (aml_ray.run.pipeline, aml_ray.stages.ingest): by default inside the Ingest actor,
for online models as for offline ones; a searched sample gives its ingestion slot to the next sample while
its rows wait for the models."""

from __future__ import annotations

import asyncio
import time

import polars as pl
import pytest
from pydantic import SecretStr

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import ModelEndpoint
from aml_ray.reference.server import ReferenceServer
from aml_ray.run.evaluation import EvaluationConfig, evaluate
from aml_ray.run.evidence import RunDir, read_questions
from aml_ray.run.pipeline import PipelineOptions
from tests.fake_openai import FakeOpenAI, Reply
from tests.servers import ThreadServer

pytestmark = pytest.mark.usefixtures("ray_session")

#: How long a held answer waits for what it waits for (seconds): far longer than a sample's Adds take on a
#: loaded machine, so only a missing behaviour reaches it.
HOLD_S = 60.0


def _judge_prompt(prompt: str) -> bool:
    return prompt.startswith("You are grading")


def _script(prompt: str, n: int) -> Reply:
    """Deterministic replies: CORRECT for questions of even length, an explicit INCORRECT otherwise."""
    if _judge_prompt(prompt):
        answer = prompt.split("Generated answer: ")[1].split("\n")[0]
        return Reply('```json\n{"label": "correct"}\n```' if answer.endswith("even") else "INCORRECT")
    question = prompt.split("Question: ")[-1].split("\n")[0]
    return Reply(f"An answer, {'even' if len(question) % 2 == 0 else 'odd'}")


def _endpoints(base: str) -> tuple[ModelEndpoint, ModelEndpoint]:
    return (ModelEndpoint(role="answer", base_url=base, model="gpt-4o-mini", api_key=SecretStr("sk-a")),
            ModelEndpoint(role="judge", base_url=base, model="judge-model", api_key=SecretStr("sk-j")))


def test_online_models_run_inside_the_ingest_actor_with_the_rows_of_their_own_operator(tmp_path, locomo_file):
    """With online models, a job is one Ingest actor by default: no Ray Data operator (``MapWorker``) is
    started, and every question's answer, context, verdict and status are those of the layout where Answer and
    Judge are a Ray Data operator of their own (``models_inline=False``)."""
    import ray

    columns = ["question_id", "status", "answer", "context_tokens", "memories_in_context", "verdict"]
    rows, started = {}, {}
    fake = FakeOpenAI(_script)
    with ThreadServer(fake.app) as http, ReferenceServer(tmp_path / "ref") as ref:
        answer, judge = _endpoints(f"{http.base_url}/v1")
        for inline in (True, False):
            before = set(ray._private.state.actors())
            result = evaluate(EvaluationConfig(
                dataset="locomo", participant=ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url),
                answer=answer, judge=judge, out_dir=tmp_path / f"inline-{inline}", data_path=locomo_file,
                limit_samples=1, options=PipelineOptions(models_inline=inline)))
            rows[inline] = read_questions(result.run_dir).select(columns).sort("question_id")
            started[inline] = {a["ActorClassName"] for aid, a in ray._private.state.actors().items() if aid not in before}
    scored = rows[True].filter(pl.col("status") == "scored")
    assert scored.height == 152 and set(scored["verdict"].to_list()) == {"CORRECT", "WRONG"}
    assert rows[True].equals(rows[False])
    assert "IngestFromFiles" in started[True] and not [c for c in started[True] if c.startswith("MapWorker(")]
    assert "MapWorker(MapBatches(AnswerJudgeStage))" in started[False], started


def test_a_searched_sample_gives_its_slot_to_the_next_samples_adds_while_its_rows_wait_for_the_models(
        tmp_path, locomo_file):
    """One sample ingested at a time (``ingest_parallelism=1``), no head start: the answer model holds its
    first request until the second sample's Adds are journalled. The first sample gave its slot back once
    searched, so the second sample's Adds go meanwhile and release the held answer, not the timeout."""
    run_root = tmp_path / "run"
    held: list[str] = []

    def second_sample_added() -> bool:
        journals = list(RunDir(run_root).root.glob("evidence/adds/*.jsonl"))
        return len([p for p in journals if p.stat().st_size > 0]) >= 2

    async def hold(prompt: str) -> None:
        if _judge_prompt(prompt) or held:
            return
        held.append("held")
        deadline = time.monotonic() + HOLD_S
        while not second_sample_added() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        held.append("by the second sample's Adds" if second_sample_added() else "by the timeout")

    fake = FakeOpenAI(_script, hold=hold)
    with ThreadServer(fake.app) as http, ReferenceServer(tmp_path / "ref") as ref:
        answer, judge = _endpoints(f"{http.base_url}/v1")
        result = evaluate(EvaluationConfig(
            dataset="locomo", participant=ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url),
            answer=answer, judge=judge, out_dir=run_root, data_path=locomo_file, limit_samples=2,
            head_start=False, options=PipelineOptions(ingest_parallelism=1)))
    assert held == ["held", "by the second sample's Adds"]
    q = result.questions.filter(~pl.col("excluded"))
    assert q["sample_id"].n_unique() == 2 and q["status"].unique().to_list() == ["scored"]
