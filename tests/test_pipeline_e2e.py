"""End to end through Ray: the real LoCoMo file, the reference memory system over loopback HTTP, the
offline answerer and judge; evidence read back from Parquet."""

from __future__ import annotations

import json
import time

import polars as pl
import pytest
from fastapi import FastAPI, Request
from typer.testing import CliRunner

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.cli_tables import ms
from aml_ray.config import model_endpoint_from_env
from aml_ray.run.evaluation import EvaluationConfig, evaluate
from aml_ray.run.evidence import RunDir, read_adds, read_questions
from aml_ray.run.pipeline import StageFailed
from aml_ray.reference.server import ReferenceServer
from tests.servers import ThreadServer

pytestmark = pytest.mark.usefixtures("ray_session")
OFFLINE = {"answer": model_endpoint_from_env("answer", {}), "judge": model_endpoint_from_env("judge", {})}


def config(tmp_path, spec, locomo_file, **kw) -> EvaluationConfig:
    return EvaluationConfig(dataset="locomo", participant=spec, out_dir=tmp_path / "run", data_path=locomo_file,
                            **OFFLINE, **kw)


@pytest.fixture(scope="module")
def two_sample_run(tmp_path_factory, locomo_file):
    tmp = tmp_path_factory.mktemp("e2e")
    with ReferenceServer(tmp / "ref") as ref:
        spec = ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url)
        result = evaluate(config(tmp, spec, locomo_file, limit_samples=2, run_label="e2e"))
    return result


def test_two_conversations_evidence_counts(two_sample_run):
    result = two_sample_run
    info = json.loads(result.run_dir.run_json.read_text())
    adds = read_adds(result.run_dir)
    questions = read_questions(result.run_dir)
    # conv-26 (19 sessions with turns, 419 turns) and conv-30: counts from the file itself
    assert info["status"] == "completed"
    assert info["dataset"]["samples"] == 2
    assert adds.height == info["dataset"]["chunks"] == 55
    # the journals became one Parquet file per sample once the run's traffic was over
    assert sorted(p.name for p in result.run_dir.adds.iterdir()) == ["conv-26.parquet", "conv-30.parquet"]
    assert adds["status"].to_list() == ["ok"] * 55
    assert adds["request_id"].n_unique() == 55
    assert questions.height == info["dataset"]["questions"] == 304
    assert questions.filter(pl.col("excluded")).height == info["dataset"]["excluded_questions"] == 71
    scored = questions.filter(~pl.col("excluded"))
    assert scored["status"].to_list() == ["scored"] * 233
    assert scored["search_status"].unique().to_list() == ["ok"]
    assert scored["verdict"].is_in(["CORRECT", "WRONG"]).all()
    assert scored["f1"].is_between(0, 1).all() and scored["bleu1"].is_between(0, 1).all()
    # excluded questions are never sent to Search
    assert questions.filter(pl.col("excluded"))["search_status"].null_count() == 71


def test_run_json_is_complete(two_sample_run):
    info = two_sample_run.run_info
    for key in ("run_id", "dataset", "participant", "models", "prompts", "top_k", "package_version",
                "git_commit", "pipeline_code_sha256", "adds", "search", "evidence", "wall_s"):
        assert info[key] is not None, key
    assert info["dataset"]["sha256"] == "79fa87e90f04081343b8c8debecb80a9a6842b76a7aa537dc9fdf651ea698ff4"
    assert {r: p["name"] for r, p in info["prompts"].items()} == {"answer": "locomo_answer", "judge": "locomo_judge"}
    assert all(len(p["sha256"]) == 64 for p in info["prompts"].values())
    assert info["offline_models"] is True
    assert "offline" in info["models"]["answer"]["model"] and info["top_k"] == 100
    assert info["dataset"]["questions_by_category"] == {"1": 43, "2": 63, "3": 13, "4": 114, "5": 71}


