"""What a resume does again (aml_ray.run.reopen) and the evidence reads it relies on: each question's latest
row, Adds that gave up taken out of the evidence only once the resume is accepted, part file numbering."""

from __future__ import annotations

import json

from aml_ray.run.evidence import (QUESTION_SCHEMA, AddJournal, QuestionWriter, RunDir, finish_add_journals,
                                  iter_question_rows, read_adds, read_questions, to_table)
from aml_ray.run.reopen import plan_reopen


def add_row(sample_id: str, chunk: int, status: str = "ok") -> dict:
    return {"sample_id": sample_id, "chunk_index": chunk, "request_id": f"run:{sample_id}:chunk-{chunk}",
            "user_id": f"u-{sample_id}", "session_id": "s", "n_messages": 2, "n_words": 10,
            "request_sha256": "0" * 64, "status": status, "http_status": 200 if status == "ok" else 503,
            "attempts": 1 if status == "ok" else 6, "retried_statuses": [] if status == "ok" else [503] * 6,
            "latency_ms": 20.0, "elapsed_ms": 20.5, "contract": None,
            "error": None if status == "ok" else "gave up after 6 attempts: HTTP 503"}


def question_rows(sample_id: str, n: int, *, status: str = "ok", search_status: str | None = "ok",
                  excluded: bool = False, answer: str = "a") -> list[dict]:
    return [{"dataset": "locomo", "sample_id": sample_id, "question_id": f"{sample_id}:q{i}", "excluded": excluded,
             "search_status": search_status, "status": status, "answer": answer} for i in range(n)]


def write_part(run_dir: RunDir, rows: list[dict]) -> None:
    QuestionWriter(run_dir).write(to_table(rows, QUESTION_SCHEMA))


def test_each_question_is_read_once_its_latest_row(tmp_path):
    run_dir = RunDir(tmp_path)
    write_part(run_dir, question_rows("s1", 3, answer="first"))
    write_part(run_dir, question_rows("s2", 2))
    write_part(run_dir, question_rows("s1", 2, answer="again"))  # s1:q0 and s1:q1 done again
    latest = read_questions(run_dir, columns=("answer",))
    assert latest.columns == ["answer"] and latest.height == 5
    both = dict(read_questions(run_dir, columns=("question_id", "answer")).iter_rows())
    assert both == {"s1:q0": "again", "s1:q1": "again", "s1:q2": "first", "s2:q0": "a", "s2:q1": "a"}
    files = sorted(run_dir.questions.glob("*.parquet"))
    streamed = {r["question_id"]: r["answer"] for r in iter_question_rows(files, ("question_id", "answer"))}
    assert streamed == both and len(list(iter_question_rows(files, ("answer",)))) == 5


def test_a_part_lost_from_the_middle_never_gets_a_later_part_overwritten(tmp_path):
    run_dir = RunDir(tmp_path)
    for sample in ("s1", "s2", "s3"):
        write_part(run_dir, question_rows(sample, 1))
    (run_dir.questions / "part-00001.parquet").unlink()
    write_part(run_dir, question_rows("s4", 1))
    assert sorted(p.name for p in run_dir.questions.iterdir()) == ["part-00000.parquet", "part-00002.parquet",
                                                                    "part-00003.parquet"]
    assert sorted(read_questions(run_dir)["sample_id"].to_list()) == ["s1", "s3", "s4"]


def test_plan_reopen_redoes_what_gave_up_and_changes_nothing_until_applied(tmp_path):
    run_dir = RunDir(tmp_path)
    for chunk, status in enumerate(["ok", "error", "ok", "error"]):  # s1: two Adds gave up
        AddJournal(run_dir, "s1").append(add_row("s1", chunk, status))
    for chunk in range(2):
        AddJournal(run_dir, "s.2").append(add_row("s.2", chunk))
    finish_add_journals(run_dir)  # a finished run: Parquet evidence only
    write_part(run_dir, question_rows("s1", 3))
    write_part(run_dir, [{**r, "question_id": "s1:excluded", "status": "excluded", "search_status": None,
                          "excluded": True} for r in question_rows("s1", 1)])
    write_part(run_dir, question_rows("s.2", 2)[:1] + question_rows("s.2", 2, status="search_error",
                                                                     search_status="error")[1:])
    before = {p.name: p.read_bytes() for p in run_dir.adds.iterdir()}

    plan = plan_reopen(run_dir)
    assert plan.describe() == {"adds": 2, "samples": ["s1"], "questions": 4}  # s1's 3 scorable, s.2:q1's Search
    assert plan.done_questions == {"s1:excluded", "s.2:q0"}
    assert {p.name: p.read_bytes() for p in run_dir.adds.iterdir()} == before  # a plan reads only

    plan.apply(run_dir)
    assert not run_dir.add_file("s1").exists() and run_dir.add_file("s.2").exists()
    assert [(r["chunk_index"], r["status"]) for r in AddJournal(run_dir, "s1").rows()] == [(0, "ok"), (2, "ok")]
    resent = [json.loads(line) for line in (run_dir.resent / "adds.jsonl").read_text().splitlines()]
    assert [(r["request_id"], r["error"]) for r in resent] == [
        ("run:s1:chunk-1", "gave up after 6 attempts: HTTP 503"), ("run:s1:chunk-3", "gave up after 6 attempts: HTTP 503")]
    # the resumed run sends them again and they succeed: nothing is left to redo
    for chunk in (1, 3):
        AddJournal(run_dir, "s1").append(add_row("s1", chunk))
    finish_add_journals(run_dir)
    write_part(run_dir, question_rows("s1", 3) + question_rows("s.2", 2)[1:])
    assert read_adds(run_dir).filter(read_adds(run_dir)["sample_id"] == "s1")["chunk_index"].to_list() == [0, 1, 2, 3]
    again = plan_reopen(run_dir)
    assert again.describe() == {"adds": 0, "samples": [], "questions": 0} and len(again.done_questions) == 6
