"""The Textual suite against a participant with a declared capacity and rate-limited hosted-like models.

Runs the real command, ``aml-ray run --suite textual --limit-samples N``, over every bundle present in
``--datasets-dir`` (default ``/work/shared/datasets``), against:

- the loopback participant of ``scripts/loopback_servers.py``: Add ``--add-ms`` and Search ``--search-ms``
  (times ``--service-scale``), at most ``--capacity`` served at once (declared as ``--max-in-flight``);
- the hosted-API-like endpoint of ``scripts/model_endpoint.py``: lognormal latency (``--p50-ms``,
  ``--p99-ms``), per-model ``--rpm``/``--tpm`` (the answer model and the judge model are different models,
  each with its own limits, as on a hosted API), buckets holding ``--window-s`` of budget (60 by default; 1:
  enforced per second), each request charged ``--charge-factor`` times its token count (1 by default; more: an
  API whose own estimate runs above the client's), its clock ``--time-scale`` times real time; the clients
  declare ``rpm / time-scale`` and ``tpm / time-scale``, and hold ``0.5 x time-scale`` seconds of budget (the
  default half second, in the endpoint's clock).

The bundles run at once by default (``--bundles-at-once N`` as the command's). Prints the command's wall time
against the binding bound: the largest of the participant's busy time
at its capacity (Adds x Add time + Searches x Search time, / capacity) and for each model its charged tokens at its TPM and its calls at its RPM (the endpoint's own
counts); each model's tokens charged per tenth of the wall against its TPM; the 429 share; the driver's and each bundle runner's peak RSS (VmHWM, polled); per bundle the Add and Search queue wait
against their service time (run.json) and the model endpoint's calls and service time. Example::

    .venv/bin/python scripts/bench_suite.py --limit-samples 1
    .venv/bin/python scripts/bench_suite.py --limit-samples 10     # the x10 slice: driver memory
    .venv/bin/python scripts/bench_suite.py --limit-samples 10 --warm   # joining a warm cluster (aml-ray cluster up)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_pipeline import _proc_status  # noqa: E402
from loopback_servers import ServerProcess  # noqa: E402

ANSWER_MODEL, JUDGE_MODEL = "gpt-4o-mini", "gpt-4o"
#: The endpoint tags each call with its prompt's first words: each bundle's answer and judge prompts open
#: differently, so a tag names a bundle's role.
PROMPT_TAG = r"\A\W*(\w+(?:\W+\w+){0,5})"


def run_suite(args, participant: str, model_base: str, out: Path) -> dict[str, Any]:
    """``aml-ray run --suite``; wall time, exit code and the driver's peak RSS (polled every 0.2 s)."""
    ts = args.time_scale
    env = {**os.environ, "AML_MODEL_CACHE": "off", "RAY_USAGE_STATS_ENABLED": "0"}
    for role, model in (("ANSWER", ANSWER_MODEL), ("JUDGE", JUDGE_MODEL)):
        env.update({f"{role}_API_BASE": f"{model_base}/v1", f"{role}_MODEL": model, f"{role}_API_KEY": "sk-bench",
                    f"{role}_RPM": str(args.rpm / ts), f"{role}_TPM": str(args.tpm / ts),
                    f"{role}_MAX_IN_FLIGHT": str(args.model_in_flight),
                    # the client's burst window in the endpoint's clock as at the hosted rates (0.5 s, the default)
                    f"{role}_RATE_WINDOW_S": str(0.5 * ts)})
    cmd = [str(Path(sys.executable).parent / "aml-ray"), "run", "--suite", "textual", "--datasets-dir",
           str(args.datasets_dir), "--limit-samples", str(args.limit_samples), "--participant", participant,
           "--max-in-flight", str(args.capacity), "--out", str(out), "--num-cpus", str(args.num_cpus),
           "--allow-hash-mismatch"] + (["--bundles-at-once", str(args.bundles_at_once)] if args.bundles_at_once else [])
    t0, started = time.perf_counter(), time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak, runners, names = [0], {}, {}

    def poll() -> None:
        n = 0
        while proc.poll() is None:
            peak[0] = max(peak[0], _proc_status(proc.pid).get("VmHWM", 0))
            if n % 5 == 0:  # the bundle runners' peaks, once a second, and which bundle each runs
                runners.update(_runner_peaks())
                names.update(_running_bundles(out))
            n += 1
            time.sleep(0.2)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    output, _ = proc.communicate()
    wall = time.perf_counter() - t0
    watcher.join()
    return {"wall_s": wall, "started": started, "rc": proc.returncode, "driver_peak_rss": peak[0], "runner_peak_rss": {names.get(pid, f"pid {pid}"): rss for pid, rss in runners.items()},
            "tail": output[-3000:]}


@contextlib.contextmanager
def warm_cluster(args):
    """With ``--warm``: ``aml-ray cluster up --num-cpus N`` before the block (the run then joins it, as an
    operator's runs do on a warm cluster), ``aml-ray cluster down`` after it; else nothing."""
    if not args.warm:
        yield
        return
    cli = str(Path(sys.executable).parent / "aml-ray")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run([cli, "cluster", "up", "--num-cpus", str(args.num_cpus)], env=env, check=True,
                   capture_output=True, text=True)
    try:
        yield
    finally:
        subprocess.run([cli, "cluster", "down"], env=env, check=False, capture_output=True, text=True)


