"""Resume and Streaming through Ray: a stopped run continues from its evidence without re-sending
finished Adds or questions and ends equal to an uninterrupted run; Streaming searches a question at
several ingestion steps."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime

import httpx
import polars as pl
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import model_endpoint_from_env
from aml_ray.run.evaluation import EvaluationConfig, evaluate
from aml_ray.run.evidence import AddJournal, EvidenceError, RunDir, finish_add_journals, read_adds, read_questions
from aml_ray.run.pipeline import StageFailed
from aml_ray.reference.server import ReferenceServer
from aml_ray.retry import RetryPolicy
from tests.servers import ThreadServer

pytestmark = pytest.mark.usefixtures("ray_session")
OFFLINE = {"answer": model_endpoint_from_env("answer", {}), "judge": model_endpoint_from_env("judge", {})}


class Proxy:
    """Forwards to the reference system, records every request_id, and can refuse one chunk with 400."""

    def __init__(self, upstream: str):
        self.fail_chunk: int | None = None
        self.away_chunks: set[int] = set()  # Adds answered 503 (retried, then given up): the participant is away
        self.away_queries: set[str] = set()  # Searches answered 503
        self.add_ids: list[str] = []
        self.search_refs: Counter[str] = Counter()
        self.app = FastAPI()

        @self.app.post("/add")
        async def add(request: Request):
            body = await request.json()
            probe = body["user_id"].endswith(":preflight")  # the run's pre-flight (aml_ray.run.preflight): not counted
            if not probe:
                self.add_ids.append(body["request_id"])
            if not probe and self.fail_chunk is not None and body["request_id"].endswith(f":chunk-{self.fail_chunk}"):
                return JSONResponse({"detail": {"reason": "scripted stop"}}, status_code=400)
            if not probe and int(body["request_id"].rsplit("-", 1)[1]) in self.away_chunks:
                return JSONResponse({"detail": "away"}, status_code=503)
            async with httpx.AsyncClient() as c:
                r = await c.post(f"{upstream}/add", json=body)
            return JSONResponse(r.json(), status_code=r.status_code)

        @self.app.post("/search")
        async def search(request: Request):
            body = await request.json()
            if not body["user_id"].endswith(":preflight"):
                self.search_refs[body["query"]] += 1
                if body["query"] in self.away_queries:
                    return JSONResponse({"detail": "away"}, status_code=503)
            async with httpx.AsyncClient() as c:
                r = await c.post(f"{upstream}/search", json=body)
            return JSONResponse(r.json(), status_code=r.status_code)


#: two attempts, milliseconds apart: a request to an away participant gives up at once
QUICK = RetryPolicy(max_attempts=2, backoff_base_s=0.01, backoff_max_s=0.05)


def config(out, url, locomo_file, **kw) -> EvaluationConfig:
    spec = ParticipantSpec(add_url=f"{url}/add", search_url=f"{url}/search", retry=QUICK)
    return EvaluationConfig(dataset="locomo", participant=spec,
                            out_dir=out, data_path=locomo_file, limit_samples=1, participant_label="proxy", **OFFLINE, **kw)


def stored(ref: ReferenceServer) -> list[tuple[str, int]]:
    """The participant's stored messages, without run-specific ids: (content, timestamp) sorted."""
    import sqlite3

    with sqlite3.connect(ref.db_path) as db:
        return sorted(db.execute("SELECT content, timestamp_ms FROM memories").fetchall())


@pytest.fixture(scope="module")
def clean(tmp_path_factory, locomo_file, ray_session):
    """An uninterrupted run of conv-26 through the proxy: ``(result, stored messages)``, shared by the tests
    that compare a resumed run with it."""
    tmp = tmp_path_factory.mktemp("clean")
    with ReferenceServer(tmp / "ref") as ref:
        with ThreadServer(Proxy(ref.base_url).app) as server:
            result = evaluate(config(tmp / "run", server.base_url, locomo_file))
        return result, stored(ref)


