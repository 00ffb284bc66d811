"""Resume drill: kill the run's driver midway, resume it, compare with an uninterrupted run.

1. Two reference memory systems (A and B) on loopback.
2. ``aml-ray run`` against A in a subprocess; once some Add evidence and some question evidence exist,
   the driver process gets SIGKILL.
3. ``aml-ray run --resume RUN_DIR`` finishes it.
4. ``aml-ray run`` against B, uninterrupted.
5. Prints whether the final result tables and the participants' stored messages are identical, and how
   many Adds and Searches the resumed run sent.

    python scripts/drill_resume.py --data ../shared/datasets/locomo/locomo10.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aml_ray.reference.server import ReferenceServer

CLI = [sys.executable, "-m", "aml_ray.cli"]


def stored(ref: ReferenceServer) -> list[tuple[str, int]]:
    with sqlite3.connect(ref.db_path) as db:
        return sorted(db.execute("SELECT content, timestamp_ms FROM memories").fetchall())


def table(run_dir: Path) -> list[dict]:
    """The result table, floats rounded to 12 digits (sums over the same values in another order can
    differ in the last bit)."""
    return [{k: round(v, 12) if isinstance(v, float) else v for k, v in row.items()}
            for row in json.loads((run_dir / "results.json").read_text())["table"]]


def per_question(run_dir: Path) -> list[tuple]:
    from aml_ray.run.evidence import RunDir, read_questions

    q = read_questions(RunDir(run_dir)).sort("question_id")
    return list(zip(q["question_id"], q["answer"], q["verdict"], q["status"], q["n_memories"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--kill-after-samples", type=int, default=4,
                    help="kill once this many samples' Adds have finished (default 4)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="aml-resume-drill-"))
    env = {**os.environ, "RAY_TMPDIR": str(work / "ray")}
    with ReferenceServer(work / "ref-a") as ref_a, ReferenceServer(work / "ref-b") as ref_b:
        run1 = work / "interrupted"
        t0 = time.perf_counter()
        proc = subprocess.Popen([*CLI, "run", "--data", str(args.data), "--participant", ref_a.base_url,
                                 "--out", str(run1)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        questions = run1 / "evidence" / "questions"
        adds_dir = run1 / "evidence" / "adds"
        while proc.poll() is None and len(list(adds_dir.glob("*.parquet"))) < args.kill_after_samples:
            time.sleep(0.02)
        if proc.poll() is not None:
            sys.exit("the run finished before it could be killed; lower --kill-after-samples")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        killed_at = time.perf_counter() - t0
        adds_files = len(list((run1 / "evidence" / "adds").glob("*.parquet")))
        journals = len(list((run1 / "evidence" / "adds").glob("*.jsonl")))
        parts = len(list(questions.glob("part-*.parquet")))
        before = ref_a.stats()
        t1 = time.perf_counter()
        resumed = subprocess.run([*CLI, "run", "--resume", str(run1)], env=env, capture_output=True, text=True)
        if resumed.returncode != 0:
            sys.exit(f"resume failed:\n{resumed.stdout}\n{resumed.stderr}")
        resume_s = time.perf_counter() - t1
        after = ref_a.stats()
        run2 = work / "uninterrupted"
        clean = subprocess.run([*CLI, "run", "--data", str(args.data), "--participant", ref_b.base_url,
                                "--out", str(run2)], env=env, capture_output=True, text=True)
        if clean.returncode != 0:
            sys.exit(f"uninterrupted run failed:\n{clean.stdout}\n{clean.stderr}")
        same_table = table(run1) == table(run2)
        same_questions = per_question(run1) == per_question(run2)
        same_store = stored(ref_a) == stored(ref_b)
        info = json.loads((run1 / "run.json").read_text())
    print(f"killed the driver after {killed_at:.1f} s: {adds_files} samples' Adds finished, {journals} journals "
          f"under way, {parts} question evidence files")
    print(f"resume: {resume_s:.1f} s; Adds applied by the participant during resume: "
          f"{after['requests_applied'] - before['requests_applied']} new, "
          f"{after['duplicate_adds_acknowledged'] - before['duplicate_adds_acknowledged']} re-sent")
    print(f"resumed run status: {info['status']}, resumed_at: {info['resumed_at']}")
    print(f"result tables identical: {same_table}; per-question answers, verdicts and memory counts identical: "
          f"{same_questions} ({len(per_question(run1))} questions)")
    print(f"stored messages identical: {same_store} (A stores {after['memories']} messages, "
          f"{after['duplicate_messages']} duplicated)")
    print(f"work dir: {work}")
    sys.exit(0 if same_table and same_store and same_questions else 1)


if __name__ == "__main__":
    main()