def _runner_peaks() -> dict[int, int]:
    """Peak RSS (VmHWM, bytes) of each running ``ray::BundleRunner`` process (a bundle's evaluation), by pid.

    A child a runner forks (``subprocess`` before its ``exec``) carries the runner's title and, at first,
    its resident pages: it is not a runner, and is left out."""
    import psutil

    titled = {proc.pid: proc.info["ppid"] for proc in psutil.process_iter(["cmdline", "ppid"])
              if (proc.info["cmdline"] or [""])[0].startswith("ray::BundleRunner")}
    found = {pid: _proc_status(pid).get("VmHWM", 0) for pid, parent in titled.items() if parent not in titled}
    return {pid: rss for pid, rss in found.items() if rss}


def _running_bundles(out: Path) -> dict[int, str]:
    """``{pid: bundle}`` of the runs under ``out`` whose run.json names the process running them."""
    found = {}
    for path in out.glob("*/run.json"):
        try:
            process = json.loads(path.read_text()).get("process") or {}
        except (OSError, ValueError):  # being written
            continue
        if process.get("pid"):
            found[int(process["pid"])] = path.parent.name
    return found


def utilisation(admitted: list[list[float]], start: float, wall_s: float, per_s: float, parts: int = 10) -> list[float]:
    """Tokens charged in each of ``parts`` equal slices of the command's wall (``admitted``: the endpoint's
    ``(time.monotonic(), tokens)`` per admitted call; ``start``: the command's start on the same clock), each
    over what ``per_s`` tokens a second allow in a slice."""
    width = wall_s / parts
    used = [0.0] * parts
    for t, tokens in admitted:
        used[min(parts - 1, max(0, int((t - start) / width)))] += tokens
    return [u / (per_s * width) for u in used]


def bundle_runs(out: Path) -> dict[str, dict[str, Any]]:
    """Each bundle's run.json under the suite's run directory."""
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(out.glob("*/run.json"))}