def test_run_json_says_what_its_wall_time_and_latencies_cover(two_sample_run):
    """Issue 25 (5): wall time covers the whole command; latency is the participant's, queue wait apart."""
    info, run_dir = two_sample_run.run_info, two_sample_run.run_dir
    assert "the whole command: from its start" in info["wall_covers"] and "Ray start" in info["wall_covers"]
    t = info["timings"]
    assert set(t) == {"before_ray_s", "ray_start_s", "prepare_s", "pipeline_s", "scoring_s"}  # Ray was running: no shutdown
    # prepare_s (dataset, inputs, run.json) comes before the Ray start, within before_ray_s; the pre-flight's
    # round trips go on beside both (issue 29)
    assert info["wall_s"] >= t["before_ray_s"] + t["ray_start_s"] + t["pipeline_s"] + t["scoring_s"] - 0.01
    assert t["before_ray_s"] >= t["prepare_s"] > 0 and info["preflight"]["wall_s"] > 0
    scored = read_questions(run_dir).filter(pl.col("search_status") == "ok")
    adds = read_adds(run_dir)
    assert scored["search_queue_ms"].null_count() == 0 and (scored["search_queue_ms"] >= 0).all()
    assert adds["queue_ms"].null_count() == 0
    assert info["search"]["queue_ms"]["n"] == scored.height == info["search"]["latency_ms"]["n"]
    assert info["search"]["latency_ms"]["p50"] == pytest.approx(scored["search_latency_ms"].median())
    c = info["participant_concurrency"]
    assert c["adaptive"] is True and c["declared"] == 64 and 1 <= c["min"] <= c["final"] <= c["max"] <= 64
    # each endpoint's unloaded latency: never more than the median time there, queueing included
    assert set(c["unloaded_ms"]) == {"add", "search"}
    assert 0 < c["unloaded_ms"]["search"] <= info["search"]["latency_ms"]["p50"] + 0.1
    # the run joined the session's cluster, whose registry granted it the head start: the Adds the head start
    # sent went through its own client, the others and every Search through the participant's client, whose
    # limit starts where the head start's was at the handover
    head = info["head_start"]
    assert head["ended"] in ("handover", "done") and head["failed"] == 0
    assert c["replies"] == 55 - head["adds"] + 233
    assert c["trajectory"][0][0] == 0 and c["trajectory"][0][1] >= 1


def test_search_results_never_cross_user_ids(two_sample_run):
    questions = read_questions(two_sample_run.run_dir).filter(~pl.col("excluded"))
    rows = questions.select("user_id", "memories").to_dicts()
    assert sum(len(r["memories"]) for r in rows) > 1000
    for r in rows:
        # the reference system's memory ids are "<request_id>#<position>"; request ids embed the user_id
        assert all(m["id"].startswith(r["user_id"] + ":chunk-") for m in r["memories"])


def test_score_table_per_category(two_sample_run):
    table = two_sample_run.table
    assert table["category"].to_list() == ["1", "2", "3", "4", "5", "overall"]
    overall = table.filter(pl.col("category") == "overall").to_dicts()[0]
    assert overall["n_total"] == 233 and overall["n_excluded"] == 71 and overall["coverage"] == 1.0
    questions = two_sample_run.questions.filter(~pl.col("excluded"))
    assert overall["accuracy"] == pytest.approx((questions["verdict"] == "CORRECT").sum() / 233)


def _rendezvous_app(seen: dict) -> FastAPI:
    """A participant whose first Add of each sample waits until the first Add of another sample arrives.

    If one Ingest task held both samples, their Adds would be sent one after the other and the wait
    would end only by its timeout (recorded in ``seen["timed_out"]``); with one task per sample the two
    first Adds are in flight together and both return at once. Search returns no memory.
    """
    import asyncio

    app = FastAPI()
    both = asyncio.Event()

    @app.post("/add")
    async def add(request: Request):
        b = await request.json()
        users = seen.setdefault("users", [])
        if b["user_id"].endswith(":preflight"):  # the run's pre-flight probe (aml_ray.run.preflight) is no sample
            pass
        elif b["user_id"] not in users:
            users.append(b["user_id"])
            if len(users) >= 2:
                both.set()
            try:
                await asyncio.wait_for(both.wait(), timeout=30)
            except asyncio.TimeoutError:
                seen["timed_out"] = True
        return {"success": True, "request_id": b["request_id"], "user_id": b["user_id"], "session_id": b["session_id"]}

    @app.post("/search")
    async def search(request: Request):
        return {"data": []}

    return app


