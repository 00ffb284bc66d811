"""What a real evaluation costs (issue 29): ``scripts/bench_pipeline.py --mode serial`` runs this.

For each participant, the real command (``aml-ray run --dataset locomo --limit-samples N``, offline
answerer and judge) in its own process, against a loopback participant in another
(``scripts/loopback_servers.py``):

- ``serial``: serves ONE request at a time (``--capacity 1``), Search ``35 ms`` and Add ``300 ms`` by
  default (the service times measured on a real third-party system, mem0 with local embeddings), times
  ``--service-scale`` (e.g. 0.1 for a quick run);
- ``fast``: serves all it is sent, ``--latency-ms`` (20 ms) for both kinds, declared ``--concurrency``.

Printed per participant, with the machine's load average (``os.getloadavg``) and its speed
(:func:`machine_speed`) at the start and end:

- wall time of the whole command and the participant's *busy-time bound*: for the serial participant
  the sum of its service times over the requests it served (it can do nothing faster); for the fast one
  the lower bound the declared limits allow (``bench_pipeline.lower_bound``: the longest sample's
  Adds in order, or the participant's capacity);
- command-to-first-Add (the process start to the first Add of the run reaching the participant; the
  pre-flight's probe Add is the one before it, also printed) and last-Search-to-exit (the last Search's
  arrival to the command's exit);
- aml-ray's CPU-seconds, per question: the whole command (its process and every descendant: the
  driver, Ray's GCS, raylet and workers; the larger of ``os.wait4``'s rusage, which counts reaped
  descendants only, and psutil's last look at each process of the tree),
  and at full rate (the process tree's CPU between the first and last Search arrival, sampled with
  psutil every 100 ms, over the Searches in that window);
- run.json's Search latency p50 (time at the participant), queue wait p50 and the adaptive limit's
  min/max/final;
- a peer-style harness in the same run against the same server: one plain sequential loop (every Add
  of every sample in order, then each question's Search and the offline extractive answer), its wall
  time and CPU-seconds per question. Measured twice: the loop alone, inside this process, with the
  dataset already loaded (``peer loop``); and as a command of its own like aml-ray's (``peer
  command``: ``python scripts/bench_serial.py peer URL SAMPLES OUT``, from its start to its exit: the
  interpreter, its imports, loading the dataset, the loop, the offline lexical judge and F1 of every
  answer, and its results written as JSON). aml-ray's wall is a whole command's, so the second is the
  like-for-like comparison; both are printed.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LOCOMO = Path("/work/shared/datasets/locomo/locomo10.json")
SEARCH_MS, ADD_MS = 35.0, 300.0


class TreeCpu:
    """CPU-seconds of a process and its descendants over time (psutil, every ``interval_s``)."""

    def __init__(self, pid: int, interval_s: float = 0.1):
        import psutil

        self.root = psutil.Process(pid)
        self.interval_s = interval_s
        self.seen: dict[int, tuple[str, float]] = {}  # pid -> (name, cpu seconds at its last look)
        self.series: list[tuple[float, float]] = []  # (time.monotonic, total CPU seconds so far)
        self.snapshots: list[tuple[float, dict[int, float]]] = []  # (time.monotonic, pid -> CPU seconds so far)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "TreeCpu":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                break
            for p in procs:
                try:
                    t = p.cpu_times()
                    known = self.seen.get(p.pid, ("", 0.0))[0]
                    # a worker is "python3" until Ray titles it, then "ray::IDLE" until an actor takes it
                    name = known if known.startswith("ray::") and known != "ray::IDLE" else _process_label(p)
                    self.seen[p.pid] = (name, t.user + t.system)
                except psutil.Error:
                    pass
            now = time.monotonic()
            self.series.append((now, sum(cpu for _, cpu in self.seen.values())))
            self.snapshots.append((now, {pid: cpu for pid, (_, cpu) in self.seen.items()}))
            self._stop.wait(self.interval_s)

    def at(self, t: float) -> float:
        """Total CPU seconds at ``t`` (the nearest sample at or before it)."""
        before = [cpu for ts, cpu in self.series if ts <= t]
        return before[-1] if before else 0.0

    def by_name_between(self, t0: float, t1: float) -> dict[str, float]:
        """CPU seconds per process label between ``t0`` and ``t1`` (the nearest samples at or before each)."""
        def snap(t: float) -> dict[int, float]:
            before = [cpu for ts, cpu in self.snapshots if ts <= t]
            return before[-1] if before else {}

        a, b = snap(t0), snap(t1)
        out: dict[str, float] = {}
        for pid, cpu in b.items():
            name = self.seen.get(pid, ("?", 0.0))[0]
            out[name] = out.get(name, 0.0) + cpu - a.get(pid, 0.0)
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def by_name(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, cpu in self.seen.values():
            out[name] = out.get(name, 0.0) + cpu
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _process_label(proc) -> str:
    """A process's label: Ray's title for a worker (``ray::IngestFromFiles``, ``ray::IDLE``), else its name."""
    import psutil

    try:
        first = (proc.cmdline() or [""])[0]
    except psutil.Error:
        first = ""
    if not first.startswith("ray::"):
        return proc.name()
    title = first.split(" ")[0]
    return title.rsplit(".", 1)[0] if title.endswith(("__init__", ")")) or "." in title.split(":")[-1] else title


def run_command(base_url: str, samples: int, out: Path, concurrency: int, num_cpus: int) -> dict[str, Any]:
    """``aml-ray run`` against ``base_url``; wall time, exit time and CPU (whole tree) of the command."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    cmd = [str(Path(sys.executable).parent / "aml-ray"), "run", "--dataset", "locomo", "--data", str(LOCOMO),
           "--limit-samples", str(samples), "--participant", base_url, "--out", str(out),
           "--max-in-flight", str(concurrency), "--num-cpus", str(num_cpus)]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with TreeCpu(proc.pid) as tree:
        _, status, usage = os.wait4(proc.pid, 0)
        t_exit = time.monotonic()
    output = proc.stdout.read() if proc.stdout else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"aml-ray run exited {proc.returncode}:\n{output[-3000:]}")
    # the larger of two views: wait4's rusage counts reaped descendants only (Ray's workers may not be),
    # psutil's last look at each process misses at most its final 100 ms
    cpu = max(usage.ru_utime + usage.ru_stime, sum(tree.by_name().values()))
    return {"t0": t0, "t_exit": t_exit, "wall_s": t_exit - t0, "cpu_s": cpu,
            "tree": tree, "run": json.loads((out / "run.json").read_text())}