def bound(args, part: dict[str, Any], models: dict[str, Any], runs: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The binding bound's terms, seconds (see the module docstring)."""
    add_s, search_s = args.add_ms * args.service_scale / 1000, args.search_ms * args.service_scale / 1000
    adds, searches = part["n"].get("add", 0), part["n"].get("search", 0)
    terms = {"participant busy at capacity": (adds * add_s + searches * search_s) / args.capacity}
    for model, st in models.items():
        terms[f"{model} tokens at TPM"] = st["tokens_charged"] / (args.tpm / 60 / args.time_scale)
        terms[f"{model} calls at RPM"] = st["ok"] / (args.rpm / 60 / args.time_scale)
    return terms


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets-dir", type=Path, default=Path("/work/shared/datasets"))
    p.add_argument("--limit-samples", type=int, default=1)
    p.add_argument("--add-ms", type=float, default=300.0)
    p.add_argument("--search-ms", type=float, default=35.0)
    p.add_argument("--service-scale", type=float, default=0.1, help="participant service times x this")
    p.add_argument("--capacity", type=int, default=8, help="participant's requests at once (declared)")
    p.add_argument("--p50-ms", type=float, default=700.0)
    p.add_argument("--p99-ms", type=float, default=5000.0)
    p.add_argument("--rpm", type=float, default=500.0, help="per model, endpoint clock")
    p.add_argument("--tpm", type=float, default=200_000.0, help="per model, endpoint clock")
    p.add_argument("--time-scale", type=float, default=0.05, help="endpoint seconds -> real seconds")
    p.add_argument("--model-in-flight", type=int, default=32)
    p.add_argument("--num-cpus", type=int, default=2)
    p.add_argument("--bundles-at-once", type=int, default=None, help="aml-ray run --bundles-at-once (default: all)")
    p.add_argument("--window-s", type=float, default=60.0,
                   help="seconds of budget the endpoint's buckets hold (60: a minute's burst; 1: enforced per second)")
    p.add_argument("--charge-factor", type=float, default=1.0,
                   help="the endpoint charges each request this many times its token count (its own estimate)")
    p.add_argument("--warm", action="store_true",
                   help="start the warm cluster first (aml-ray cluster up, not timed), which the run joins; down after")
    args = p.parse_args(argv)
    load0 = os.getloadavg()[0]
    part_flags = ["--latency-ms", str(args.search_ms * args.service_scale),
                  "--add-latency-ms", str(args.add_ms * args.service_scale), "--capacity", str(args.capacity)]
    model_flags = ["--p50-ms", str(args.p50_ms), "--p99-ms", str(args.p99_ms), "--rpm", str(args.rpm),
                   "--tpm", str(args.tpm), "--time-scale", str(args.time_scale), "--window-s", str(args.window_s),
                   "--charge-factor", str(args.charge_factor), "--tag-regex", PROMPT_TAG]
    keep = Path(tempfile.mkdtemp(prefix="bench_suite_keep_"))
    with tempfile.TemporaryDirectory(prefix="bench_suite_") as tmp, \
            ServerProcess("participant", *part_flags) as part, ServerProcess("hosted", *model_flags) as model:
        with warm_cluster(args):
            res = run_suite(args, part.base_url, model.base_url, Path(tmp) / "suite")
        pstats, hosted = part.stats(), model.stats()
        mstats = hosted["models"]
        runs = bundle_runs(Path(tmp) / "suite")
        (keep / "suite.json").write_text((Path(tmp) / "suite" / "suite.json").read_text()
                                         if (Path(tmp) / "suite" / "suite.json").exists() else "{}")
        (keep / "runs.json").write_text(json.dumps(runs, default=str))
        (keep / "tail.txt").write_text(res["tail"])
    load1 = os.getloadavg()[0]
    if res["rc"] not in (0, 1):
        raise SystemExit(f"aml-ray run exited {res['rc']}:\n{res['tail']}")
    terms = bound(args, pstats, mstats, runs)
    b = max(terms.values())
    calls = sum(m["calls"] for m in mstats.values())
    rejected = sum(m["rejected_429"] for m in mstats.values())
    print(f"Textual suite, --limit-samples {args.limit_samples}, bundles run: {', '.join(runs) or 'none'} "
          f"(exit {res['rc']}); participant Add {args.add_ms * args.service_scale:g} ms / Search "
          f"{args.search_ms * args.service_scale:g} ms, capacity {args.capacity}; models p50 {args.p50_ms:g} / p99 "
          f"{args.p99_ms:g} ms, {args.rpm:g} RPM / {args.tpm:,.0f} TPM each, time scale {args.time_scale:g}")
    print(f"  wall {res['wall_s']:.1f} s = {res['wall_s'] / b:.2f} x the binding bound {b:.1f} s  ("
          + "; ".join(f"{k} {v:.1f} s" for k, v in terms.items()) + ")")
    for model, st in mstats.items():
        print(f"  {model} tokens charged per tenth of the wall, as a share of its TPM: "
              + " ".join(f"{u:.0%}" for u in utilisation(st.get("admitted", []), res["started"], res["wall_s"],
                                                          args.tpm / 60 / args.time_scale)))
    by_tag: dict[str, list] = {}
    span: dict[str, tuple[float, float]] = {}
    for arrival, done, _kind, tag, status, cost in hosted.get("calls", []):
        if status == 200:
            by_tag.setdefault(tag, []).append((arrival, cost))
            first, last = span.get(tag, (arrival, done))
            span[tag] = (min(first, arrival), max(last, done))
    for tag, admitted in sorted(by_tag.items(), key=lambda kv: -sum(c for _, c in kv[1])):
        first, last = (t - res["started"] for t in span[tag])
        print(f"    {tag[:40]!r:<42} {sum(c for _, c in admitted):>9,} tokens, calls {first:.1f}-{last:.1f} s; per tenth, "
              "share of a model's TPM: " + " ".join(f"{u:.0%}" for u in utilisation(
                  admitted, res["started"], res["wall_s"], args.tpm / 60 / args.time_scale)))
    print(f"  model calls {calls:,}, 429s {rejected} ({rejected / max(1, calls):.2%}); "
          + "; ".join(f"{k}: {v['ok']} ok, {v['tokens_charged']:,} tokens charged, peak in flight {v['max_in_flight']}"
                      for k, v in mstats.items()))
    peaks = sorted(res["runner_peak_rss"].items())
    print(f"  driver peak RSS {res['driver_peak_rss'] / 2**20:.0f} MiB; bundle runners' peak RSS "
          + (", ".join(f"{k} {v / 2**20:.0f}" for k, v in peaks) + " MiB" if peaks else "none (one after another in the driver)")
          + f"; participant Adds {pstats['n'].get('add', 0):,}, "
          f"Searches {pstats['n'].get('search', 0):,}, max in flight {pstats['max_in_flight']} (capacity {args.capacity})")
    for name, r in runs.items():
        s, a = r.get("search", {}), r.get("adds", {})
        q = lambda d, k: (d.get(k) or {}).get("p50") or 0.0  # noqa: E731
        print(f"  {name:<16} {r.get('status')}: wall {r.get('wall_s', 0):.1f} s; Add queue/service p50 "
              f"{q(a, 'queue_ms'):.0f}/{q(a, 'latency_ms'):.0f} ms; Search queue/service p50 "
              f"{q(s, 'queue_ms'):.0f}/{q(s, 'latency_ms'):.0f} ms; timings " + ", ".join(
                  f"{k} {v:.1f}" for k, v in (r.get("timings") or {}).items()) + (
                  f"; {r.get('error')}" if r.get("status") != "completed" else ""))
    print(f"  suite.json, each run.json and the command's last output kept in {keep}")
    print(f"  load average (1 min) {load0:.1f} -> {load1:.1f} ({os.cpu_count()} CPUs, shared)")


if __name__ == "__main__":
    main()
