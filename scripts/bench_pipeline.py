"""Benchmark the aml-ray pipeline against loopback servers (issue 2 acceptance; issue 7).

Two modes, both against servers that run in their own processes (``scripts/loopback_servers.py``):

``--mode search`` (default; the main job's acceptance)
    Search throughput of the real pipeline (:func:`aml_ray.run.pipeline.run_pipeline` over synthetic
    :class:`~aml_ray.run.pipeline.PipelineInputs`: ``--samples`` samples (default 100; LoCoMo has 10) x
    ``queries/samples`` questions, one small Add chunk per sample) against a loopback participant with a fixed latency, at ``--concurrency`` in
    flight, for ``--queries`` Searches. ``--pipeline both`` (default) measures it twice, each on a fresh
    Ray: retrieval-only (Ingest and Search, evidence written: the work a plain Search loop does, so the
    like-for-like comparison) and full (plus the offline answerer and judge, CPU work that shares the
    same cores). Printed beside the ideal
    (concurrency / latency) and a plain asyncio loop on the same server (aiohttp, and httpx over the
    aiohttp transport), measured in the same run, and the ``ParticipantClient`` actor alone, fed by this
    process as the Ingest stage feeds it (:func:`measure_client_actor`). The pipeline's rate is the
    steady state seen by the server: (N - 1) / (last arrival - first arrival). Also: end-to-end wall time
    (Ray start + actor pools + the run), driver and worker peak RSS, and the cores each process used
    between the first and last Search arrival.

``--mode e2e`` (issue 7)
    A synthetic corpus shaped like LoCoMo (``--scale`` 1/10/100: 10 x scale samples, 19 sessions of 31
    turns, 154 questions per sample) through Add -> Search -> Answer -> Judge, with a loopback
    OpenAI-compatible model server for the answer and judge models. Prints wall time, the lower bound
    implied by the declared limits, their ratio, requests/s per stage, peak memory, and a peer-style
    baseline (a pool of 10 threads over conversations, questions sequential inside each) against the
    same servers, in the same run.

    The lower bound: Adds are sequential within a sample (the longest sample's Adds, then one Search,
    Answer and Judge); the participant serves at most ``--concurrency`` at once ((Adds + Searches) x
    latency / concurrency, then one Answer and Judge); each model endpoint serves at most
    ``--model-concurrency`` at once (questions x model latency / concurrency, plus the other stages'
    head and tail latencies). The bound is the largest of these; Ray start and actor-pool start are not
    in it, and the wall time is printed with and without them. The peer baseline is run on all samples
    at ``--scale 1`` and on one round of its thread pool (10 samples) above, extrapolated by rounds
    (every sample has the same shape, so every round costs the same); ``--peer-samples N`` changes that.

``--mode serial`` (issue 29)
    What a real evaluation costs: the real ``aml-ray run`` command on ``--serial-samples`` LoCoMo
    samples against a participant that serves one request at a time (Search 35 ms, Add 300 ms, times
    ``--service-scale``) and against the fast one, each beside a peer-style sequential harness in the same
    run: wall time vs the participant's busy-time bound, command-to-first-Add, last-Search-to-exit,
    aml-ray's CPU per question across its processes, the latency and queue wait run.json reports and the
    adaptive in-flight limit (``scripts/bench_serial.py``). aml_ray's modules are compiled to bytecode
    first, as a regular install has them (``--source-compile``: removed, so every process of both
    commands compiles them from source, as an editable install does under ``PYTHONDONTWRITEBYTECODE=1``).

``--warm`` (search mode) runs a small job on the same Ray first and measures the next one, as a service's
worker runs job after job: Ray Data's own actors (stats, autoscaling coordinator, actor locations) and
the dashboard agent are then started, and their start-up CPU is not in the measured run.

``--repeat R`` runs R independent measurements, each in a fresh process (Ray started anew each time),
and prints the median. ``--nodes 2`` runs the pipeline on a two-node local cluster
(``ray.cluster_utils.Cluster``, CPUs split between the nodes). ``--verbose`` adds CPU seconds per
process, per-second arrival timelines, process start times and the driver's memory over the run; every
run also records the machine's load average (other users' processes take CPU from the pipeline, which
needs more of it than a plain loop does). Examples::

    .venv/bin/python scripts/bench_pipeline.py                       # 10,000 Searches, 20 ms, 64
    .venv/bin/python scripts/bench_pipeline.py --repeat 3
    .venv/bin/python scripts/bench_pipeline.py --mode e2e --scale 10 --repeat 3
    .venv/bin/python scripts/bench_pipeline.py --mode e2e --scale 1 --nodes 2 --skip-peer
    .venv/bin/python scripts/bench_pipeline.py --mode e2e --scale 100 --offline-models  # memory scaling
    .venv/bin/python scripts/bench_pipeline.py --mode serial                      # issue 29: real-participant costs
    .venv/bin/python scripts/bench_pipeline.py --mode serial --service-scale 0.1 --serial-participants serial
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from loopback_servers import ServerProcess  # noqa: E402

# --------------------------------------------------------------------------------------------- corpus


@dataclass(frozen=True)
class Shape:
    """A synthetic corpus: ``samples`` x ``sessions`` x ``turns``, ``questions`` per sample."""

    samples: int
    sessions: int
    turns: int
    questions: int
    words_per_turn: int = 18


def search_shape(queries: int, samples: int = 100) -> Shape:
    """The Search benchmark's corpus: one small Add chunk per sample, ``queries`` questions in all."""
    if queries % samples:
        raise SystemExit(f"--queries must be a multiple of {samples}")
    return Shape(samples=samples, sessions=1, turns=2, questions=queries // samples, words_per_turn=8)


def locomo_shape(scale: int) -> Shape:
    """LoCoMo-shaped: 10 conversations, 19 sessions x 31 turns (5,890 turns), 154 questions each (x scale)."""
    return Shape(samples=10 * scale, sessions=19, turns=31, questions=154)


_WORDS = ("caroline melanie painting support group camping lake adoption agency pottery class sunset "
          "beach charity race counseling career school friends family summer trip concert guitar book "
          "dog hiking museum festival garden").split()


def synthetic_samples(shape: Shape):
    """The corpus's :class:`Sample` objects, generated one at a time (never all in memory)."""
    from aml_ray.contract import Message
    from aml_ray.datasets.base import Question, Sample, Session

    t0 = 1_683_554_160_000
    for s in range(shape.samples):
        sid = f"syn-{s:05d}"
        sessions = []
        for k in range(shape.sessions):
            msgs = []
            for t in range(shape.turns):
                words = " ".join(_WORDS[(s + k * 7 + t * 3 + i) % len(_WORDS)] for i in range(shape.words_per_turn))
                speaker = "Caroline" if t % 2 == 0 else "Melanie"
                msgs.append(Message(role="user", content=f"{speaker}: {words} #{k}.{t}",
                                    timestamp=t0 + k * 86_400_000 + t * 60_000))
            sessions.append(Session(key=f"session_{k + 1}", index=k + 1, started_at_ms=t0 + k * 86_400_000,
                                    messages=tuple(msgs)))
        questions = tuple(
            Question(question_id=f"{sid}:q{q:04d}", sample_id=sid,
                     question=f"When did Caroline go to the {_WORDS[q % len(_WORDS)]} {_WORDS[(q * 5) % len(_WORDS)]}?",
                     answer=f"{1 + q % 28} May 2023", category=str(1 + q % 4))
            for q in range(shape.questions))
        yield Sample(sample_id=sid, sessions=tuple(sessions), questions=questions, speakers=("Caroline", "Melanie"))


def synthetic_inputs(shape: Shape, out_dir: Path, run_id: str = "bench"):
    """Build :class:`PipelineInputs` into ``out_dir`` with the real chunker and id scheme, one sample at a time."""
    from aml_ray.ids import IdScheme
    from aml_ray.run.inputs import build_inputs

    return build_inputs(synthetic_samples(shape), IdScheme(run_id, "synthetic"), out_dir=out_dir)


# --------------------------------------------------------------------------------------------- memory


def _proc_status(pid: int) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(("VmHWM:", "VmRSS:", "RssAnon:", "RssShmem:")):
                    key, value = line.split(":", 1)
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _short(cmd: str) -> str:
    if cmd.startswith("ray::"):
        return re.sub(r"\.\w+$", "", cmd.split()[0])  # "ray::ParticipantClient.search_table" -> its actor
    parts = cmd.split()
    for p in parts:
        base = p.rsplit("/", 1)[-1]
        if base in ("gcs_server", "raylet") or base.endswith(".py"):
            return base
    return parts[0].rsplit("/", 1)[-1] if parts else "?"


def _proc_stat(pid: int) -> tuple[int, float]:
    """``(parent pid, CPU seconds used so far, user + system)`` of process ``pid`` (/proc/<pid>/stat).

    Raises:
        OSError: the process is gone.
    """
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RssSampler:
    """Samples memory and CPU of this process's descendants (Ray's processes; the loopback servers excluded).

    Reports the largest peak RSS (VmHWM) of one Ray worker, the peak of the summed proportional set size
    (PSS: shared pages split between the processes that map them, so the sum is not inflated) of all
    descendants (GCS, raylet, workers), and the CPU seconds each process used.

    ``pss=False`` skips the PSS sum: reading ``smaps_rollup`` of Ray's processes costs this process about
    30 ms of CPU per look on 2 cores (measured), beside the processes it measures; the Search benchmark,
    whose figure is throughput, does without it.
    """

    def __init__(self, exclude: set[int], interval_s: float = 1.0, pss: bool = True):
        self.exclude, self.interval_s, self.pss = exclude, interval_s, pss
        self.hwm: dict[int, int] = {}
        self.names: dict[int, str] = {}
        self.cpu: dict[int, float] = {}
        self.total_peak = 0
        self.first_seen: dict[str, float] = {}  # process name -> when first seen (time.monotonic)
        self.driver_rss: list[tuple[float, int]] = []  # (time.monotonic, driver VmRSS)
        self.driver_anon_peak = 0  # private memory (RssAnon)
        self.driver_shmem_peak = 0  # object-store pages the driver maps (RssShmem)
        self.cpu_series: list[tuple[float, dict[int, float]]] = []  # (time.monotonic, {pid: CPU s so far})
        self._ticks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        # CPU every interval (cheap: /proc/*/stat), memory every other one (smaps_rollup is not)
        while not self._stop.wait(self.interval_s / 2):
            self._sample(memory=self._ticks % 2 == 1)

    def cpu_between(self, t0: float, t1: float) -> dict[str, float]:
        """Cores used by each process (by name) from the sample nearest after ``t0`` to the one nearest before ``t1``.

        Returns ``{}`` when fewer than two samples lie between them.
        """
        inside = [(t, c) for t, c in self.cpu_series if t0 <= t <= t1]
        if len(inside) < 2:
            return {}
        (ta, ca), (tb, cb) = inside[0], inside[-1]
        out: dict[str, float] = {}
        me = os.getpid()
        for pid, sec in cb.items():
            key = "driver" if pid == me else self.names.get(pid)
            if key is None:  # not one of this run's processes
                continue
            out[key] = out.get(key, 0.0) + (sec - ca.get(pid, 0.0)) / (tb - ta)
        return {k: round(v, 3) for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v >= 0.005}

    def _sample(self, memory: bool = True) -> None:
        parent: dict[int, int] = {}
        cpu: dict[int, float] = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    parent[int(name)], cpu[int(name)] = _proc_stat(int(name))
                except (OSError, IndexError, ValueError):
                    continue
        now = time.monotonic()
        self.cpu_series.append((now, {pid: v for pid, v in cpu.items() if pid not in self.exclude}))
        self._ticks += 1
        if not memory:
            return
        me, mine = os.getpid(), []
        for pid in parent:
            p, seen = pid, 0
            while p and p != me and seen < 50:
                if p in self.exclude:
                    p = 0
                    break
                p, seen = parent.get(p, 0), seen + 1
            if p == me and pid != me and pid not in self.exclude:
                mine.append(pid)
        st = _proc_status(me)
        self.driver_rss.append((time.monotonic(), st.get("VmRSS", 0)))
        self.driver_anon_peak = max(self.driver_anon_peak, st.get("RssAnon", 0))
        self.driver_shmem_peak = max(self.driver_shmem_peak, st.get("RssShmem", 0))
        total = 0
        # smaps_rollup (PSS) costs the driver about 40 ms of CPU for Ray's processes on 2 cores, the rest of a
        # memory tick about 7 ms: PSS every other memory tick keeps the sampler near 2.5% of a core
        pss = self.pss and self._ticks % 4 == 2
        for pid in mine:
            total += _pss(pid) if pss else 0
            self.hwm[pid] = max(self.hwm.get(pid, 0), _proc_status(pid).get("VmHWM", 0))
            cmd = _cmdline(pid)
            if not cmd:
                try:
                    with open(f"/proc/{pid}/comm") as fh:
                        cmd = "comm:" + fh.read().strip()
                except OSError:
                    cmd = ""
            name = _short(cmd)
            known = self.names.get(pid, "")
            # a worker's title changes with the task it runs ("ray::IDLE", "ray::Class.method"); keep its
            # actor's name, and never replace a full name with a thread's truncated one ("comm:...")
            if pid not in self.names or (name and name != "ray::IDLE" and not (
                    name.startswith(("comm:", "?")) and known.startswith("ray::") and known != "ray::IDLE")):
                self.names[pid] = name
            self.first_seen.setdefault(name, time.monotonic())
            self.cpu[pid] = cpu.get(pid, 0.0)
        self.total_peak = max(self.total_peak, total)

    def largest_worker(self) -> tuple[int, str]:
        workers = [(v, self.names.get(pid, "")) for pid, v in self.hwm.items()
                   if self.names.get(pid, "").startswith("ray::")]
        return max(workers) if workers else (0, "")

    def cpu_by_process(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, sec in self.cpu.items():
            key = self.names.get(pid, "?")
            out[key] = round(out.get(key, 0.0) + sec, 2)
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


class MachineCpu:
    """How the whole machine's CPU time went over a span (/proc/stat): ``busy`` and ``steal`` shares.

    ``busy``: the share of all jiffies not idle (other users' processes count too). ``steal``: the
    share the hypervisor gave to other machines. On a shared virtual machine the host can take CPU
    from this one while a measurement runs; the figures of that run are then low through no fault of
    the code measured (0.05: a twentieth of the CPUs' time was taken).
    """

    @staticmethod
    def _jiffies() -> list[int]:
        with open("/proc/stat") as fh:
            return [int(x) for x in fh.readline().split()[1:]]

    def __enter__(self) -> "MachineCpu":
        self.start = self._jiffies()
        self.busy = self.steal = 0.0
        return self

    def __exit__(self, *exc) -> None:
        d = [b - a for a, b in zip(self.start, self._jiffies())]
        total = sum(d)
        if total > 0:
            self.busy = (total - d[3] - d[4]) / total  # idle and iowait are not busy
            self.steal = d[7] / total if len(d) > 7 else 0.0


def driver_peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# --------------------------------------------------------------------------------------------- plain loops


def _search_bodies(n: int, samples: int = 100, top_k: int = 100) -> list[bytes]:
    return [json.dumps({"query": f"When did Caroline go to the lake {i}?", "user_id": f"eval:bench:syn:{i % samples}",
                        "top_k": top_k}, separators=(",", ":")).encode() for i in range(n)]


def search_items(n: int, samples: int, top_k: int = 100) -> list[list[dict]]:
    """``n`` Search items (``{"ref", "request"}``, as ``ParticipantClient.search_table`` takes them), one list per sample."""
    per = n // samples
    return [[{"ref": f"s{k}:q{i}", "request": {"query": f"When did Caroline go to the lake {i}?",
                                               "user_id": f"eval:bench:syn:{k}", "top_k": top_k}}
             for i in range(per)] for k in range(samples)]


async def plain_aiohttp(url: str, n: int, concurrency: int) -> float:
    """A plain asyncio loop: ``concurrency`` aiohttp workers over ``n`` Searches; returns wall seconds."""
    import aiohttp

    bodies = _search_bodies(n)
    it = iter(bodies)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async def worker() -> None:
            for body in it:
                async with session.post(url, data=body, headers=headers) as resp:
                    assert resp.status == 200
                    await resp.json()
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - t0


async def plain_httpx_aiohttp(url: str, n: int, concurrency: int) -> float:
    """The same loop with httpx's API over the aiohttp transport (what ParticipantClient uses)."""
    import httpx
    from httpx_aiohttp import AiohttpTransport

    bodies = _search_bodies(n)
    it = iter(bodies)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(transport=AiohttpTransport(limits=limits),
                                 headers={"Content-Type": "application/json"}) as client:
        async def worker() -> None:
            for body in it:
                resp = await client.post(url, content=body)
                assert resp.status_code == 200
                resp.json()
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - t0


_PLAIN_CHILD = """
import asyncio, json, sys, time
import bench_pipeline as b
kind, url, n, c = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
import aiohttp  # imported before the clock starts
if kind == "httpx":
    import httpx, httpx_aiohttp
run = asyncio.run
if kind == "uvloop":  # the event loop Ray gives its actors (RAY_USE_UVLOOP, on when uvloop is installed)
    import uvloop
    run = uvloop.run
loop = b.plain_httpx_aiohttp if kind == "httpx" else b.plain_aiohttp
c0 = time.process_time()
wall = run(loop(url, n, c))
print(json.dumps({"wall_s": wall, "cpu_s": time.process_time() - c0}))
"""


def measure_plain(server: ServerProcess, kind: str, n: int, concurrency: int) -> dict[str, float]:
    """A plain loop in a process of its own: ``kind`` ``aiohttp`` (:func:`plain_aiohttp` on asyncio's own
    event loop: the acceptance's baseline), ``uvloop`` (the same loop on uvloop, the event loop Ray runs its
    async actors on, the ``ParticipantClient`` included) or ``httpx`` (:func:`plain_httpx_aiohttp`).

    Its own process, not this one: a plain client is a small program, and this driver's heap (Ray,
    pyarrow, polars and the bench's inputs loaded) slowed the same loop by 6-12 % (measured 2026-12-01:
    2,629-2,823 req/s in the driver, 2,975-3,010 in a fresh process, interleaved, 3 pairs), which
    would flatter the pipeline's ratio to it. Returns the server's rates, the loop's wall and CPU seconds
    (measured inside the child, so the interpreter's start is not counted) and the server's CPU seconds.
    """
    server.reset()
    assert server.proc is not None
    s0 = _proc_stat(server.proc.pid)[1]
    with MachineCpu() as machine:
        out = subprocess.run([sys.executable, "-c", _PLAIN_CHILD, kind, f"{server.base_url}/search", str(n),
                              str(concurrency)], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent)
    if out.returncode != 0:
        raise RuntimeError(f"the plain {kind} loop failed (exit {out.returncode}): {out.stderr[-2000:]}")
    child = json.loads(out.stdout.strip().splitlines()[-1])
    wall, cpu, server_cpu = child["wall_s"], child["cpu_s"], _proc_stat(server.proc.pid)[1] - s0
    count, rate = server.rate("search")
    assert count == n, (count, n)
    return {"rate": rate, "steady": server.steady_rate("search"), "client_rate": n / wall, "wall_s": wall,
            "client_cpu_s": cpu, "server_cpu_s": server_cpu, "server_late_ms": server.stats()["late_ms"].get("search"),
            "steal": machine.steal}


def measure_client_actor(server: ServerProcess, n: int, concurrency: int, samples: int, top_k: int) -> dict[str, float]:
    """The ``ParticipantClient`` Ray actor alone, fed from this process as the Ingest stage feeds it.

    ``n`` Searches in ``samples`` calls of ``search_table`` (one sample's questions each), 16 calls in flight
    (``PipelineOptions.ingest_parallelism``); no Ray Data, no Ingest actor, no Adds. Between the plain loop
    and the pipeline it tells the client's own cost from what the pipeline's other processes take from it.
    Ray is started for it and stopped after.
    """
    import ray

    from aml_ray.actors.participant import ParticipantSpec, spawn_participant_client

    spec = ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search",
                           max_in_flight=concurrency)
    per = n // samples
    batches = search_items(n, samples, top_k)
    with _LocalCluster(1):
        client = spawn_participant_client(spec)
        ray.get(client.search_table.remote(batches[0][:1]))  # the actor is up
        server.reset()
        actor_pid = ray.get(client.__ray_call__.remote(lambda self: __import__("os").getpid()))
        actor_c0 = _proc_stat(actor_pid)[1]
        c0 = time.process_time()
        pending, queued = [client.search_table.remote(b) for b in batches[:16]], 16
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            ray.get(done)
            if queued < len(batches):
                pending.append(client.search_table.remote(batches[queued]))
                queued += 1
        driver_cpu = time.process_time() - c0
        actor_cpu = _proc_stat(actor_pid)[1] - actor_c0
        ray.get(client.aclose.remote())
    count, rate = server.rate("search")
    assert count == per * samples, (count, n)
    return {"rate": rate, "steady": server.steady_rate("search"), "driver_cpu_s": driver_cpu, "actor_cpu_s": actor_cpu,
            "server_late_ms": server.stats()["late_ms"].get("search")}


# --------------------------------------------------------------------------------------------- pipeline


class _LocalCluster:
    """Ray on ``nodes`` local nodes: ``init_ray()`` for one, :func:`aml_ray.run.ray_runtime.local_cluster` for more."""

    def __init__(self, nodes: int):
        self.nodes, self.started, self._cluster = nodes, False, None

    def __enter__(self) -> "_LocalCluster":
        from aml_ray.run.ray_runtime import init_ray, local_cluster

        if self.nodes == 1:
            self.started = init_ray()
            return self
        cpus = max(1, (os.cpu_count() or 2) // self.nodes)  # the machine's CPUs split between the nodes
        self._cluster = local_cluster({"num_cpus": cpus}, [{"num_cpus": cpus}] * (self.nodes - 1), prefix="amlb-")
        self._cluster.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        import ray

        if self._cluster is not None:
            self._cluster.__exit__(None, None, None)
        elif self.started:
            ray.shutdown()


def run_ray_pipeline(inputs, participant_url: str, concurrency: int, answer, judge, *, top_k: int,
                     options, exclude_pids: set[int], nodes: int = 1, retrieval_only: bool = False,
                     warmup=None, before_measure=None, cpu_window=None, pss: bool = True) -> dict[str, Any]:
    """Start Ray (on ``nodes`` local nodes), run the pipeline, stop Ray; returns timings and memory.

    ``retrieval_only``: Ingest and Search only (``run_pipeline(retrieval_only=True)``), no Answer/Judge.
    ``warmup``: other inputs run first on the same Ray (as a service's worker runs job after job: Ray Data's
    own actors and the dashboard agent are then up), then ``before_measure()`` (resets the server's counters).
    ``cpu_window()``: ``(t0, t1)`` on ``time.monotonic``, read after the run (the first and last Search arrival
    at the server); ``steady_cpu`` then holds the cores each process used between them. ``pss``: sum the
    Ray processes' PSS (:class:`RssSampler`).
    """
    from aml_ray.actors.participant import ParticipantSpec
    from aml_ray.run.evidence import RunDir
    from aml_ray.run.pipeline import run_pipeline

    spec = ParticipantSpec(add_url=f"{participant_url}/add", search_url=f"{participant_url}/search",
                           max_in_flight=concurrency)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="aml-bench-") as tmp, RssSampler(exclude_pids, pss=pss) as rss:
        out["loadavg_start"] = os.getloadavg()[0]
        out["driver_rss_before_ray"] = _proc_status(os.getpid()).get("VmRSS", 0)
        t0 = time.perf_counter()
        ray_nodes = _LocalCluster(nodes).__enter__()
        try:
            if warmup is not None:
                w0 = time.perf_counter()
                run_pipeline(warmup, run_dir=RunDir(Path(tmp) / "warmup"), participant=spec, answer=answer,
                             judge=judge, answer_prompt="locomo_answer", judge_prompt="locomo_judge",
                             top_k=top_k, options=options, retrieval_only=retrieval_only)
                out["warmup_s"] = time.perf_counter() - w0
                time.sleep(2.0)  # the worker processes Ray starts after a job (its pool of idle workers) settle
                if before_measure is not None:
                    before_measure()
            t1 = time.perf_counter()
            c0 = time.process_time()
            out["mono_start"] = time.monotonic()
            with MachineCpu() as machine:
                questions = run_pipeline(inputs, run_dir=RunDir(Path(tmp) / "run"), participant=spec, answer=answer,
                                         judge=judge, answer_prompt="locomo_answer", judge_prompt="locomo_judge",
                                         top_k=top_k, options=options, retrieval_only=retrieval_only)
            out["steal"], out["machine_busy"] = machine.steal, machine.busy
            t2 = time.perf_counter()
            out["mono_end"] = time.monotonic()
            out["driver_rss_after"] = _proc_status(os.getpid()).get("VmRSS", 0)
            out["loadavg_end"] = os.getloadavg()[0]
            out["driver_cpu_s"] = time.process_time() - c0
            rss._sample()  # last look at the workers' CPU and memory before they exit
            if cpu_window is not None:
                out["steady_cpu"] = rss.cpu_between(*cpu_window())
            if nodes > 1:
                import ray

                out["stage_nodes"] = len({a["Address"]["NodeID"] for a in ray._private.state.actors().values()
                                          if a["ActorClassName"].startswith("MapWorker(")})
        finally:
            ray_nodes.__exit__(None, None, None)
        scored = int(questions["status"].is_in(["scored", "retrieved"]).sum())
        lat = questions["search_latency_ms"].drop_nulls()
        out["search_latency_ms"] = {"p50": lat.quantile(0.5), "p95": lat.quantile(0.95)} if lat.len() else {}
    worker_hwm, worker_name = rss.largest_worker()
    out.update(ray_start_s=t1 - t0 - out.get("warmup_s", 0.0), pipeline_s=t2 - t1, end_to_end_s=t2 - t0, scored=scored,
               questions=questions.height, driver_peak_rss=driver_peak_rss(), worker_peak_rss=worker_hwm,
               worker_peak_name=worker_name, ray_total_peak_pss=rss.total_peak, cpu_s=rss.cpu_by_process(),
               first_seen={k: v - out["mono_start"] for k, v in sorted(rss.first_seen.items(), key=lambda kv: kv[1])},
               driver_anon_peak=rss.driver_anon_peak, driver_shmem_peak=rss.driver_shmem_peak,
               driver_rss_during=max((v for t, v in rss.driver_rss if out["mono_start"] <= t <= out["mono_end"]),
                                     default=0))
    return out


def _arrivals(stats: dict[str, Any], kind: str) -> tuple[float, float]:
    """The first and last arrival of ``kind`` at a loopback server (``time.monotonic``, this machine's clock)."""
    return stats["first"].get(kind, 0.0), stats["last"].get(kind, 0.0)


def search_run(args) -> dict[str, Any]:
    from aml_ray.config import model_endpoint_from_env
    from aml_ray.run.pipeline import PipelineOptions

    tmp = tempfile.TemporaryDirectory(prefix="aml-bench-inputs-")
    inputs = synthetic_inputs(search_shape(args.queries, args.samples), Path(tmp.name))
    warmup = (synthetic_inputs(Shape(samples=4, sessions=1, turns=2, questions=25, words_per_turn=8),
                               Path(tmp.name) / "warmup", run_id="warmup") if args.warm else None)
    offline_answer, offline_judge = model_endpoint_from_env("answer", {}), model_endpoint_from_env("judge", {})
    with ServerProcess("participant", "--latency-ms", str(args.latency_ms), "--capacity", str(args.concurrency),
                       "--memories", str(args.memories), "--http", args.participant_http) as server:
        res: dict[str, Any] = {"plain_aiohttp": measure_plain(server, "aiohttp", args.queries, args.concurrency),
                               "plain_uvloop": measure_plain(server, "uvloop", args.queries, args.concurrency),
                               "plain_httpx_aiohttp": measure_plain(server, "httpx", args.queries, args.concurrency),
                               "client_actor": measure_client_actor(server, args.queries, args.concurrency,
                                                                    args.samples, args.top_k)}
        kinds = ["retrieval", "full"] if args.pipeline == "both" else [args.pipeline]
        for kind, key in zip(kinds, ("pipeline", "pipeline_full")):
            server.reset()
            pipe = run_ray_pipeline(inputs, server.base_url, args.concurrency, offline_answer, offline_judge,
                                    top_k=args.top_k, options=pipeline_options(args, PipelineOptions),
                                    exclude_pids={server.proc.pid}, nodes=args.nodes,
                                    retrieval_only=kind == "retrieval", warmup=warmup, before_measure=server.reset,
                                    cpu_window=lambda: _arrivals(server.stats(), "search"), pss=False)
            n, rate = server.rate("search")
            stats = server.stats()
            pipe.update(rate=rate, steady=stats["steady"].get("search"), searches=n, adds=stats["n"].get("add", 0), kind=kind,
                        server_max_in_flight=stats["max_in_flight"], over_capacity=stats["over_capacity"],
                        timeline=stats["timeline"].get("search", {}), server_late_ms=stats["late_ms"].get("search"))
            assert pipe["scored"] == args.queries, pipe
            res[key] = pipe
    tmp.cleanup()
    res["ideal"] = args.concurrency / (args.latency_ms / 1000)
    return res


# --------------------------------------------------------------------------------------------- e2e


def lower_bound(inputs, lat_p: float, lat_add: float, cap_p: int, lat_m: float, cap_m: int) -> dict[str, float]:
    """The shortest wall time the declared limits allow (seconds).

    - Adds are sequential within a sample: the longest sample's Adds, then one Search, Answer, Judge.
    - The participant serves at most ``cap_p`` requests at once: (Adds x add latency + Searches x search
      latency) / cap_p, then the last question's Answer and Judge.
    - Each model endpoint serves at most ``cap_m`` at once: Q x latency / cap_m, plus the other stages'
      head and tail latencies.
    """
    q = inputs.n_scorable
    terms = {
        "adds_in_order": inputs.max_sample_chunks * lat_add + lat_p + 2 * lat_m,
        "participant_capacity": (inputs.n_chunks * lat_add + q * lat_p) / cap_p + 2 * lat_m,
        "answer_capacity": lat_add + lat_p + q * lat_m / cap_m + lat_m,
        "judge_capacity": lat_add + lat_p + lat_m + q * lat_m / cap_m,
    }
    terms["bound"] = max(terms.values())
    return terms


def peer_baseline(inputs, participant_url: str, model_url: str, top_k: int, threads: int = 10,
                  n_samples: int | None = None) -> dict[str, Any]:
    """The orchestration peers use: ``threads`` threads over conversations, everything sequential inside.

    Runs the first ``n_samples`` samples (default all); each thread reads its sample's row from the inputs.

    Same servers, same requests and the same prompts as the pipeline (context fitted and grouped by
    speaker as the Answer stage does); only the orchestration differs. No sleeps are added (several
    peer harnesses sleep 1 s between calls; this baseline is generous to them).
    """
    import httpx
    import openai

    from aml_ray.models.context import fit_context, speaker_blocks
    from aml_ray.prompts import load_prompt

    answer_prompt, judge_prompt = load_prompt("locomo_answer"), load_prompt("locomo_judge")

    def conversation(index: int) -> int:
        row = inputs.sample_row(index)
        done = 0
        with httpx.Client(timeout=60) as http, openai.OpenAI(base_url=model_url, api_key="x", max_retries=0) as llm:
            for add in json.loads(row["adds_json"]):
                http.post(f"{participant_url}/add", json=add).raise_for_status()
            for q in row["questions"]:
                resp = http.post(f"{participant_url}/search",
                                 json={"query": q["question"], "user_id": q["user_id"], "top_k": top_k})
                data = [{"id": m["id"], "content": m["content"], "score": m.get("score"),
                         "created_at": m.get("created_at")} for m in resp.json()["data"]]
                memories = fit_context(data, 16_000, "loopback-model").memories
                answer = llm.chat.completions.create(model="loopback-model", temperature=0, messages=[
                    {"role": "user", "content": answer_prompt.render(
                        question=q["question"], speakers=q["speakers"] or [],
                        memory_blocks=speaker_blocks(memories, q["speakers"] or []))}],
                ).choices[0].message.content
                llm.chat.completions.create(model="loopback-model", temperature=0, messages=[
                    {"role": "user", "content": judge_prompt.render(question=q["question"], gold=q["gold"],
                                                                    answer=answer)}])
                done += 1
        return done

    n = inputs.n_samples if n_samples is None else min(n_samples, inputs.n_samples)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        done = sum(pool.map(conversation, range(n)))
    return {"wall_s": time.perf_counter() - t0, "questions": done, "samples": n}


def _per_second(stats: dict[str, Any], kind: str, t_zero: float) -> list[int]:
    """Arrivals of ``kind`` per second since ``t_zero`` (the first participant request; same clock)."""
    line = {int(k): v for k, v in stats["timeline"].get(kind, {}).items()}
    if not line:
        return []
    offset = int((stats["first"][kind] - t_zero) * 10)
    last = max(line) + offset
    out = [0] * (last // 10 + 1)
    for bucket, n in line.items():
        out[(bucket + offset) // 10] += n
    return out


def e2e_run(args) -> dict[str, Any]:
    from aml_ray.config import ModelEndpoint
    from aml_ray.run.pipeline import PipelineOptions

    shape = locomo_shape(args.scale)
    tmp = tempfile.TemporaryDirectory(prefix="aml-bench-inputs-")
    t0 = time.perf_counter()
    inputs = synthetic_inputs(shape, Path(tmp.name))
    build_s = time.perf_counter() - t0
    lat_p, lat_m = args.latency_ms / 1000, args.model_latency_ms / 1000
    with ServerProcess("participant", "--latency-ms", str(args.latency_ms), "--capacity", str(args.concurrency),
                       "--memories", str(args.memories), "--http", args.participant_http) as part, \
         ServerProcess("model", "--latency-ms", str(args.model_latency_ms),
                       "--capacity", str(2 * args.model_concurrency)) as model:
        if args.offline_models:
            from aml_ray.config import model_endpoint_from_env

            endpoints = [model_endpoint_from_env(role, {}) for role in ("answer", "judge")]
        else:
            endpoints = [ModelEndpoint(role=role, base_url=f"{model.base_url}/v1", model="loopback-model",
                                       max_in_flight=args.model_concurrency) for role in ("answer", "judge")]
        pipe = run_ray_pipeline(inputs, part.base_url, args.concurrency, *endpoints, top_k=args.top_k,
                                options=pipeline_options(args, PipelineOptions),
                                exclude_pids={part.proc.pid, model.proc.pid}, nodes=args.nodes)
        ps, ms = part.stats(), model.stats()
        rates = {}
        for kind, st in (("add", ps), ("search", ps), ("answer", ms), ("judge", ms)):
            n = st["n"].get(kind, 0)
            span = st["last"].get(kind, 0) - st["first"].get(kind, 0)
            rates[kind] = {"n": n, "rate": (n - 1) / span if n > 1 and span > 0 else None}
        first_add = min(ps["first"].values())
        last_judge = ms["last"].get("judge", ps["last"].get("search", first_add))  # offline: the last Search
        pipe.update(phases={"pools_until_first_add_s": first_add - pipe["mono_start"],
                            "first_add_to_last_judge_s": last_judge - first_add,
                            "last_judge_to_return_s": pipe["mono_end"] - last_judge})
        pipe.update(rates=rates, participant_max_in_flight=ps["max_in_flight"], over_capacity=ps["over_capacity"],
                    model_max_in_flight=ms["max_in_flight"],
                    timelines={k: _per_second(st, k, t_zero=min(ps["first"].values()))
                               for k, st in (("add", ps), ("search", ps), ("answer", ms), ("judge", ms))})
        assert pipe["scored"] == inputs.n_scorable, (pipe["scored"], inputs.n_scorable)
        peer = None
        if not (args.skip_peer or args.offline_models):
            part.reset()
            model.reset()
            n_peer = min(args.peer_samples or (shape.samples if args.scale == 1 else 10), shape.samples)
            peer = peer_baseline(inputs, part.base_url, f"{model.base_url}/v1", args.top_k, n_samples=n_peer)
            rounds_all, rounds_sub = math.ceil(shape.samples / 10), math.ceil(n_peer / 10)
            peer["extrapolated_wall_s"] = peer["wall_s"] * rounds_all / rounds_sub
    bound = lower_bound(inputs, lat_p, args.add_latency_ms / 1000 if args.add_latency_ms else lat_p,
                        args.concurrency, 0.0 if args.offline_models else lat_m,
                        args.model_concurrency)
    tmp.cleanup()
    return {"shape": asdict(shape), "chunks": inputs.n_chunks, "questions": inputs.n_scorable,
            "build_inputs_s": build_s, "pipeline": pipe, "bound": bound, "peer": peer}


# --------------------------------------------------------------------------------------------- report


def pipeline_options(args, cls):
    kw = {}
    for name in ("ingest_parallelism", "batches_in_flight", "model_batch_size", "samples_per_task"):
        value = getattr(args, name)
        if value is not None:
            kw[name] = value
    return cls(**kw)


def _med(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f} MiB"


def _rate(n: float | None) -> str:
    return "-" if n is None else f"{n:,.0f} req/s"


def report_search(args, runs: list[dict[str, Any]]) -> None:
    ideal = runs[0]["ideal"]
    get = lambda path: [_dig(r, path) for r in runs]  # noqa: E731
    label = {"retrieval": "pipeline, retrieval-only", "full": "pipeline, + offline Answer/Judge"}
    rows = [("plain asyncio loop, aiohttp", "plain_aiohttp"), ("plain aiohttp loop on uvloop", "plain_uvloop"),
            ("plain asyncio loop, httpx+aiohttp", "plain_httpx_aiohttp"),
            ("ParticipantClient actor alone", "client_actor"),
            ("aml-ray " + label[runs[0]["pipeline"]["kind"]], "pipeline")]
    if all("pipeline_full" in r for r in runs):
        rows.append(("aml-ray " + label["full"], "pipeline_full"))
    print(f"\nSearch throughput: {args.queries:,} Searches over {args.samples} samples, {args.latency_ms:g} ms "
          f"participant latency, {args.concurrency} in flight "
          f"({'median of ' + str(len(runs)) if len(runs) > 1 else '1 run'}; arrivals at the server: whole run "
          "(N-1)/(last-first), and steady state over the middle 80% of arrivals)" + _nodes_note(args, runs))
    print(f"  {'ideal (concurrency / latency)':<42}{_rate(ideal):>13}")
    print(f"  {'':<42}{'whole run':>13}  {'x ideal':>7}  {'x plain':>7}   {'steady':>13}  {'x ideal':>7}  {'x plain':>7}")
    for name, key in rows:
        cells = []
        for metric in ("rate", "steady"):
            value = _med(get(f"{key}.{metric}"))
            vs_plain = _med([r[key][metric] / r["plain_aiohttp"][metric] for r in runs
                             if r[key].get(metric) and r["plain_aiohttp"].get(metric)])
            cells.append(f"{_rate(value):>13}  {value / ideal if value else 0:>7.2f}  "
                         f"{vs_plain if vs_plain is not None else 0:>7.2f}")
        print(f"  {name:<42}{cells[0]}   {cells[1]}")
    print("  (x plain: same-run ratio to the plain aiohttp loop, which runs as a small process of its own; "
          "the client actor alone is fed by this process "
          "as Ingest feeds it, without Ray Data, Ingest or Adds; the full pipeline's 2 cores also run the offline "
          "answerer and judge, which a plain loop does not)")
    vs_uv = [_med([r["pipeline"][m] / r["plain_uvloop"][m] for r in runs if r["pipeline"].get(m) and r["plain_uvloop"].get(m)])
             for m in ("rate", "steady")]
    if None not in vs_uv:
        print(f"  the pipeline against the plain loop on uvloop (the event loop of Ray's actors, the participant client's "
              f"included), same run: {vs_uv[0]:.2f} (steady {vs_uv[1]:.2f})")
    print(f"  client CPU of the plain loops per {args.queries:,} Searches: aiohttp "
          f"{_med(get('plain_aiohttp.client_cpu_s')):.2f} s, on uvloop {_med(get('plain_uvloop.client_cpu_s')):.2f} s, "
          f"httpx+aiohttp {_med(get('plain_httpx_aiohttp.client_cpu_s')):.2f} s")
    print(f"  the loopback participant's own CPU per Search ({args.participant_http} server, during the plain aiohttp loop; "
          f"it shares the 2 cores with the client): {_med(get('plain_aiohttp.server_cpu_s')) / args.queries * 1e6:.0f} us")
    per_search = [("plain aiohttp loop", _med([r["plain_aiohttp"]["client_cpu_s"] / args.queries for r in runs])),
                  ("client actor alone", _med([r["client_actor"].get("actor_cpu_s", 0) / args.queries for r in runs])),
                  ("the pipeline's client actor (steady state)",
                   _med([(r["pipeline"].get("steady_cpu") or {}).get("ray::ParticipantClient", 0) / r["pipeline"]["steady"]
                         for r in runs if r["pipeline"].get("steady")]))]
    print("  client CPU per Search: " + ", ".join(f"{name} {v * 1e6:.0f} us" for name, v in per_search if v))
    print(f"  per run, steady: pipeline {', '.join(f'{r:,.0f}' for r in get('pipeline.steady'))}; "
          f"plain aiohttp {', '.join(f'{r:,.0f}' for r in get('plain_aiohttp.steady'))}; "
          f"on uvloop {', '.join(f'{r:,.0f}' for r in get('plain_uvloop.steady'))}; "
          f"plain httpx+aiohttp {', '.join(f'{r:,.0f}' for r in get('plain_httpx_aiohttp.steady'))}")
    what = "Adds+Searches" if runs[0]["pipeline"]["kind"] == "retrieval" else "Adds+Searches+Answers+Judges"
    print(f"  wall: Ray start {_med(get('pipeline.ray_start_s')):.1f} s + run_pipeline (actor pools, "
          f"{args.queries:,} {what}, evidence) {_med(get('pipeline.pipeline_s')):.1f} s = "
          f"end to end {_med(get('pipeline.end_to_end_s')):.1f} s; plain aiohttp loop "
          f"{_med(get('plain_aiohttp.wall_s')):.1f} s")
    _print_load(runs)
    print(f"  peak RSS: driver {_mib(_med(get('pipeline.driver_peak_rss')))}, largest Ray worker "
          f"{_mib(_med(get('pipeline.worker_peak_rss')))} ({runs[0]['pipeline']['worker_peak_name']}) "
          "(the Ray processes' PSS is summed in --mode e2e only: reading it costs the driver CPU)")
    _print_driver_memory(args, runs)
    _print_cpu(args, runs)
    _print_timeline(args, runs)
    lat = runs[0]["pipeline"].get("search_latency_ms") or {}
    if lat:
        print(f"  Search latency seen by the ParticipantClient (send to reply read), run 1: p50 {lat['p50']:.1f} ms, "
              f"p95 {lat['p95']:.1f} ms (the server holds each for {args.latency_ms:g} ms)")
    _print_server_lateness(args, runs, rows)
    print(f"  participant saw at most {max(get('pipeline.server_max_in_flight'))} in flight "
          f"(declared {args.concurrency}); over capacity: {max(get('pipeline.over_capacity'))}")
    _print_steady_cpu(runs)


def _print_server_lateness(args, runs: list[dict[str, Any]], rows: list[tuple[str, str]]) -> None:
    """How late the loopback server resumed each Search after its set latency, per measurement (median of runs).

    The client's Search latency is the server's hold, the server's own lag and the client's: this line
    tells whether the pipeline's other processes slowed the server (a cost of sharing 2 cores with the
    participant that a remote participant would not pay) or the client.
    """
    cells = []
    for name, key in rows:
        late = [r[key].get("server_late_ms") for r in runs if r[key].get("server_late_ms")]
        if late:
            cells.append(f"{name.replace('aml-ray ', '')} {_med([x['p50'] for x in late]):.2f}/"
                         f"{_med([x['p95'] for x in late]):.2f}")
    if cells:
        print(f"  the server's lag in resuming a Search after its {args.latency_ms:g} ms (p50/p95 ms): " + "; ".join(cells))


def _print_steady_cpu(runs: list[dict[str, Any]]) -> None:
    """Cores each process used while Searches arrived (median of runs): what the pipeline's 2 cores share."""
    steady = [r["pipeline"].get("steady_cpu") or {} for r in runs]
    names = sorted({k for s in steady for k in s}, key=lambda k: -(_med([s.get(k, 0.0) for s in steady]) or 0))
    cores = {k: _med([s.get(k, 0.0) for s in steady]) or 0.0 for k in names}
    if not cores:
        return
    plain = _med([r["plain_aiohttp"]["client_cpu_s"] / r["plain_aiohttp"]["wall_s"] for r in runs])
    print(f"  cores used between the first and last Search arrival (median of {len(runs)}; the loopback server not "
          f"counted): {sum(cores.values()):.2f} in all; " + ", ".join(f"{k} {v:.2f}" for k, v in cores.items() if v >= 0.01)
          + f" (the plain aiohttp loop's client: {plain:.2f})")


def report_e2e(args, runs: list[dict[str, Any]]) -> None:
    r0 = runs[0]
    get = lambda path: [_dig(r, path) for r in runs]  # noqa: E731
    sh = r0["shape"]
    print(f"\nSynthetic LoCoMo x{args.scale}: {sh['samples']} samples x {sh['sessions']} sessions x {sh['turns']} turns "
          f"= {r0['chunks']:,} Add chunks, {r0['questions']:,} questions; participant {args.latency_ms:g} ms / "
          f"{args.concurrency} in flight; "
          + ("offline answerer and judge " if args.offline_models else
             f"models {args.model_latency_ms:g} ms / {args.model_concurrency} in flight each ")
          + f"({'median of ' + str(len(runs)) if len(runs) > 1 else '1 run'})" + _nodes_note(args, runs))
    b = r0["bound"]
    terms = ", ".join(f"{k} {v:.1f} s" for k, v in b.items() if k != "bound")
    print(f"  lower bound from the declared limits     {b['bound']:8.1f} s   ({terms})")
    pipe_s, e2e_s = _med(get("pipeline.pipeline_s")), _med(get("pipeline.end_to_end_s"))
    ph = {k: _med(get(f"pipeline.phases.{k}")) for k in r0["pipeline"]["phases"]}
    print(f"  inside run_pipeline: actor pools start until the first Add {ph['pools_until_first_add_s']:.1f} s, "
          f"first Add to last Judge {ph['first_add_to_last_judge_s']:.1f} s "
          f"({ph['first_add_to_last_judge_s'] / b['bound']:.2f} x bound), last Judge to return "
          f"{ph['last_judge_to_return_s']:.1f} s")
    print(f"  run_pipeline wall (actor pools + run)    {pipe_s:8.1f} s   {pipe_s / b['bound']:.2f} x bound")
    print(f"  end to end (+ Ray start {_med(get('pipeline.ray_start_s')):.1f} s)          {e2e_s:8.1f} s   "
          f"{e2e_s / b['bound']:.2f} x bound   (per run: {', '.join(f'{v:.1f}' for v in get('pipeline.end_to_end_s'))})")
    for kind in ("add", "search", "answer", "judge"):
        print(f"  {kind:<7} {_med(get(f'pipeline.rates.{kind}.n')):>9,.0f} requests  "
              f"{_rate(_med(get(f'pipeline.rates.{kind}.rate'))):>14} (steady state at the server)")
    _print_load(runs)
    print(f"  peak RSS: driver {_mib(_med(get('pipeline.driver_peak_rss')))}, largest Ray worker "
          f"{_mib(_med(get('pipeline.worker_peak_rss')))} ({r0['pipeline']['worker_peak_name']}), all Ray processes "
          f"{_mib(_med(get('pipeline.ray_total_peak_pss')))} (PSS)")
    _print_cpu(args, runs)
    _print_driver_memory(args, runs)
    if args.verbose:
        print("  processes first seen (s after run_pipeline started): " + ", ".join(
            f"{k} {v:+.1f}" for k, v in r0["pipeline"]["first_seen"].items() if k.startswith("ray::")))
        for kind, line in r0["pipeline"]["timelines"].items():
            print(f"  {kind} per second (run 1, since the first Add): {line}")
    print(f"  participant max in flight {max(get('pipeline.participant_max_in_flight'))} (declared {args.concurrency}), "
          f"model server max in flight {max(get('pipeline.model_max_in_flight'))} (declared 2 x {args.model_concurrency})")
    if r0["peer"]:
        pw = _med(get("peer.wall_s"))
        px = _med(get("peer.extrapolated_wall_s"))
        n_peer = r0["peer"]["samples"]
        extra = "" if n_peer == sh["samples"] else (
            f" measured on {n_peer} of {sh['samples']} samples ({math.ceil(n_peer / 10)} round(s) of the thread "
            f"pool), extrapolated linearly to {math.ceil(sh['samples'] / 10)} rounds")
        print(f"  peer-style baseline (10 threads x conversations, sequential inside): {pw:.1f} s{extra} "
              f"-> {px:.1f} s; pipeline end to end is {px / e2e_s:.1f} x faster "
              f"(run_pipeline alone {px / pipe_s:.1f} x)")


def _print_driver_memory(args, runs: list[dict[str, Any]]) -> None:
    if not args.verbose:
        return
    p = runs[0]["pipeline"]
    print(f"  driver RSS, run 1: {_mib(p['driver_rss_before_ray'])} with the inputs built, before Ray; "
          f"{_mib(p['driver_rss_during'])} at most while the pipeline ran; {_mib(p['driver_rss_after'])} after "
          "run_pipeline returned (the summary columns of the question evidence read back); of the driver's RSS at most "
          f"{_mib(p['driver_anon_peak'])} was private (RssAnon) and {_mib(p['driver_shmem_peak'])} object-store "
          "pages it mapped (RssShmem, shared with the store)")


def _print_load(runs: list[dict[str, Any]]) -> None:
    loads = ", ".join(f"{r['pipeline']['loadavg_start']:.1f}->{r['pipeline']['loadavg_end']:.1f}" for r in runs)
    print(f"  machine load average (1 min) at Ray start -> end, per run: {loads} "
          f"({os.cpu_count()} CPUs; other users' processes count too)")
    if all("steal" in r["pipeline"] and "steal" in r.get("plain_aiohttp", {}) for r in runs):
        steal = ", ".join(f"{r['plain_aiohttp']['steal']:.1%} / {r['pipeline']['steal']:.1%}" for r in runs)
        print(f"  CPU time the host took from this virtual machine (steal), plain aiohttp loop / pipeline, per run: {steal}")


def _nodes_note(args, runs: list[dict[str, Any]]) -> str:
    warm = ("\n  warm Ray: a 100-question job ran first on the same Ray (Ray Data's own actors up, as in the "
            "service's worker); Ray start excludes it") if getattr(args, "warm", False) else ""
    if args.nodes == 1:
        return warm
    spread = sorted({r["pipeline"].get("stage_nodes") for r in runs})
    return (f"\n  on a {args.nodes}-node local cluster (ray.cluster_utils.Cluster, CPUs split between nodes); "
            f"stage actors ran on {'/'.join(map(str, spread))} node(s)")


def _print_cpu(args, runs: list[dict[str, Any]]) -> None:
    if not args.verbose:
        return
    for i, r in enumerate(runs):
        cpu = r["pipeline"]["cpu_s"]
        print(f"  CPU s, run {i + 1} (machine {100 * r['pipeline']['machine_busy']:.0f}% busy during run_pipeline): "
              f"driver {r['pipeline']['driver_cpu_s']:.1f}; "
              + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items() if v >= 0.2))
        # the figure that compares across runs and machines better than req/s: CPU per question
        per_q = 1000 / max(1, r["pipeline"]["questions"])
        total = r["pipeline"]["driver_cpu_s"] + sum(cpu.values())
        print(f"  CPU ms per question, run {i + 1} (Ray start to the end, every process's start-up included; "
              "the loopback servers not counted): "
              f"{total * per_q:.2f} in all; driver (while run_pipeline ran) {r['pipeline']['driver_cpu_s'] * per_q:.3f}; "
              + ", ".join(f"{k} {v * per_q:.3f}" for k, v in cpu.items() if v * per_q >= 0.01))


def _print_timeline(args, runs: list[dict[str, Any]]) -> None:
    if not args.verbose:
        return
    for i, r in enumerate(runs):
        line = r["pipeline"].get("timeline") or {}
        if line:
            last = max(int(k) for k in line)
            per_s = [sum(line.get(str(b), line.get(b, 0)) for b in range(s, s + 10)) for s in range(0, last + 1, 10)]
            print(f"  Searches per second at the server, run {i + 1}: {per_s}")


def _dig(d: dict[str, Any], path: str):
    for part in path.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="aml-ray pipeline benchmark (see the module docstring)")
    p.add_argument("--mode", choices=["search", "e2e", "serial"], default="search")
    p.add_argument("--serial-samples", type=int, default=2, help="--mode serial: LoCoMo samples")
    p.add_argument("--service-scale", type=float, default=1.0,
                   help="--mode serial: the serial participant's service times (35 ms Search, 300 ms Add) times this")
    p.add_argument("--serial-participants", choices=["both", "serial", "fast"], default="both",
                   help="--mode serial: which participants")
    p.add_argument("--num-cpus", type=int, default=2, help="--mode serial: aml-ray run --num-cpus")
    p.add_argument("--queries", type=int, default=10_000, help="Searches in --mode search")
    p.add_argument("--latency-ms", type=float, default=20.0, help="participant latency")
    p.add_argument("--add-latency-ms", type=float, default=None, help="participant Add latency (default: --latency-ms)")
    p.add_argument("--concurrency", type=int, default=64, help="participant max in flight (declared capacity)")
    p.add_argument("--participant-http", choices=["lean", "aiohttp"], default="lean",
                   help="the loopback participant's HTTP server: asyncio protocols with httptools (lean: about 120-145 us "
                        "of CPU per request on 2 cores) or aiohttp's web server (about 2.5 x that; the server up to stop 18). "
                        "It shares the cores with the client it serves, so its CPU is taken from what is measured")
    p.add_argument("--memories", type=int, default=10, help="items per Search reply")
    p.add_argument("--samples", type=int, default=100,
                   help="--mode search: samples the questions are spread over (one small Add chunk each; "
                        "LoCoMo has 10)")
    p.add_argument("--pipeline", choices=["both", "retrieval", "full"], default="both",
                   help="--mode search: the retrieval-only pipeline (Add+Search, what the plain loops do), the full "
                        "one with the offline answerer and judge, or both (default), each on a fresh Ray")
    p.add_argument("--top-k", type=int, default=100)
    p.add_argument("--scale", type=int, default=1, choices=[1, 10, 100], help="--mode e2e corpus scale")
    p.add_argument("--model-latency-ms", type=float, default=200.0)
    p.add_argument("--model-concurrency", type=int, default=32, help="max in flight per model endpoint")
    p.add_argument("--offline-models", action="store_true",
                   help="--mode e2e with the offline answerer and judge (no model server; memory scaling)")
    p.add_argument("--skip-peer", action="store_true")
    p.add_argument("--source-compile", action="store_true",
                   help="--mode serial: remove aml_ray's bytecode cache first, so every process of both commands "
                        "compiles the package from source (an editable install under PYTHONDONTWRITEBYTECODE=1); "
                        "default: compile it first, as a regular install has it")
    p.add_argument("--peer-samples", type=int, default=None,
                   help="run the peer baseline on the first N samples only and extrapolate linearly by rounds "
                        "of the 10-thread pool (default: all at --scale 1, 10 = one round above)")
    p.add_argument("--repeat", type=int, default=1, help="independent runs, each in a fresh process; median")
    p.add_argument("--json", type=Path, default=None, help="also write all runs' figures here")
    for name in ("ingest-parallelism", "batches-in-flight", "model-batch-size", "samples-per-task"):
        p.add_argument(f"--{name}", type=int, default=None, help="PipelineOptions override")
    p.add_argument("--nodes", type=int, default=1, help="local Ray nodes (2: ray.cluster_utils.Cluster, CPUs split)")
    p.add_argument("--warm", action="store_true",
                   help="--mode search: run a small job first on the same Ray, then measure (a service's warm Ray)")
    p.add_argument("--verbose", action="store_true", help="also print CPU seconds per process")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.add_latency_ms is not None and args.mode == "search":
        raise SystemExit("--add-latency-ms applies to --mode e2e")
    if args.mode == "serial":
        from bench_serial import report_serial, serial_run

        report_serial(args, [serial_run(args) for _ in range(args.repeat)])
        return
    run = search_run if args.mode == "search" else e2e_run
    if args.child or args.repeat == 1:
        result = run(args)
        if args.child:
            print("RESULT " + json.dumps(result), flush=True)
            return
        runs = [result]
    else:
        runs = []
        child_argv = [a for a in (argv if argv is not None else sys.argv[1:])]
        for i in range(args.repeat):
            proc = subprocess.run([sys.executable, __file__, *child_argv, "--child"], capture_output=True, text=True)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode != 0 or not lines:
                sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
                raise SystemExit(f"run {i + 1} failed (exit {proc.returncode})")
            runs.append(json.loads(lines[-1][len("RESULT "):]))
            print(f"run {i + 1}/{args.repeat} done", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs}, indent=2))
    (report_search if args.mode == "search" else report_e2e)(args, runs)


if __name__ == "__main__":
    main()