def test_each_sample_is_its_own_ingest_task(tmp_path, locomo_file):
    """The inputs travel as one file per sample (aml_ray.run.inputs): each sample is its own Ingest task, so the
    two samples' first Adds are in flight together (one task holding both would send them in turn)."""
    seen: dict = {}
    with ThreadServer(_rendezvous_app(seen)) as server:
        # a fixed limit: the adaptive one starts at one request in flight (aml_ray.actors.adaptive), and this
        # server answers nothing until it holds both samples' first Adds
        spec = ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search",
                               adaptive_concurrency=False)
        result = evaluate(config(tmp_path, spec, locomo_file, limit_samples=2, retrieval_only=True))
    assert len(seen["users"]) == 2 and "timed_out" not in seen
    assert result.run_info["adds"]["ok"] == 55


def test_one_task_runs_its_samples_at_once(tmp_path, locomo_file):
    """Two samples in one Ingest task (samples_per_task=2) still have their first Adds in flight together,
    and every Add and question of both is in the evidence."""
    from aml_ray.run.pipeline import PipelineOptions

    seen: dict = {}
    with ThreadServer(_rendezvous_app(seen)) as server:
        spec = ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search",
                               adaptive_concurrency=False)  # a fixed limit, as above
        result = evaluate(config(tmp_path, spec, locomo_file, limit_samples=2, retrieval_only=True,
                                 options=PipelineOptions(samples_per_task=2)))
    assert len(seen["users"]) == 2 and "timed_out" not in seen
    assert result.run_info["adds"]["ok"] == 55
    assert result.questions.height == 304
    scored = result.questions.filter(~pl.col("excluded"))
    assert scored["status"].unique().to_list() == ["retrieved"] and scored["n_memories"].sum() == 0


@pytest.mark.parametrize("per_task,parallelism,n,retrieval_only,expected", [
    (None, 16, 10, False, (1, 16)),     # LoCoMo: one sample per task, as before
    (None, 16, 100, False, (3, 12)),    # 100 samples: 3 a task, twice the 6 tasks that 16 samples need
    (None, 16, 500, False, (8, 4)),     # capped at 8 a task
    (None, 4, 9, False, (1, 4)),
    (2, 16, 10, False, (2, 16)),        # an explicit choice
    (None, 16, 10, True, (1, 16)),      # retrieval-only: at least 8 tasks ...
    (None, 16, 40, True, (5, 8)),
    (None, 16, 100, True, (8, 4)),      # ... of up to 8 samples (nothing waits downstream for a task's rows)
    (3, 16, 100, True, (3, 12)),        # an explicit choice still wins
])
def test_ingest_layout(per_task, parallelism, n, retrieval_only, expected):
    from aml_ray.run.pipeline import PipelineOptions

    options = PipelineOptions(ingest_parallelism=parallelism, samples_per_task=per_task)
    assert options.ingest_layout(n, retrieval_only=retrieval_only) == expected


def test_summary_figures_equal_those_of_the_full_evidence(two_sample_run):
    """evaluate() reads only SUMMARY_COLUMNS back; its table and run.json figures are those of every column."""
    from aml_ray.run.evaluation import answer_cap_summary, usage_summary
    from aml_ray.scoring.aggregate import aggregate, latency_summary

    full = read_questions(two_sample_run.run_dir)
    info = two_sample_run.run_info
    assert two_sample_run.table.equals(aggregate(full.with_columns(pl.lit("locomo").alias("dataset"))))
    usage = usage_summary(full)
    assert {k: info[k] for k in usage} == usage and info["context_tokens"]["mean"] > 0
    assert info["answer_cap"] == answer_cap_summary(full, 128) and info["answer_cap"]["answers"] == 304 - full[
        "excluded"].sum()
    assert info["search"]["latency_ms"] == latency_summary(full.filter(pl.col("search_status") == "ok")["search_latency_ms"])
    assert info["evidence"]["question_rows"] == full.height == 304
    assert not (two_sample_run.run_dir.root / "inputs").exists()  # removed once the run completed


