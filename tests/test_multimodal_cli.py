"""``aml-ray run --suite multimodal --data-dir DIR`` on small files in the releases' layouts (in-process, so the
session's Ray is used): Mem-Gallery's 20 scenario files under ``dialog/`` with ``image/`` beside them, and
ATM-Bench's ``data/`` tree with a ``{"qas": [...]}`` QA file, a photo without EXIF (``timestamp: null``), a BMP
photo, photos found by file stem and the Hard subset's NIAH pools. The reference system starts with content
parts enabled, every bundle runs, and the per-dataset and Overall tables print with coverage."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from aml_ray.cli import app
from aml_ray.run.evidence import RunDir, read_adds, read_questions
from tests.mm_fixtures import NIAH_POOLS, write_atmbench, write_memgallery_release

pytestmark = pytest.mark.usefixtures("ray_session")


def test_run_suite_multimodal_on_the_release_layouts(tmp_path, monkeypatch):
    for var in ("ANSWER_API_BASE", "JUDGE_API_BASE", "AML_DATASETS_DIR"):
        monkeypatch.delenv(var, raising=False)  # the offline answerer and judge: no network
    root = tmp_path / "datasets"
    write_memgallery_release(root / "memgallery")
    write_atmbench(root / "atmbench", release=True)
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

    # Mem-Gallery: the first scenario by name, its rounds with their images (stored once by hash)
    mg = RunDir(out / "memgallery")
    assert read_adds(mg)["n_messages"].sum() == 6 and len(list((out / "memgallery" / "media").iterdir())) == 4
    assert {r["category"] for r in read_questions(mg).to_dicts()} == {"VR", "VS"}
    # ATM-Bench: every item Added (the undated photo and the BMP one too), the qas object's three questions
    atm = RunDir(out / "atmbench")
    assert read_adds(atm)["n_messages"].sum() == 7 and len(read_questions(atm)) == 3
    # Hard: its question over the NIAH pool of 200 (not an oracle of its one evidence item)
    hard = RunDir(out / "atmbench_hard")
    assert read_adds(hard)["n_messages"].sum() == len(NIAH_POOLS[200]) and len(read_questions(hard)) == 1
