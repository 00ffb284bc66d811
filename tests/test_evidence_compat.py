"""Evidence written before a column existed stays readable (resume, rejudge and reports of older runs)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from aml_ray.run.evidence import QUESTION_SCHEMA, RunDir, empty_question_row, read_questions


def test_a_question_file_without_a_newer_column_reads_it_as_null(tmp_path):
    run_dir = RunDir(tmp_path / "run")
    run_dir.questions.mkdir(parents=True)
    row = {**empty_question_row(), "question_id": "q1", "status": "scored", "judge_raw": "CORRECT"}
    old_schema = pa.schema([f for f in QUESTION_SCHEMA if f.name != "judge_raw_all"])
    pq.write_table(pa.Table.from_pylist([row], schema=old_schema), run_dir.questions / "part-000000.parquet")
    q = read_questions(run_dir)
    assert q.columns == QUESTION_SCHEMA.names
    assert q.row(0, named=True)["question_id"] == "q1" and q["judge_raw_all"].to_list() == [None]
    assert read_questions(run_dir, columns=("question_id", "judge_raw_all")).to_dicts() == \
        [{"question_id": "q1", "judge_raw_all": None}]