def _misbehaving_app(kind: str, *, in_preflight: bool = False) -> FastAPI:
    """Breaks the contract in the run's traffic; the pre-flight probe (aml_ray.run.preflight) is answered
    correctly unless ``in_preflight``, so the violation is met by the pipeline itself."""
    app = FastAPI()

    def breaks(b: dict) -> bool:
        return in_preflight or not b["user_id"].endswith(":preflight")

    @app.post("/add")
    async def add(request: Request):
        b = await request.json()
        rid = b["request_id"] + ("-x" if kind == "wrong_echo" and breaks(b) else "")
        return {"success": True, "request_id": rid, "user_id": b["user_id"], "session_id": b["session_id"]}

    @app.post("/search")
    async def search(request: Request):
        b = await request.json()
        n = b["top_k"] + 1 if breaks(b) else 0
        return {"data": [{"id": f"m{i}", "content": "x"} for i in range(n)]}

    return app


@pytest.mark.parametrize("kind,field,samples", [("too_many", "data", 1), ("wrong_echo", "request_id", 1),
                                                 ("too_many", "data", 2)])
def test_contract_violation_stops_the_run_naming_the_field(tmp_path, locomo_file, kind, field, samples):
    """samples=2: both samples in one Ingest task; the first failure is raised as itself."""
    from aml_ray.run.pipeline import PipelineOptions

    with ThreadServer(_misbehaving_app(kind)) as server:
        spec = ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search")
        with pytest.raises(StageFailed) as info:
            evaluate(config(tmp_path, spec, locomo_file, limit_samples=samples,
                            options=PipelineOptions(samples_per_task=samples)))
    assert info.value.failure["kind"] == "ContractError" and info.value.failure["field"] == field
    assert f"field '{field}'" in info.value.summary
    run = json.loads(RunDir(tmp_path / "run").run_json.read_text())
    assert run["status"] == "failed" and f"field '{field}'" in run["error"]
    assert run["preflight"]["steps"]["search"]["ok"] is True


@pytest.mark.parametrize("kind,field", [("too_many", "data"), ("wrong_echo", "request_id")])
def test_contract_violation_in_the_preflight_stops_the_run_before_any_add(tmp_path, locomo_file, kind, field):
    """Issue 24: the pre-flight's round trip meets the violation; no Add of the dataset is sent."""
    with ThreadServer(_misbehaving_app(kind, in_preflight=True)) as server:
        spec = ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search")
        with pytest.raises(StageFailed) as info:
            evaluate(config(tmp_path, spec, locomo_file, limit_samples=1))
    failure = info.value.failure
    assert (failure["kind"], failure["stage"], failure["field"]) == ("ContractError", "preflight", field)
    assert f"ContractError: field '{field}'" in info.value.summary
    run = json.loads(RunDir(tmp_path / "run").run_json.read_text())
    assert run["status"] == "failed" and run["failure"]["field"] == field
    assert not (tmp_path / "run" / "evidence" / "adds").exists() or not any((tmp_path / "run" / "evidence" / "adds").iterdir())


