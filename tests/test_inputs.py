"""Pipeline inputs built one sample at a time and spilled to Arrow IPC files (aml_ray.run.inputs, issue 7), and the
column-pruned evidence read the run's summary uses. No Ray: the LoCoMo file and Parquet only."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aml_ray.datasets.registry import get_dataset
from aml_ray.run.evidence import (QUESTION_INPUT_COLUMNS, QUESTION_SCHEMA, SUMMARY_COLUMNS, BufferedQuestionWriter, QuestionWriter, RunDir, empty_question_row,
                              read_questions, to_table, write_arrow_atomic)
from aml_ray.ids import IdScheme
from aml_ray.run.inputs import build_inputs, iter_excluded, iter_sample_rows, read_sample_files, sample_questions

IDS = IdScheme("run_t", "locomo")


@pytest.fixture(scope="module")
def samples(locomo_file):
    return get_dataset("locomo").load(locomo_file)


def test_one_file_per_sample_and_counts_only_in_memory(tmp_path, samples):
    inputs = build_inputs(samples[:2], IDS, out_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["excluded.parquet", "sample-000000.arrow",
                                                          "sample-000001.arrow"]
    # conv-26 (28 chunks, 152 scorable + 47 adversarial) and conv-30 (27 chunks, 81 + 24): from the file
    assert (inputs.n_samples, inputs.n_chunks, inputs.max_sample_chunks, inputs.n_messages) == (2, 55, 28, 788)
    assert (inputs.n_questions, inputs.n_scorable, inputs.n_excluded) == (304, 233, 71)
    assert (inputs.n_pending, inputs.n_excluded_pending) == (233, 71)
    assert inputs.by_category == {"1": 43, "2": 63, "3": 13, "4": 114, "5": 71}
    assert all(pa.ipc.open_file(p).read_all().num_rows == 1 for p in inputs.sample_paths())
    rows = list(iter_sample_rows(inputs))
    assert [r["sample_id"] for r in rows] == ["conv-26", "conv-30"]
    adds, meta = json.loads(rows[0]["adds_json"]), json.loads(rows[0]["add_meta_json"])
    assert len(adds) == 28 and adds[0]["request_id"] == "eval:run_t:locomo:conv-26:chunk-0"
    assert {a["user_id"] for a in adds} == {"eval:run_t:locomo:conv-26"}
    assert [m["chunk_index"] for m in meta] == list(range(28))
    assert meta[0]["session_index"] == 1 and meta[-1]["session_index"] == 19
    questions = rows[0]["questions"]
    assert len(questions) == 152 and not any(q["excluded"] for q in questions)
    assert set(questions[0]) == set(QUESTION_INPUT_COLUMNS)  # nothing a later stage fills
    table = sample_questions(read_sample_files([str(inputs.sample_path(0))]))
    assert table.column_names == list(QUESTION_INPUT_COLUMNS) and table.num_rows == 152
    assert table.column("ref").to_pylist() == [q["ref"] for q in questions]
    assert table.schema.field("step").type == QUESTION_SCHEMA.field("step").type
    excluded = list(iter_excluded(inputs))  # one row group per sample
    assert [t.num_rows for t in excluded] == [47, 24]
    assert {r["status"] for t in excluded for r in t.to_pylist()} == {"excluded"}
    assert {r["category"] for t in excluded for r in t.to_pylist()} == {"5"}
    with pytest.raises(IndexError, match="outside"):
        inputs.sample_row(2)


def test_sample_files_read_back_in_the_input_schema_whatever_their_column_order(tmp_path, samples):
    from aml_ray.run.inputs import SAMPLE_INPUT_SCHEMA

    inputs = build_inputs(samples[:2], IDS, out_dir=tmp_path / "in")
    first, second = (str(p) for p in inputs.sample_paths())
    table = read_sample_files([second])
    reordered = tmp_path / "reordered.arrow"
    write_arrow_atomic(table.select(list(reversed(table.column_names))), reordered)
    both = read_sample_files([first, str(reordered)])
    assert both.schema.equals(SAMPLE_INPUT_SCHEMA)
    assert both.column("sample_id").to_pylist() == ["conv-26", "conv-30"]
    assert both.slice(1).equals(read_sample_files([second]))
    assert read_sample_files([]).schema.equals(SAMPLE_INPUT_SCHEMA) and read_sample_files([]).num_rows == 0
    with pytest.raises(FileNotFoundError):
        read_sample_files([str(tmp_path / "gone.arrow")])
    parquet = tmp_path / "sample.parquet"  # not an Arrow IPC file (e.g. an input of an earlier version)
    pq.write_table(table, parquet)
    with pytest.raises(pa.ArrowInvalid):
        read_sample_files([str(parquet)])


def test_each_sample_is_on_disk_before_the_next_is_built(tmp_path, samples):
    seen = []

    def one_at_a_time():
        for s in samples[:3]:
            seen.append(sorted(p.name for p in tmp_path.glob("sample-*.arrow")))
            yield s

    inputs = build_inputs(one_at_a_time(), IDS, out_dir=tmp_path)
    assert seen == [[], ["sample-000000.arrow"], ["sample-000000.arrow", "sample-000001.arrow"]]
    assert inputs.n_samples == 3


def test_resume_rebuild_counts_done_questions_writes_none_and_drops_stale_files(tmp_path, samples):
    build_inputs(samples[:2], IDS, out_dir=tmp_path)
    (tmp_path / "sample-000007.parquet").write_bytes(b"PAR1")  # an earlier version's sample file: dropped too
    done = {q.question_id for q in samples[0].questions[:100]}  # 100 of conv-26's 199, the first are scorable
    again = build_inputs(samples[:1], IDS, out_dir=tmp_path, done_questions=done)
    # a one-sample rebuild: conv-30's file and the excluded file of the first build are gone
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["excluded.parquet", "sample-000000.arrow"]
    assert (again.n_questions, again.n_scorable, again.n_excluded) == (199, 152, 47)  # totals keep the done ones
    scorable_done = sum(1 for q in samples[0].questions[:100] if q.excluded_reason is None)
    row = again.sample_row(0)
    pending = row["questions"]
    assert again.n_pending == len(pending) == 152 - scorable_done
    assert not done & {q["question_id"] for q in pending}
    assert again.n_excluded_pending == sum(t.num_rows for t in iter_excluded(again)) == 47 - (100 - scorable_done)
    assert len(json.loads(row["adds_json"])) == 28  # Adds are always listed: the sample's journal decides
    everything = {q.question_id for q in samples[0].questions}
    last = build_inputs(samples[:1], IDS, out_dir=tmp_path, done_questions=everything)
    assert (last.n_pending, last.n_excluded_pending) == (0, 0) and list(iter_excluded(last)) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sample-000000.arrow"]


def test_streaming_rows_per_step(tmp_path, samples):
    inputs = build_inputs(samples[:1], IDS, out_dir=tmp_path, stream_checkpoints=[0.5, 1.0])
    questions = inputs.sample_row(0)["questions"]
    assert (inputs.n_questions, inputs.n_scorable, inputs.n_excluded) == (398, 304, 94)
    assert sorted({q["step"] for q in questions}) == [10, 19]  # 19 sessions: ceil(9.5) and 19
    assert {q["question_id"].rsplit("@", 1)[1] for q in questions} == {"10", "19"}
    assert inputs.by_category["5"] == 47  # each question once, whatever its steps
    with pytest.raises(ValueError, match="fractions in"):
        build_inputs(samples[:1], IDS, out_dir=tmp_path, stream_checkpoints=[1.5])


def _rows(n: int, start: int = 0) -> list[dict]:
    return [empty_question_row() | {"question_id": f"q{i}", "category": "1", "excluded": False, "status": "scored",
                                    "verdict": "CORRECT", "f1": 0.5, "answer": "long answer " * 50,
                                    "memories": [{"id": "m", "content": "memory " * 200}]}
            for i in range(start, start + n)]


def test_streamed_part_file_and_column_pruned_read(tmp_path):
    run_dir = RunDir(tmp_path)
    writer = QuestionWriter(run_dir)
    writer.write(iter([to_table(_rows(2), QUESTION_SCHEMA), to_table(_rows(1, 2), QUESTION_SCHEMA)]))
    writer.write(iter([]))  # nothing to write: no file
    writer.write(to_table(_rows(1, 3), QUESTION_SCHEMA))
    parts = sorted(run_dir.questions.glob("part-*.parquet"))
    assert [p.name for p in parts] == ["part-00000.parquet", "part-00001.parquet"] and writer.rows_written == 4
    assert pq.ParquetFile(parts[0]).metadata.num_row_groups == 2  # one row group per table, as they came
    small = read_questions(run_dir, columns=SUMMARY_COLUMNS)
    assert small.columns == list(SUMMARY_COLUMNS) and small["question_id"].to_list() == ["q0", "q1", "q2", "q3"]
    assert "memories" not in small.columns and "answer" not in small.columns
    assert read_questions(run_dir).select(SUMMARY_COLUMNS).equals(small)
    with pytest.raises(ValueError, match=r"no columns \['memory'\]"):
        read_questions(run_dir, columns=["memory"])


def test_buffered_writer_writes_by_rows_by_time_and_on_flush(tmp_path):
    run_dir = RunDir(tmp_path)
    now = [100.0]
    buffered = BufferedQuestionWriter(QuestionWriter(run_dir), min_rows=3, max_wait_s=2.0, clock=lambda: now[0])

    def files() -> list[int]:
        return [pq.ParquetFile(p).metadata.num_rows for p in sorted(run_dir.questions.glob("part-*.parquet"))]

    buffered.append(to_table(_rows(2), QUESTION_SCHEMA))
    assert files() == []  # 2 rows, 0 s: buffered
    buffered.append(to_table(_rows(1, 2), QUESTION_SCHEMA).select(list(reversed(QUESTION_SCHEMA.names))))
    assert files() == [3]  # min_rows reached: one part file, columns put back in schema order
    buffered.append(to_table(_rows(1, 3), QUESTION_SCHEMA))
    now[0] += 2.5
    buffered.append(to_table(_rows(1, 4), QUESTION_SCHEMA))  # 2.5 s since the last write: written at once
    assert files() == [3, 2]
    now[0] += 0.5
    buffered.append(to_table(_rows(1, 5), QUESTION_SCHEMA))
    buffered.append(QUESTION_SCHEMA.empty_table())
    assert files() == [3, 2]
    buffered.flush()
    buffered.flush()  # nothing left: no empty file
    assert files() == [3, 2, 1]
    assert read_questions(run_dir)["question_id"].to_list() == [f"q{i}" for i in range(6)]