# stopped at chunk 10, the resumed run streams the 18 Adds left (add_stream); stopped at the last chunk,
# it sends the one Add left in a plain call (add_sample)
@pytest.mark.parametrize("stop", [10, 27])
def test_resume_continues_a_stopped_run_and_equals_an_uninterrupted_one(tmp_path, locomo_file, stop, clean):
    clean, stored_b = clean
    with ReferenceServer(tmp_path / "ref-a") as ref_a:
        proxy = Proxy(ref_a.base_url)
        with ThreadServer(proxy.app) as server:
            proxy.fail_chunk = stop
            # without the head start, which would send the refused Add once more before the Ingest stage
            # stops the run (aml_ray.run.head_start): the counts below are the Ingest stage's and the resume's
            with pytest.raises(StageFailed, match="HTTP 400"):
                evaluate(config(tmp_path / "run", server.base_url, locomo_file, head_start=False))
            run_dir = RunDir(tmp_path / "run")
            assert json.loads(run_dir.run_json.read_text())["status"] == "failed"
            assert [r["chunk_index"] for r in AddJournal(run_dir, "conv-26").rows()] == list(range(stop))
            proxy.fail_chunk = None
            resumed = evaluate(config(tmp_path / "run", server.base_url, locomo_file, resume=True))
        stored_a = stored(ref_a)
    # finished Adds were not sent again: the chunks before the stop once, the refused one twice (refused,
    # then sent again), the rest once
    counts = Counter(i.rsplit(":", 1)[1] for i in proxy.add_ids)
    assert counts[f"chunk-{stop}"] == 2 and all(counts[f"chunk-{i}"] == 1 for i in range(28) if i != stop)
    assert len(proxy.add_ids) == 29
    assert resumed.run_info["run_id"] == json.loads(run_dir.run_json.read_text())["run_id"]
    assert resumed.run_info["resumed_at"] and resumed.run_info["status"] == "completed"
    assert not run_dir.add_journal("conv-26").exists() and read_adds(run_dir).height == 28
    assert stored_a == stored_b and len(stored_a) == 419 + 1  # conv-26's messages and the pre-flight probe
    assert resumed.table.drop("dataset").equals(clean.table.drop("dataset"))
    cols = ["question_id", "answer", "verdict", "f1", "status"]
    assert resumed.questions.select(cols).sort("question_id").equals(clean.questions.select(cols).sort("question_id"))


def test_resume_sends_again_what_gave_up_while_the_participant_was_away(tmp_path, locomo_file, clean):
    """Two Adds and two Searches give up (503 until the retries ran out): the run ends partial. Its resume
    sends those Adds again, searches the sample's questions again on the now whole store, and ends equal
    to an uninterrupted run, question by question."""
    questions = [q["question"] for q in json.loads(locomo_file.read_text())[0]["qa"] if q.get("category") != 5]
    clean, stored_b = clean
    with ReferenceServer(tmp_path / "ref-a") as ref_a:
        proxy = Proxy(ref_a.base_url)
        with ThreadServer(proxy.app) as server:
            proxy.away_chunks, proxy.away_queries = {10, 11}, set(questions[:2])
            first = evaluate(config(tmp_path / "run", server.base_url, locomo_file))
            assert first.run_info["status"] == "partial"
            assert first.questions.filter(pl.col("status") == "search_error").height == 2
            searched_first = sum(proxy.search_refs.values())
            proxy.away_chunks, proxy.away_queries = set(), set()
            resumed = evaluate(config(tmp_path / "run", server.base_url, locomo_file, resume=True))
        stored_a = stored(ref_a)
    run_dir = first.run_dir
    counts = Counter(i.rsplit(":", 1)[1] for i in proxy.add_ids)
    # each away Add: two attempts that gave up, then once more on resume, with the same request_id
    assert counts["chunk-10"] == counts["chunk-11"] == 3 and all(counts[f"chunk-{i}"] == 1 for i in range(28) if i not in (10, 11))
    assert sum(proxy.search_refs.values()) - searched_first == 152  # the sample's every scorable question
    assert resumed.run_info["status"] == "completed"
    assert resumed.run_info["resumed_resends"] == [{"adds": 2, "samples": ["conv-26"], "questions": 152}]
    resent = [json.loads(line) for line in (run_dir.resent / "adds.jsonl").read_text().splitlines()]
    assert [(r["chunk_index"], r["status"], r["attempts"]) for r in resent] == [(10, "error", 2), (11, "error", 2)]
    adds = read_adds(run_dir)
    assert adds.height == 28 and adds["status"].unique().to_list() == ["ok"]
    assert stored_a == stored_b
    assert resumed.table.drop("dataset").equals(clean.table.drop("dataset"))
    cols = ["question_id", "answer", "verdict", "f1", "status", "n_memories"]
    assert resumed.questions.select(cols).sort("question_id").equals(clean.questions.select(cols).sort("question_id"))
    # the first attempt's rows stay in the part files; each question is read once, its latest row
    assert pl.concat([pl.read_parquet(p, columns=["question_id"]) for p in run_dir.questions.glob("*.parquet")]).height \
        == first.questions.height + 152
    assert read_questions(run_dir).height == first.questions.height == clean.questions.height