def peer_harness(base_url: str, samples: int, run_id: str, keep_answers: bool = False) -> dict[str, Any]:
    """A peer-style harness: one sequential loop, every Add in order, then Search and answer each question.

    ``keep_answers``: the result also holds ``answers``, ``[(question, answer, golds), ...]``.
    """
    import httpx

    from aml_ray.datasets.registry import get_dataset
    from aml_ray.ids import IdScheme
    from aml_ray.run.inputs import build_inputs
    from aml_ray.models.offline import extractive_answer

    spec = get_dataset("locomo")
    with tempfile.TemporaryDirectory(prefix="aml-peer-") as tmp:
        inputs = build_inputs(spec.load(LOCOMO)[:samples], IdScheme(run_id, "locomo"), out_dir=Path(tmp))
        rows = [inputs.sample_row(i) for i in range(inputs.n_samples)]
    t0, c0 = time.perf_counter(), time.thread_time()
    answered = 0
    answers = []
    with httpx.Client(timeout=600) as http:
        for row in rows:
            for add in json.loads(row["adds_json"]):
                http.post(f"{base_url}/add", json=add).raise_for_status()
        for row in rows:
            for q in row["questions"]:
                resp = http.post(f"{base_url}/search", json={"query": q["question"], "user_id": q["user_id"],
                                                               "top_k": 100})
                resp.raise_for_status()
                answer = extractive_answer(q["question"], resp.json()["data"])
                answered += 1
                if keep_answers:
                    answers.append((q["question"], answer, json.loads(q["gold"])))
    out = {"wall_s": time.perf_counter() - t0, "cpu_s": time.thread_time() - c0, "questions": answered}
    return {**out, "answers": answers} if keep_answers else out


