"""``aml-ray --help`` is fast (no heavy imports before a command runs) and readable at 80 columns."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

#: Modules that cost a second or more to import together; none is needed to print help.
HEAVY = ("ray", "pyarrow", "polars", "sqlalchemy", "alembic", "bpe_openai", "openai", "aiohttp", "fastapi")

PROBE = """
import sys
from aml_ray.cli import app
try:
    app({args!r}, prog_name="aml-ray")
except SystemExit:
    pass
print("LOADED", *sorted(m for m in {heavy!r} if m in sys.modules))
"""


def help_output(*args: str) -> tuple[str, list[str]]:
    """``aml-ray ARGS`` in a fresh interpreter at 80 columns: (its output, heavy modules it loaded)."""
    code = PROBE.format(args=list(args), heavy=HEAVY)
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb"}
    res = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env, timeout=60)
    assert res.returncode == 0, res.stdout
    text, _, loaded = res.stdout.rpartition("LOADED")
    return text, loaded.split()


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["coding", "--help"], ["check", "--help"],
                                  ["cluster", "--help"]])
def test_help_loads_no_heavy_module(args):
    _, loaded = help_output(*args)
    assert loaded == [], f"aml-ray {' '.join(args)} imported {loaded}: import them inside the command"


def test_the_usage_line_and_an_unknown_option_read_as_the_command():
    text, _ = help_output("run", "--help")
    assert text.startswith("Usage: aml-ray run [OPTIONS]"), text
    text, _ = help_output("run", "--bogus")
    assert "Error: No such option: --bogus. 'aml-ray run --help' lists the options." in text, text
    text, _ = help_output("cluster", "--help")
    assert "up" in text and "down" in text and "status" in text, text


def test_run_help_fits_80_columns_with_whole_option_names():
    text, _ = help_output("run", "--help")
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "…" not in text, text
    for name in ("--allow-hash-mismatch", "--answer-prompt-sha256", "--judge-prompt-sha256", "--datasets-dir",
                 "--stream-checkpoints", "--retrieval-only", "--limit-samples", "--verbose"):
        assert name in text, f"{name} missing or cut:\n{text}"


#: The evidence-recall table, one dataset's suite table and the suite's Overall table, printed as ``aml-ray run``
#: prints them: through the command line's console (realistic rows: the real recall_table and aggregate).
TABLES = """
import random
from types import SimpleNamespace

import polars as pl

from aml_ray.cli_common import console
from aml_ray.cli_tables import render_recall_table
from aml_ray.datasets.registry import DATASETS
from aml_ray.run.suite_run import BundleOutcome, overall_of
from aml_ray.scoring.aggregate import aggregate
from aml_ray.scoring.evidence_recall import KS, recall_table
from aml_ray.suite import load_suite
from aml_ray.suite_cli import dataset_table, overall_table

rng = random.Random(7)
names = DATASETS["locomo"].category_names
per_question = []
for i in range(400):
    recall = {k: rng.random() for k in KS}
    per_question.append({"category": str(1 + i % 4), "n_evidence": 2, "n_unresolved": 0,
                         "first_rank": 1 + i % 37, **{f"recall@{k}": v for k, v in recall.items()},
                         **{f"recall_exact@{k}": v / 2 for k, v in recall.items()}})
console.print(render_recall_table(recall_table(per_question), category_names=names))
questions = pl.DataFrame({"dataset": ["locomo"] * 400, "category": [str(1 + i % 5) for i in range(400)],
                          "excluded": [i % 5 == 4 for i in range(400)],
                          "status": ["excluded" if i % 5 == 4 else "search_error" if i % 97 == 0 else "scored"
                                     for i in range(400)],
                          "verdict": ["CORRECT" if rng.random() < 0.6 else "WRONG" for _ in range(400)],
                          "f1": [rng.random() for _ in range(400)], "bleu1": [rng.random() for _ in range(400)]})
table = aggregate(questions)
suite = load_suite("textual")
ran = BundleOutcome("locomo", "locomo", "LoCoMo", "ran", result=SimpleNamespace(table=table), score=0.61,
                    score_se=0.027, coverage=0.99, n_total=320, n_scored=316,
                    credits=[1.0] * 195 + [0.0] * 125)
outcomes = [ran, BundleOutcome("longmemeval_s", "longmemeval", "LongMemEval-S", "skipped",
                               reason="absent: longmemeval_s.json not found under the datasets directory"),
            BundleOutcome("beam_100k", "beam", "BEAM 100K", "failed",
                          reason="refused: beam_100k.json sha256 differs from the pin (a6f3e2...)")]
console.print(dataset_table(ran, suite.bundle("locomo"), names, offline=True))
console.print(overall_table(SimpleNamespace(suite=suite, outcomes=outcomes, overall=overall_of(outcomes)),
                            offline=True))
"""


def tables_output(columns: str | None) -> str:
    """The :data:`TABLES` in a fresh interpreter, stdout a pipe (not a terminal), with ``COLUMNS`` set or unset."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | ({"COLUMNS": columns} if columns else {})
    res = subprocess.run([sys.executable, "-c", TABLES], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_recall_and_suite_tables_fit_the_columns_given():
    """COLUMNS=80 is the width even when the output is a pipe or a file (it was 120 there, whatever COLUMNS
    said); without COLUMNS such output keeps 120 columns."""
    text = tables_output("80")
    for title in ("evidence recall", "locomo: LoCoMo", "Overall: suite textual"):
        assert title in text, text
    assert max(len(line) for line in text.splitlines()) <= 80, text
    wide = tables_output(None)
    assert 80 < max(len(line) for line in wide.splitlines()) <= 120, wide
