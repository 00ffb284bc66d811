"""``aml-ray run --suite multimodal --data-dir DIR`` on small files in the suite's layout (in-process, so the
session's Ray is used): the reference system starts with content parts enabled, every bundle runs, and
the per-dataset and Overall tables print with coverage."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from aml_ray.cli import app
from tests.mm_fixtures import write_atmbench, write_memgallery

pytestmark = pytest.mark.usefixtures("ray_session")


def test_run_suite_multimodal_with_data_dir(tmp_path, monkeypatch):
    for var in ("ANSWER_API_BASE", "JUDGE_API_BASE", "AML_DATASETS_DIR"):
        monkeypatch.delenv(var, raising=False)  # the offline answerer and judge: no network
    root = tmp_path / "datasets"
    write_memgallery(root / "memgallery")
    write_atmbench(root / "atmbench")
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", "--suite", "multimodal", "--data-dir", str(root), "--participant",
                                   "reference:bm25", "--limit-samples", "1", "--top-k", "10", "--out", str(out)])
    assert res.exit_code == 0, res.output
    text = res.output
    for title in ("memgallery: Mem-Gallery (memgallery_f1)", "atmbench: ATM-Bench (atmbench_qs)",
                  "atmbench_hard: ATM-Bench-Hard (atmbench_qs)", "Overall: suite multimodal"):
        assert title in text, text
    assert text.count("coverage") >= 4 and "3 dataset(s)" in text and "OFFLINE" in text
    assert "dataset files are not pinned" in " ".join(text.split())  # unpinned bundles run and are reported
    suite = json.loads((out / "suite.json").read_text())
    ran = {b["name"]: b for b in suite["bundles"]}
    assert sorted(ran) == ["atmbench", "atmbench_hard", "memgallery"]
    assert all(b["status"] == "ran" and b["coverage"] == 1.0 for b in ran.values()), ran
    assert suite["overall"]["datasets"] == 3 and suite["overall"]["coverage"] == 1.0
    # the images went through the participant: stored once by hash in each run's media folder
    assert any((out / "memgallery" / "media").iterdir())
    assert (out / "atmbench" / "run.json").is_file()