def peer_command(base_url: str, samples: int) -> dict[str, Any]:
    """The peer-style harness as a command of its own (``peer_main``): wall time from start to exit."""
    with tempfile.TemporaryDirectory(prefix="aml-peer-cmd-") as tmp:
        out = Path(tmp) / "peer.json"
        t0 = time.monotonic()
        subprocess.run([sys.executable, __file__, "peer", base_url, str(samples), str(out)], check=True)
        t_exit = time.monotonic()
        result = json.loads(out.read_text())
    return {**result, "loop_wall_s": result["wall_s"], "wall_s": t_exit - t0, "t0": t0, "t_exit": t_exit}


def wall_parts(stats: dict[str, Any], t0: float, t_exit: float, busy_s: float) -> dict[str, Any]:
    """A command's wall time against a one-at-a-time participant, in parts that add up to it (seconds).

    ``start``: the command's start to the participant's first service; ``busy``: the service times set
    (``busy_s``); ``late``: the participant's own overrun of them (its event loop waiting for a CPU, which
    the client's processes on the same machine cause); ``idle``: the participant with nothing to serve
    between its first service and its last; ``tail``: its last reply to the command's exit. ``gaps``: the
    three longest idle gaps, ``(seconds after the start, seconds, the next request's kind, its number)``;
    ``span_check``: the first service to the last less busy, late and idle (about 0: the parts account for
    the whole span).
    """
    first, last = stats["served_first"], stats["served_last"]
    gaps = sorted(stats["gaps"], key=lambda g: -g[1])[:3]
    return {"start": first - t0, "busy": busy_s, "late": stats["late_total_s"], "idle": stats["idle_s"],
            "tail": t_exit - last, "gaps": [(g[0] - t0, g[1], *g[2:]) for g in gaps],
            "span_check": (last - first) - busy_s - stats["late_total_s"] - stats["idle_s"]}


def peer_main(base_url: str, samples: int, out: Path) -> None:
    """A peer's whole evaluation command: load LoCoMo, the loop (:func:`peer_harness`), judge, write results."""
    from aml_ray.scoring import lexical_verdict, token_f1

    t0 = time.process_time()
    peer = peer_harness(base_url, samples, f"peercmd{time.time_ns()}", keep_answers=True)
    scored = []
    for question, answer, golds in peer.pop("answers"):
        label, _ = lexical_verdict(answer, golds)
        scored.append({"question": question, "answer": answer, "verdict": label,
                       "f1": max(token_f1(answer, str(g)) for g in golds)})
    out.write_text(json.dumps({**peer, "cpu_s_command": time.process_time() - t0,
                               "correct": sum(r["verdict"] == "CORRECT" for r in scored), "rows": scored}))


def machine_speed(wakes: int = 40, gap_s: float = 0.035) -> dict[str, float]:
    """How fast this machine runs now, so CPU figures can be read across runs and days (issue 29).

    On a shared virtual machine the same code's CPU per question drifts by up to 1.7 x within a session,
    every process alike (docs/benchmarks.md); at a one-at-a-time participant's pace most of it is the cost
    of waking idle processes, not Python work. Two figures, in this process:

    - ``work_ms``: CPU milliseconds of a fixed pure-Python workload (the squares of 0..999,999 summed);
    - ``wake_us``: CPU microseconds per wake-up of an idle process: ``wakes`` times, a ``gap_s`` sleep (a
      Search's pace at the serial participant), then 1 KiB sent and received over a loopback socket pair.

    Both from ``time.process_time``; about ``wakes * gap_s`` seconds of wall time.
    """
    import socket

    c0 = time.process_time()
    sum(i * i for i in range(1_000_000))
    work = time.process_time() - c0
    payload = b"x" * 1024
    a, b = socket.socketpair()
    with a, b:
        c0 = time.process_time()
        for _ in range(wakes):
            time.sleep(gap_s)
            a.sendall(payload)
            b.recv(len(payload))
        wake = (time.process_time() - c0) / wakes
    return {"work_ms": 1000 * work, "wake_us": 1e6 * wake}