def test_resume_skips_finished_questions_and_refuses_damage(tmp_path, locomo_file):
    with ReferenceServer(tmp_path / "ref") as ref:
        proxy = Proxy(ref.base_url)
        with ThreadServer(proxy.app) as server:
            first = evaluate(config(tmp_path / "run", server.base_url, locomo_file))
            run_dir = first.run_dir
            with pytest.raises(ValueError, match="already completed"):
                evaluate(config(tmp_path / "run", server.base_url, locomo_file, resume=True))
            # simulate a kill after the evidence of half the questions was written
            info = json.loads(run_dir.run_json.read_text())
            info["status"] = "running"
            run_dir.run_json.write_text(json.dumps(info))
            parts = sorted(run_dir.questions.glob("part-*.parquet"))
            kept = read_questions(run_dir)
            assert len(parts) >= 2  # excluded rows first, then judged batches
            parts[-1].unlink()
            missing = kept.height - read_questions(run_dir).height
            assert missing > 0
            before = sum(proxy.search_refs.values())
            adds_before = len(proxy.add_ids)
            resumed = evaluate(config(tmp_path / "run", server.base_url, locomo_file, resume=True))
            assert len(proxy.add_ids) == adds_before  # every sample's Adds were already finished
            assert sum(proxy.search_refs.values()) - before == missing  # only the lost questions
            assert resumed.questions.height == kept.height
            with pytest.raises(ValueError, match="top_k: was 100, now 5"):
                info["status"] = "running"
                run_dir.run_json.write_text(json.dumps(info))
                evaluate(config(tmp_path / "run", server.base_url, locomo_file, resume=True, top_k=5))
            parts = sorted(run_dir.questions.glob("part-*.parquet"))
            parts[0].write_bytes(b"not parquet")
            with pytest.raises(EvidenceError, match="damaged"):
                evaluate(config(tmp_path / "run", server.base_url, locomo_file, resume=True))


def test_add_journal_tolerates_only_a_torn_last_line(tmp_path):
    run_dir = RunDir(tmp_path)
    journal = AddJournal(run_dir, "s1")
    journal.append({"chunk_index": 0})
    journal.append({"chunk_index": 1})
    with open(journal.path, "a") as fh:
        fh.write('{"chunk_ind')  # killed mid-write
    assert [r["chunk_index"] for r in journal.rows()] == [0, 1]
    journal.path.write_text('{"chunk_index": 0}\n{broken\n{"chunk_index": 2}\n')
    with pytest.raises(EvidenceError, match="line 2"):
        journal.rows()


