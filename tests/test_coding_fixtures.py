"""The offline fixture generator, the bench folder format and the ``aml-ray coding`` commands."""

from __future__ import annotations

import filecmp

import pytest
from typer.testing import CliRunner

from aml_ray.cli import app
from aml_ray.coding.bench import load_bench
from aml_ray.coding.fixtures import generate_bench
from aml_ray.coding.trajectories import add_requests, sample_id
from aml_ray.ids import IdScheme


def _same_tree(a, b) -> bool:
    cmp = filecmp.dircmp(a, b)
    if cmp.left_only or cmp.right_only or cmp.diff_files or cmp.funny_files:
        return False
    return all(_same_tree(a / d, b / d) for d in cmp.common_dirs)


def test_same_seed_same_bytes_other_seed_other_values(tmp_path):
    generate_bench(tmp_path / "a", n_repos=4, seed=11)
    generate_bench(tmp_path / "b", n_repos=4, seed=11)
    generate_bench(tmp_path / "c", n_repos=4, seed=12)
    assert _same_tree(tmp_path / "a", tmp_path / "b")
    assert not _same_tree(tmp_path / "a", tmp_path / "c")
    with pytest.raises(ValueError, match="n_repos"):
        generate_bench(tmp_path / "d", n_repos=5)


def test_generated_tasks_keep_the_clue_in_relevant_memory_only(tmp_path):
    bench, keys = generate_bench(tmp_path, n_repos=4, seed=5)
    assert bench.name == "cambench-local" and len(bench.repos()) == 4
    assert load_bench(tmp_path / "bench.json").tasks == bench.tasks
    for task, key in zip(bench.tasks, keys):
        assert task.relevant == key.relevant and task.noisy == key.noisy and len(task.noisy) == 2
        assert key.clue not in task.problem_statement
        assert any(key.clue in turn.content for turn in bench.trajectories[key.relevant[0]].turns)
        for tid in task.noisy:
            assert all(key.clue not in turn.content for turn in bench.trajectories[tid].turns)
        assert task.gold_patch == key.fix_diff and "/dev/null" in task.test_patch
        assert all(t.startswith("tests/test_regression.py::") for t in task.fail_to_pass)
        assert all(t.startswith("tests/test_core.py::") for t in task.pass_to_pass)
        assert not (tmp_path / task.snapshot / "tests" / "test_regression.py").exists()  # hidden tests


def test_one_session_per_trajectory_chunked_by_the_textual_rule(tmp_path):
    bench, _ = generate_bench(tmp_path, n_repos=1, seed=1)
    task = bench.tasks[0]
    ids = IdScheme("run_x", bench.name)
    sid = sample_id(task.instance_id, "noisy")
    requests, meta = add_requests(ids, sid, bench.memory(task, "noisy"))
    sessions = [r.session_id for r in requests]
    assert sessions == sorted(set(sessions), key=sessions.index)  # contiguous, in memory-set order
    assert {s.rsplit(":", 1)[1] for s in sessions} == set(task.noisy)
    assert all(r.user_id == f"eval:run_x:cambench-local:{task.instance_id}.noisy" for r in requests)
    assert [m["chunk_index"] for m in meta] == list(range(len(requests)))
    rel, _ = add_requests(ids, sample_id(task.instance_id, "relevant"), bench.memory(task, "relevant"))
    assert len(rel) >= 2 and [len(r.messages) for r in rel][0] == 20
    assert bench.memory(task, "baseline") == []


def test_cli_generate_and_run_needs_an_answer_model(tmp_path, monkeypatch):
    runner = CliRunner()
    out = tmp_path / "bench"
    res = runner.invoke(app, ["coding", "generate", str(out), "--repos", "2", "--seed", "3"])
    assert res.exit_code == 0, res.output
    assert "wrote 2 tasks" in res.output and (out / "bench.json").is_file()
    monkeypatch.delenv("ANSWER_API_BASE", raising=False)
    res = runner.invoke(app, ["coding", "run", "--bench", str(out), "--out", str(tmp_path / "run"),
                              "--participant", "http://127.0.0.1:9"])
    assert res.exit_code == 2 and "ANSWER_API_BASE" in res.output
    res = runner.invoke(app, ["coding", "run"])
    assert res.exit_code == 2 and "exactly one of --bench, --cambench and --swecontextbench" in res.output