def one_participant(kind: str, args) -> dict[str, Any]:
    from bench_pipeline import lower_bound
    from loopback_servers import ServerProcess

    if kind == "serial":
        search_ms, add_ms, capacity = SEARCH_MS * args.service_scale, ADD_MS * args.service_scale, 1
    else:
        search_ms = args.latency_ms
        add_ms = args.add_latency_ms if args.add_latency_ms is not None else args.latency_ms
        capacity = args.concurrency
    server_args = ["--latency-ms", str(search_ms), "--add-latency-ms", str(add_ms), "--capacity", str(capacity)]
    load_start, speed_start = os.getloadavg(), machine_speed()
    with ServerProcess("participant", *server_args) as server, \
            tempfile.TemporaryDirectory(prefix="aml-serial-") as tmp:
        cmd = run_command(server.base_url, args.serial_samples, Path(tmp) / "run", args.concurrency, args.num_cpus)
        st = server.stats()
        server.reset()
        peer = None if args.skip_peer else peer_harness(server.base_url, args.serial_samples, f"peer{time.time_ns()}")
        peer_stats = server.stats()
        server.reset()
        peer_cmd = None if args.skip_peer else peer_command(server.base_url, args.serial_samples)
        peer_cmd_stats = None if args.skip_peer else server.stats()
    n_adds, n_searches = st["n"]["add"], st["n"]["search"]
    run = cmd["run"]
    n_q = run["dataset"]["scorable_questions"]
    if kind == "serial":  # the participant's own busy time: every request it served, one at a time
        bound = (n_adds * add_ms + n_searches * search_ms) / 1000
        bound_note = f"{n_adds} Adds x {add_ms:g} ms + {n_searches} Searches x {search_ms:g} ms, served one at a time"
    else:
        class _Inputs:  # the counts lower_bound reads
            n_scorable, n_chunks = n_q, run["dataset"]["chunks"]
            max_sample_chunks = run["dataset"]["chunks"]  # upper estimate below; replaced by the real max

        _Inputs.max_sample_chunks = max(_chunks_per_sample(args.serial_samples))
        bound = lower_bound(_Inputs, search_ms / 1000, add_ms / 1000, args.concurrency, 0.0, 1)["bound"]
        bound_note = "the lower bound of the declared limits (longest sample's Adds in order, or capacity)"
    parts = peer_parts = None
    if kind == "serial":
        parts = wall_parts(st, cmd["t0"], cmd["t_exit"], bound)
        if peer_cmd:  # the peer sends no pre-flight: its busy time is one Add and one Search less
            peer_parts = wall_parts(peer_cmd_stats, peer_cmd["t0"], peer_cmd["t_exit"],
                                    bound - (add_ms + search_ms) / 1000)
    tree: TreeCpu = cmd["tree"]
    first_s, last_s = st["first_two"]["search"][1], st["last"]["search"]  # [0]: the pre-flight's Search
    full_rate_cpu = tree.at(last_s) - tree.at(first_s)
    in_window = n_searches - 1
    conc = run.get("participant_concurrency", {})
    return {
        "participant": kind, "search_ms": search_ms, "add_ms": add_ms, "capacity": capacity,
        "load_start": load_start, "load_end": os.getloadavg(), "speed_start": speed_start, "speed_end": machine_speed(),
        "wall_s": cmd["wall_s"], "bound_s": bound, "bound_note": bound_note, "wall_over_bound": cmd["wall_s"] / bound,
        "command_to_probe_add_s": st["first_two"]["add"][0] - cmd["t0"],
        "command_to_first_add_s": st["first_two"]["add"][1] - cmd["t0"],
        "last_search_to_exit_s": cmd["t_exit"] - last_s,
        "cpu_s": cmd["cpu_s"], "cpu_ms_per_question": 1000 * cmd["cpu_s"] / n_q,
        "cpu_ms_per_question_full_rate": 1000 * full_rate_cpu / max(1, in_window),
        "cpu_by_process": tree.by_name(), "questions": n_q,
        "cpu_ms_per_question_full_rate_by_process": {
            k: 1000 * v / max(1, in_window) for k, v in tree.by_name_between(first_s, last_s).items() if v > 0},
        "full_rate_window_s": last_s - first_s, "adds": n_adds, "searches": n_searches,
        "timings": run.get("timings"), "search_latency_ms": run["search"]["latency_ms"],
        "search_queue_ms": run["search"].get("queue_ms"), "add_latency_ms": run["adds"]["latency_ms"],
        "limit": {k: conc.get(k) for k in ("declared", "min", "max", "final")},
        "server_max_in_flight": st["max_in_flight"],
        "peer": peer, "peer_server_max_in_flight": peer_stats["max_in_flight"], "peer_command": peer_cmd,
        "wall_parts": parts, "peer_wall_parts": peer_parts,
    }