def _add_row(sample_id: str, chunk_index: int) -> dict:
    return {"sample_id": sample_id, "chunk_index": chunk_index, "request_id": f"{sample_id}:chunk-{chunk_index}",
            "user_id": "u", "session_id": "s", "n_messages": 2, "n_words": 10, "request_sha256": "0" * 64,
            "status": "ok", "http_status": 200, "attempts": 1, "retried_statuses": [], "latency_ms": 20.0,
            "elapsed_ms": 20.5, "contract": "ok", "error": None}


def test_finish_add_journals_writes_each_sample_once_its_run_is_over(tmp_path):
    run_dir = RunDir(tmp_path)
    assert finish_add_journals(run_dir) == 0  # no Add yet: no folder, nothing to do
    for sample_id, chunks in (("conv-26", [1, 0, 2]), ("conv.30", [0])):  # a dot in the id stays in it
        journal = AddJournal(run_dir, sample_id)
        for i in chunks:
            journal.append(_add_row(sample_id, i))
    assert finish_add_journals(run_dir) == 2
    assert sorted(p.name for p in run_dir.adds.iterdir()) == ["conv-26.parquet", "conv.30.parquet"]
    adds = read_adds(run_dir)
    assert adds["request_id"].to_list() == ["conv-26:chunk-0", "conv-26:chunk-1", "conv-26:chunk-2", "conv.30:chunk-0"]
    assert finish_add_journals(run_dir) == 0  # done samples are not written again
    # a damaged journal (not only its last line) stops it, and its sample keeps the journal, no Parquet
    AddJournal(run_dir, "conv-41").path.write_text('{"chunk_index": 0}\n{broken\n{"chunk_index": 2}\n')
    with pytest.raises(EvidenceError, match="line 2"):
        finish_add_journals(run_dir)
    assert not run_dir.add_file("conv-41").exists() and run_dir.add_journal("conv-41").exists()


def test_streaming_searches_a_question_at_two_steps(tmp_path, locomo_file):
    with ReferenceServer(tmp_path / "ref") as ref:
        proxy = Proxy(ref.base_url)
        with ThreadServer(proxy.app) as server:
            result = evaluate(config(tmp_path / "run", server.base_url, locomo_file, stream_checkpoints=[0.5, 1.0]))
    q = result.questions.filter(~pl.col("excluded"))
    assert sorted(q["step"].unique().to_list()) == [10, 19]  # conv-26 has 19 sessions: ceil(9.5) and 19
    assert q.height == 2 * 152 and result.run_info["dataset"]["scorable_questions"] == 304
    # every question was searched once per step, with the memory written by then
    assert set(proxy.search_refs.values()) <= {2, 4} and sum(proxy.search_refs.values()) == 304
    sessions = json.loads(locomo_file.read_text())[0]["conversation"]
    cutoff = datetime.strptime(sessions["session_11_date_time"], "%I:%M %p on %d %B, %Y")
    early = q.filter(pl.col("step") == 10)
    latest = [max(m["created_at"] for m in mems) for mems in early["memories"].to_list() if mems]
    assert latest and all(datetime.fromisoformat(t.replace("Z", "")) < cutoff for t in latest)
    pairs = q.select("question", "step", "n_memories").sort("step").group_by("question", maintain_order=True)
    grew = sum(1 for _, g in pairs if g["n_memories"].to_list()[0] < g["n_memories"].to_list()[-1])
    assert grew > 0  # later steps retrieve from more memory
    table = result.questions.filter(~pl.col("excluded")).group_by("step").agg(pl.len())
    assert sorted(table["len"].to_list()) == [152, 152]
    # issue 25: one table per checkpoint, each of the fraction's step only (the main table pools them)
    by = result.run_info["by_checkpoint"]
    assert [c["fraction"] for c in by] == [0.5, 1.0]
    overall = [next(r for r in c["table"] if r["category"] == "overall") for c in by]
    assert [(o["n_total"], o["n_excluded"]) for o in overall] == [(152, 47), (152, 47)]
    pooled = next(r for r in result.table.to_dicts() if r["category"] == "overall")
    assert pooled["n_total"] == 304
    assert json.loads((tmp_path / "run" / "results.json").read_text())["by_checkpoint"] == by
