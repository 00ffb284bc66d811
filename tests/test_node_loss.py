"""A job survives the loss of a worker node (issue 6, item 4), on a two-node ``ray.cluster_utils.Cluster``.

The job runs in a subprocess (``scripts/node_loss_job.py``), because the test session keeps one
``ray.init`` per process (``tests/conftest.py``) and a Cluster needs its own. Every stage actor
is placed on the worker node, and the worker node is killed either while the Adds of both LoCoMo
conversations are under way (the chaos participant holds every reply ``slow_s``), or once the first
conversation's Adds are done, while its questions are being searched (the participant's concurrency is
lowered to 16 so Search lasts seconds). The GCS health check is shortened to 1 s x 3 misses so the loss
is noticed in about 3 s instead of Ray's default of about 15 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aml_ray.run.progress import ProgressBuffer, ProgressTracker

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "node_loss_job.py"
LOCOMO_FILE = REPO.parent / "shared" / "datasets" / "locomo" / "locomo10.json"


@pytest.mark.parametrize("when", [["--remove-after", "10"], ["--remove-at-stage", "add", "--max-in-flight", "16"]],
                         ids=["during-adds", "during-search"])
def test_job_survives_worker_node_loss(tmp_path, when):
    assert LOCOMO_FILE.is_file(), f"{LOCOMO_FILE} is missing"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--samples", "2", "--slow-s", "0.25",
                           "--health-check-ms", "1000", *when],
                          capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout[-3000:], proc.stderr[-3000:])
    print("\n".join(ln for ln in proc.stdout.splitlines() if " : " in ln))  # the figures, shown with -s
    res = json.loads(lines[-1][len("RESULT "):])
    assert res["watcher_error"] is None, res["watcher_error"]

    assert res["alive_nodes"] == [res["head_node"]] and res["node_dead_s"] is not None
    stages = {a["class"]: a for a in res["actors"]
              if a["class"] in ("IngestFromFiles", "AnswerJudgeStage") or a["class"].startswith("MapWorker(")}
    # both models offline: they answer and judge inside the Ingest actor (aml_ray.stages.ingest), the job's
    # only stage, which the driver calls without Ray Data (aml_ray.run.pipeline._single_stage)
    assert sorted(stages) == ["IngestFromFiles"], res["actors"]
    if "--remove-after" in when:
        # lost mid-Ingest: some Adds journalled, others still to send; the restarted Ingest sent them
        assert 10 <= res["rows_at_removal"] < res["chunks"] == 55
        assert res["recover_add_s"] is not None
        restarted = list(stages)
    else:
        # lost while the first conversation's questions were being searched (by its Ingest task)
        assert res["counts_at_removal"].get("add", 0) > 0 and res["counts_at_removal"].get("search", 0) == 0
        restarted = list(stages)
    # the stage actors that were alive on the worker node died with it and were restarted on the head
    for name in restarted:
        assert stages[name]["node"] == res["head_node"] and stages[name]["restarts"] >= 1, stages[name]
    # the job's shared actors stayed on the driver's node, never restarted
    shared = [a for a in res["actors"] if a["class"] in ("ParticipantClient", "ProgressHub")]
    assert len(shared) == 2 and all(a["node"] == res["head_node"] and a["restarts"] == 0 for a in shared), shared

    # the run completed with every scorable question scored, each question written once
    assert res["status"] == "completed"
    assert res["scored"] == res["scorable"] == 233 and res["excluded"] == 71
    assert res["question_rows"] == res["distinct_questions"] == 304
    # every Add recorded once, every message stored once (re-sent Adds are de-duplicated by request_id)
    assert res["add_rows"] == res["adds_ok"] == res["chunks"]
    assert res["probe_messages"] == 1
    assert res["duplicate_messages"] == 0 and res["memories"] == res["messages"] + res["probe_messages"]


def test_tracker_counts_a_rerun_sample_once():
    # a sample re-run by a restarted Ingest actor (or a resumed run) reports its Add total again
    t = ProgressTracker()
    t.set_done("add", "conv-26", 10)
    t.set_done("add", "conv-30", 27)
    t.set_done("add", "conv-26", 28)  # the re-run: the sample's total, not the 18 it sent itself
    t.set_done("add", "conv-26", 28)
    t.incr("search", 152)
    assert t.snapshot() == {"add": 55, "search": 152}
    t.set_done("add", "conv-26", 5)  # a late report from the lost attempt never lowers the count
    assert t.snapshot()["add"] == 55


class _Handle:
    """Stands for the tracker's actor handle: ``update.remote`` applies the call to a real tracker at once."""

    def __init__(self) -> None:
        self.tracker, self.calls = ProgressTracker(), 0
        self.update = self

    def remote(self, counts, totals) -> None:
        self.calls += 1
        self.tracker.update(counts, totals)


def test_progress_buffer_sends_one_update_per_interval_or_flush():
    now = [100.0]
    handle = _Handle()
    buf = ProgressBuffer(handle, interval_s=0.5, clock=lambda: now[0])
    buf.total("add", "conv-26", 10)  # the first report after a quiet spell goes at once
    assert handle.calls == 1 and handle.tracker.snapshot() == {"add": 10}
    buf.total("add", "conv-26", 28)
    buf.total("add", "conv-26", 20)  # a lower total never lowers the count
    buf.incr("search", 100)
    buf.incr("search", 52)
    assert handle.calls == 1  # kept: less than 0.5 s since the last send
    now[0] += 0.5
    buf.total("add", "conv-30", 27)  # due: everything kept goes in one call
    assert handle.calls == 2 and handle.tracker.snapshot() == {"add": 55, "search": 152}
    buf.incr("search", 8)
    buf.flush()
    buf.flush()  # nothing left: no call
    assert handle.calls == 3 and handle.tracker.snapshot() == {"add": 55, "search": 160}
    idle = ProgressBuffer(None, clock=lambda: now[0])  # no tracker: nothing kept, nothing sent
    idle.incr("search", 5)
    idle.total("add", "conv-26", 3)
    idle.flush()
    assert (dict(idle._counts), idle._totals) == ({}, {})