def test_cli_run_prints_table(tmp_path, locomo_file):
    from aml_ray.cli import app

    out = tmp_path / "cli-run"
    res = CliRunner().invoke(app, ["run", "--data", str(locomo_file), "--limit-samples", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "1 multi-hop" in res.output and "overall" in res.output
    assert "OFFLINE" in res.output and "excluded" in res.output
    assert (out / "results.json").is_file()
    # the Search latency line names the participant's unloaded latency beside the time there (issue 29)
    limit = json.loads((out / "run.json").read_text())["participant_concurrency"]
    assert set(limit["unloaded_ms"]) == {"add", "search"} and limit["unloaded_ms"]["search"] > 0
    line = " ".join(res.output.split())
    assert f"{ms(limit['unloaded_ms']['search'])} unloaded, at most {limit['max']} in flight); wall" in line, line
    again = CliRunner().invoke(app, ["run", "--data", str(locomo_file), "--limit-samples", "1", "--out", str(out)])
    assert again.exit_code == 2 and "already there" in again.output


def test_cli_retrieval_only_calls_no_model(tmp_path, locomo_file, monkeypatch):
    """--retrieval-only: Adds and Searches only; model endpoints that would refuse every call are never called."""
    from aml_ray.cli import app

    for role in ("ANSWER", "JUDGE"):  # port 9 (discard) on loopback: any model call would fail the run
        monkeypatch.setenv(f"{role}_API_BASE", "http://127.0.0.1:9/v1")
        monkeypatch.setenv(f"{role}_MODEL", "gpt-4o-mini")
        monkeypatch.setenv(f"{role}_API_KEY", "unused")
    out = tmp_path / "retrieval"
    res = CliRunner().invoke(app, ["run", "--data", str(locomo_file), "--limit-samples", "1", "--out", str(out),
                                   "--retrieval-only"])
    assert res.exit_code == 0, res.output
    assert "retrieval only" in res.output and "overall" in res.output and "OFFLINE" not in res.output
    bars = [line.split()[0] for line in res.output.splitlines() if "/" in line and "━" in line]
    assert bars == ["add", "search"], res.output  # no answer or judge bar at 0/0: no model is called
    run = json.loads((out / "run.json").read_text())
    assert run["retrieval_only"] is True and run["models"] == {} and run["offline_models"] is False
    overall = [r for r in json.loads((out / "results.json").read_text())["table"] if r["category"] == "overall"][0]
    scorable = run["dataset"]["scorable_questions"]
    assert overall["n_total"] == overall["n_retrieved"] == scorable > 100
    assert overall["n_excluded"] == run["dataset"]["excluded_questions"] > 0 and overall["coverage"] == 1.0
    assert 1 <= overall["memories_mean"] <= 100  # BM25 over one conversation's chunks, top_k 100
    q = read_questions(RunDir(out))
    assert sorted(set(q["status"].to_list())) == ["excluded", "retrieved"]
    retrieved = q.filter(pl.col("status") == "retrieved")
    assert retrieved["answer"].null_count() == retrieved.height and retrieved["verdict"].null_count() == retrieved.height
    assert (retrieved["n_memories"] == retrieved["memories"].list.len()).all()
    again = CliRunner().invoke(app, ["run", "--suite", "textual", "--retrieval-only", "--out", str(tmp_path / "s")])
    assert again.exit_code == 2 and "--retrieval-only runs one dataset" in again.output


def test_retrieval_only_status_follows_each_search():
    """A retrieval-only run ends at Search: ``retrieved`` where the Search succeeded, else ``search_error``
    (an error outcome and a missing one alike); a run with later stages leaves the status to them."""
    import pyarrow as pa

    from aml_ray.run.evidence import QUESTION_INPUT_COLUMNS, QUESTION_SCHEMA, SEARCH_SCHEMA
    from aml_ray.stages._common import searched_questions

    questions = pa.table({c: pa.nulls(3, QUESTION_SCHEMA.field(c).type) for c in QUESTION_INPUT_COLUMNS})
    search = pa.table({f.name: pa.nulls(3, f.type) for f in SEARCH_SCHEMA})
    search = search.set_column(search.schema.get_field_index("search_status"), "search_status",
                               pa.array(["ok", "error", None], pa.string()))
    final = searched_questions(questions, search, final=True)
    assert final.schema.equals(QUESTION_SCHEMA)
    assert final.column("status").to_pylist() == ["retrieved", "search_error", "search_error"]
    assert searched_questions(questions, search).column("status").to_pylist() == [None, None, None]
    assert searched_questions(questions.slice(0, 0), search.slice(0, 0), final=True).num_rows == 0


def test_an_offline_batch_is_filled_by_one_searched_sample(locomo_file):
    """Ray Data starts an Answer task once its rows reach the batch size (or upstream ends): with offline
    batches of 256, the searched questions of LoCoMo's first samples (81-199 scorable each) waited for more
    samples, and everything was answered after the last Search. Each sample now fills a batch alone."""
    from aml_ray.config import model_endpoint_from_env
    from aml_ray.run.pipeline import PipelineOptions

    scorable = [sum(q.get("category") != 5 for q in s["qa"]) for s in json.loads(locomo_file.read_text())]
    offline = model_endpoint_from_env("answer", {})
    assert offline.offline and PipelineOptions().model_batch_for(offline) <= min(scorable) == 81


def test_offline_models_inside_the_ingest_actor_give_the_same_rows_as_their_own_stages(tmp_path, locomo_file):
    """Both models offline: Answer and Judge run inside the Ingest actor (aml_ray.stages.ingest, issue 29: two
    actors and their Ray Data operators cost more CPU than the models). Every question's answer, context,
    verdict and F1 are those of the layout with Answer and Judge as operators of their own.

    With Ingest the only stage, the driver calls one Ingest actor itself: no Ray Data operator (``MapWorker``)
    is started for the run (aml_ray.run.pipeline._single_stage; Ray Data's executor and helper actors cost
    CPU a question and do nothing for one stage)."""
    import ray

    from aml_ray.run.pipeline import PipelineOptions

    columns = ["question_id", "status", "answer", "context_tokens", "memories_in_context", "verdict", "f1", "bleu1"]
    rows, started = {}, {}
    with ReferenceServer(tmp_path / "ref") as ref:
        for inline in (True, False):
            before = set(ray._private.state.actors())
            spec = ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url)
            result = evaluate(config(tmp_path / f"inline-{inline}", spec, locomo_file, limit_samples=1,
                                     options=PipelineOptions(models_inline=inline)))
            rows[inline] = read_questions(result.run_dir).select(columns).sort("question_id")
            started[inline] = {a["ActorClassName"] for aid, a in ray._private.state.actors().items() if aid not in before}
    assert rows[True].height == 199 and rows[True].filter(pl.col("status") == "scored").height == 152
    assert rows[True].equals(rows[False])
    assert "IngestFromFiles" in started[True] and not [c for c in started[True] if c.startswith("MapWorker(")]
    assert {"MapWorker(MapBatches(IngestFromFiles))", "MapWorker(MapBatches(AnswerJudgeStage))"} <= started[False], started


def test_a_driver_error_stops_the_single_stage_actor_at_once(tmp_path, locomo_file, monkeypatch):
    """An error in the driver's own loop (here: writing a task's rows) ends the run with the Ingest actor
    killed before the error reaches the caller, not whenever the traceback holding its generator is collected."""
    import ray

    import aml_ray.run.pipeline as pipeline

    def broken_append(self, batch):
        raise OSError("disk full (test)")

    monkeypatch.setattr(pipeline.BufferedQuestionWriter, "append", broken_append)
    before = set(ray._private.state.actors())
    with ReferenceServer(tmp_path / "ref") as ref:
        spec = ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url)
        with pytest.raises(StageFailed, match="disk full") as failed:
            evaluate(config(tmp_path / "run", spec, locomo_file, limit_samples=1, retrieval_only=True))
    deadline = time.monotonic() + 60  # ray.kill is asynchronous: the GCS records the death shortly after
    while True:
        ingest = [a for aid, a in ray._private.state.actors().items()
                  if aid not in before and a["ActorClassName"] == "IngestFromFiles"]
        if time.monotonic() > deadline or [a["State"] for a in ingest] == ["DEAD"]:
            break
        time.sleep(0.1)
    assert failed.value is not None  # the traceback (and the frames it holds) is still alive here
    assert len(ingest) == 1 and ingest[0]["State"] == "DEAD", ingest
