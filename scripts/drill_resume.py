"""Resume drill: kill the run's driver midway (or take its participant away), resume it, compare with an
uninterrupted run.

1. Two reference memory systems (A and B) on loopback.
2. ``aml-ray run`` against A in a subprocess; once some samples' Adds have finished, the driver process
   gets SIGKILL. With ``--away-s S`` the driver lives on and participant A goes away instead: it is stopped
   for S seconds, then started again on the same port and database; the requests sent meanwhile give up
   after their retries, and the run ends on its own (partial, or failed by the failure budget).
3. ``aml-ray run --resume RUN_DIR`` finishes it.
4. ``aml-ray run`` against B, uninterrupted.
5. Prints whether the final result tables, the per-question results and the participants' stored
   messages are identical, and how many Adds the resumed run sent.

    python scripts/drill_resume.py --data ../shared/datasets/locomo/locomo10.json
    python scripts/drill_resume.py --data ../shared/datasets/locomo/locomo10.json --away-s 30
"""

from __future__ import annotations

import argparse
import contextlib
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


def stored(ref) -> list[tuple[str, int]]:
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


class AwayParticipant:
    """The reference system as a subprocess on a fixed loopback port, which can go away and come back with
    its database (an outside participant that restarts)."""

    def __init__(self, directory: Path):
        import socket

        self.directory, self.db_path = directory, directory / "reference.sqlite3"
        directory.mkdir(parents=True, exist_ok=True)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "aml_ray.reference", "--port", str(self.port),
                                      "--db", str(self.db_path), "--parent-pid", str(os.getpid())],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("READY "):
            sys.exit(f"the away participant did not start: {line!r}")

    def stop(self) -> None:
        """SIGKILL: a graceful stop would finish the requests of the client's busy keep-alive connections."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=30)
            self.proc = None

    def stats(self) -> dict:
        import httpx

        return httpx.get(f"{self.base_url}/stats", timeout=10.0).json()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--kill-after-samples", type=int, default=4,
                    help="stop once this many samples' Adds have finished (default 4)")
    ap.add_argument("--away-s", type=float, default=None,
                    help="take the participant away for this many seconds instead of killing the driver")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="aml-resume-drill-"))
    env = {**os.environ, "RAY_TMPDIR": str(work / "ray")}
    away = AwayParticipant(work / "ref-a") if args.away_s is not None else None
    with contextlib.ExitStack() as stack:
        if away is not None:
            away.start()
            stack.callback(away.stop)
            ref_a = away
        else:
            ref_a = stack.enter_context(ReferenceServer(work / "ref-a"))
        ref_b = stack.enter_context(ReferenceServer(work / "ref-b"))
        run1 = work / "stopped"
        t0 = time.perf_counter()
        proc = subprocess.Popen([*CLI, "run", "--data", str(args.data), "--participant", ref_a.base_url,
                                 "--out", str(run1)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        adds_dir = run1 / "evidence" / "adds"

        def finished_samples() -> int:  # a sample's journal holds all its chunks (28+ each in LoCoMo) once done
            return sum(len(p.read_text().splitlines()) >= 28 for p in adds_dir.glob("*.jsonl")) \
                + len(list(adds_dir.glob("*.parquet")))

        while proc.poll() is None and finished_samples() < args.kill_after_samples:
            time.sleep(0.02)
        if proc.poll() is not None:
            sys.exit("the run finished before it could be stopped; lower --kill-after-samples")
        if away is None:
            os.kill(proc.pid, signal.SIGKILL)
            what = "killed the driver"
        else:
            away.stop()
            time.sleep(args.away_s)
            away.start()
            what = f"took the participant away for {args.away_s:.0f} s"
        proc.wait()
        stopped_at = time.perf_counter() - t0
        first = json.loads((run1 / "run.json").read_text())
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
    overall = [r for r in table(run1) if r["category"] == "overall"]
    print(f"{what} after {stopped_at:.1f} s; the first run ended {first['status']}: {first.get('error', '')}")
    print(f"resume: {resume_s:.1f} s; Adds applied by the participant during resume: "
          f"{after['requests_applied'] - before['requests_applied']} new, "
          f"{after['duplicate_adds_acknowledged'] - before['duplicate_adds_acknowledged']} re-sent; "
          f"resumed_resends: {info.get('resumed_resends')}")
    print(f"resumed run status: {info['status']}, resumed_at: {info['resumed_at']}; overall: "
          f"{overall[0]['accuracy'] if overall else None}")
    print(f"result tables identical: {same_table}; per-question answers, verdicts and memory counts identical: "
          f"{same_questions} ({len(per_question(run1))} questions)")
    print(f"stored messages identical: {same_store} (A stores {after['memories']} messages, "
          f"{after['duplicate_messages']} duplicated)")
    print(f"work dir: {work}")
    sys.exit(0 if same_table and same_store and same_questions else 1)


if __name__ == "__main__":
    main()
