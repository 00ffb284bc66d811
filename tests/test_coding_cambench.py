"""CAMBench's shape (150 tasks x relevant/noisy = 300 scored attempts) and runs that could not run."""

from __future__ import annotations

import json

import polars as pl
import pytest
from typer.testing import CliRunner

from aml_ray.cli import app
from aml_ray.coding.cambench import CAMBENCH_ATTEMPTS, CAMBENCH_CONDITIONS, CAMBENCH_TASKS, load_cambench
from aml_ray.coding.cli import rates_table
from aml_ray.coding.scoring import memory_gain, resolved_rates, summary
from aml_ray.coding.swecontextbench import load_lite
from tests.conftest import SHARED_DATASETS


def test_the_generator_writes_a_150_task_cambench_file_that_loads(tmp_path):
    res = CliRunner().invoke(app, ["coding", "generate", str(tmp_path), "--tasks", "150", "--seed", "2"])
    assert res.exit_code == 0, res.output
    assert "wrote 150 tasks" in res.output
    bench = load_cambench(tmp_path / "cambench.jsonl", expect_tasks=CAMBENCH_TASKS)
    assert len(bench.tasks) == 150 and len({t.instance_id for t in bench.tasks}) == 150
    assert len({t.snapshot for t in bench.tasks}) == 150 and len(bench.repos()) == 4
    assert len(bench.tasks) * len(CAMBENCH_CONDITIONS) == CAMBENCH_ATTEMPTS == 300
    for task in bench.tasks:
        assert task.relevant and task.noisy and not set(task.relevant) & set(task.noisy)
        assert task.gold_patch and task.test_patch and (tmp_path / task.snapshot).is_dir()
    with pytest.raises(ValueError, match="149 tasks, expected 150"):
        lines = (tmp_path / "cambench.jsonl").read_text().splitlines()
        (tmp_path / "cambench.jsonl").write_text("\n".join(lines[:149]) + "\n")
        load_cambench(tmp_path, expect_tasks=150)


@pytest.mark.parametrize("change,message", [
    (lambda row: row.pop("conditions"), "field 'conditions' must be an object"),
    (lambda row: row["conditions"].update(noisy=[]), "conditions.noisy must be a non-empty list"),
    (lambda row: row["conditions"].update(baseline=["x"]), "exactly the keys"),
    (lambda row: row.pop("FAIL_TO_PASS"), "'FAIL_TO_PASS' is missing"),
])
def test_a_malformed_line_names_its_line_and_field(tmp_path, change, message):
    CliRunner().invoke(app, ["coding", "generate", str(tmp_path), "--tasks", "3"])
    path = tmp_path / "cambench.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    change(rows[1])
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(ValueError, match=message) as err:
        load_cambench(path)
    assert "cambench.jsonl line 2" in str(err.value)


def test_swecontextbench_lite_without_snapshots_is_not_run_never_zero():
    tasks = load_lite(SHARED_DATASETS / "swecontextbench" / "lite")
    attempts = pl.DataFrame([{"condition": c, "repo": t.repo, "status": "no_snapshot", "resolved": False}
                             for t in tasks for c in ("relevant", "noisy")])
    rates = resolved_rates(attempts)
    overall = rates.filter(pl.col("repo") == "overall")
    assert overall["status"].to_list() == ["not run", "not run"]
    assert overall["coverage"].to_list() == [0.0, 0.0] and overall["n_not_run"].to_list() == [99, 99]
    assert overall["resolved_rate"].to_list() == [None, None]
    gains = memory_gain(rates)
    assert gains["gain_vs_noisy"].null_count() == gains.height
    head = summary(attempts)
    assert head["gain_vs_noisy"] is None and head["conditions"]["relevant"]["status"] == "not run"
    table, gain_table = rates_table(rates, gains, "lite")
    cells = [str(c) for col in table.columns for c in col._cells] + \
        [str(c) for col in gain_table.columns for c in col._cells]
    assert "not run" in cells and "0.000 ± 0.000" not in cells and "+0.000" not in cells


def test_a_partly_run_group_rates_only_what_ran():
    attempts = pl.DataFrame([{"condition": "relevant", "repo": "a", "status": s, "resolved": r}
                             for s, r in (("scored", True), ("scored", False), ("no_snapshot", False))])
    row = resolved_rates(attempts).to_dicts()[0]
    assert row["resolved_rate"] == 0.5 and row["coverage"] == pytest.approx(2 / 3) and row["status"] == "scored"