def _chunks_per_sample(samples: int) -> list[int]:
    from aml_ray.datasets.registry import get_dataset
    from aml_ray.ids import IdScheme
    from aml_ray.run.inputs import build_inputs

    with tempfile.TemporaryDirectory(prefix="aml-count-") as tmp:
        inputs = build_inputs(get_dataset("locomo").load(LOCOMO)[:samples], IdScheme("count", "locomo"),
                              out_dir=Path(tmp))
        return [len(json.loads(inputs.sample_row(i)["adds_json"])) for i in range(inputs.n_samples)]


def set_bytecode(compiled: bool) -> int:
    """Compile the package's modules to bytecode (``__pycache__``) as a regular install does, or remove that
    cache (``compiled=False``), before the commands run; returns the package's modules with a cache.

    Both commands import aml-ray's modules (the peer command its dataset, inputs and scoring ones). A
    regular ``pip install`` compiles them, and any interpreter writes the cache on first import, but an
    environment with ``PYTHONDONTWRITEBYTECODE=1`` (this machine's) and an editable install never has one:
    every process, each Ray worker too, then compiles them from source at every start.
    """
    import compileall
    import shutil

    package = REPO / "aml_ray"
    if compiled:
        compileall.compile_dir(str(package), quiet=2)
    else:
        for cache in list(package.rglob("__pycache__")):
            shutil.rmtree(cache, ignore_errors=True)
    return sum(1 for _ in package.rglob("__pycache__/*.pyc"))


def serial_run(args) -> dict[str, Any]:
    kinds = ["serial", "fast"] if args.serial_participants == "both" else [args.serial_participants]
    cached = set_bytecode(not args.source_compile)
    return {"bytecode_cached_modules": cached, "runs": [one_participant(kind, args) for kind in kinds]}


def report_serial(args, runs: list[dict[str, Any]]) -> None:
    for res in runs:
        print(f"\naml_ray modules with a bytecode cache: {res['bytecode_cached_modules']} "
              f"({'removed: every process compiles them from source' if args.source_compile else 'compiled first, as an install does'})")
        for r in res["runs"]:
            la, lb = r["load_start"], r["load_end"]
            print(f"\n== {r['participant']} participant: Search {r['search_ms']:g} ms, Add {r['add_ms']:g} ms, "
                  f"{r['capacity']} at once; LoCoMo x{args.serial_samples} samples ({r['adds']} Adds, {r['searches']} "
                  f"Searches incl. the pre-flight's, {r['questions']} questions); load {la[0]:.2f}/{la[1]:.2f} -> "
                  f"{lb[0]:.2f}/{lb[1]:.2f} (1/5 min)")
            sa, sb = r["speed_start"], r["speed_end"]
            print(f"  machine speed (machine_speed)    a fixed Python workload {sa['work_ms']:.0f} -> {sb['work_ms']:.0f} ms "
                  f"of CPU; an idle wake-up with a loopback send {sa['wake_us']:.0f} -> {sb['wake_us']:.0f} us")
            print(f"  aml-ray wall (whole command)     {r['wall_s']:7.2f} s = {r['wall_over_bound']:.2f} x the busy-time "
                  f"bound {r['bound_s']:.2f} s ({r['bound_note']})")
            if r["peer"]:
                p = r["peer"]
                print(f"  peer loop (in this process)      {p['wall_s']:7.2f} s = {p['wall_s'] / r['bound_s']:.2f} x bound; "
                      f"aml-ray / peer loop = {r['wall_s'] / p['wall_s']:.2f}; its CPU {1000 * p['cpu_s'] / p['questions']:.2f} ms/question")
            if r.get("peer_command"):
                c = r["peer_command"]
                print(f"  peer command (start to exit)     {c['wall_s']:7.2f} s = {c['wall_s'] / r['bound_s']:.2f} x bound; "
                      f"aml-ray / peer command = {r['wall_s'] / c['wall_s']:.2f}; its CPU "
                      f"{1000 * c['cpu_s_command'] / c['questions']:.2f} ms/question (its process only); its loop {c['loop_wall_s']:.2f} s")
            print(f"  command -> first Add of the run  {r['command_to_first_add_s']:7.2f} s (pre-flight probe Add at "
                  f"{r['command_to_probe_add_s']:.2f} s); last Search -> exit {r['last_search_to_exit_s']:.2f} s")
            print(f"  timings in run.json              {r['timings']}")
            for who, wp in (("aml-ray", r.get("wall_parts")), ("peer command", r.get("peer_wall_parts"))):
                if wp:
                    gaps = ", ".join(f"{g:.3f} s at {at:.2f} s before {kind} {n}" for at, g, kind, n in wp["gaps"])
                    print(f"  wall parts, {who:<13} start {wp['start']:.2f} + busy {wp['busy']:.2f} + late "
                          f"{wp['late']:.2f} + idle {wp['idle']:.2f} + tail {wp['tail']:.2f} s; longest idle gaps: {gaps}")
            print(f"  aml-ray CPU: {r['cpu_s']:.2f} s in all = {r['cpu_ms_per_question']:.1f} ms/question; at full rate "
                  f"(first to last Search) {r['cpu_ms_per_question_full_rate']:.2f} ms/question")
            top = ", ".join(f"{k} {v:.1f}" for k, v in list(r["cpu_by_process"].items())[:14])
            print(f"  CPU s by process (psutil)        {top}")
            window = ", ".join(f"{k} {v:.2f}" for k, v in list(r["cpu_ms_per_question_full_rate_by_process"].items())[:10])
            print(f"  at full rate ({r['full_rate_window_s']:.1f} s), ms/question by process: {window}")
            print(f"  Search latency at the participant p50 {r['search_latency_ms']['p50']:.1f} / p95 "
                  f"{r['search_latency_ms']['p95']:.1f} ms; queue wait p50 {r['search_queue_ms']['p50']:.1f} / p95 "
                  f"{r['search_queue_ms']['p95']:.1f} ms; Add p50 {r['add_latency_ms']['p50']:.1f} ms")
            print(f"  in-flight limit {r['limit']}; server's peak in flight {r['server_max_in_flight']}")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1, default=str))


if __name__ == "__main__":  # pragma: no cover - run through bench_pipeline.py --mode serial
    if sys.argv[1:2] == ["peer"]:  # the peer command (peer_command)
        peer_main(sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))
    else:
        sys.exit("run: .venv/bin/python scripts/bench_pipeline.py --mode serial")
