"""Drill: two participants' jobs at once on one driver, sharing the locked model endpoints.

Issue 7, item 4 ("many participants at once"). Starts, each in its own process
(:mod:`loopback_servers`): a fast participant and a slow one (each serving at most its declared
``max_in_flight``), and one OpenAI-compatible model server that logs which job every call came from.
Runs a big job on the fast participant, waits until the answer endpoint has served some of its calls
(its queue at the shared model client is full by then), then starts a small job on the slow participant;
both run :func:`aml_ray.run.pipeline.run_pipeline` in threads of this one driver. Prints per-job wall
time, each participant's observed peak in-flight vs declared, the model endpoint's peak in-flight per
role vs declared, the shared actors and the jobs holding them, and each job's share of model calls
over time.

    python scripts/drill_many_participants.py [--big-questions 400] [--model-latency-ms 40] [--json]

:func:`run_scenario` is also what ``tests/test_many_participants.py`` runs (smaller) and asserts on.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from loopback_servers import ServerProcess  # noqa: E402

#: The tag every question carries, so the model server can tell the jobs apart.
TAG_REGEX = r"\[job:([a-z]+)\]"


@dataclass(frozen=True)
class JobPlan:
    """One job of the drill.

    Attributes:
        name: the job's tag (lower-case letters; it is in every question's text).
        samples / questions: samples and questions per sample (one Add chunk per sample).
        latency_ms: the participant server's Add and Search latency.
        max_in_flight: the participant's declared capacity (the server also serves at most this many).
    """

    name: str
    samples: int
    questions: int
    latency_ms: float
    max_in_flight: int


def tagged_inputs(plan: JobPlan, run_id: str, out_dir: Path):
    """:class:`aml_ray.run.inputs.PipelineInputs` of ``plan`` built into ``out_dir``: the real chunker and id
    scheme, tagged questions."""
    from aml_ray.contract import Message
    from aml_ray.datasets.base import Question, Sample, Session
    from aml_ray.ids import IdScheme
    from aml_ray.run.inputs import build_inputs

    t0 = 1_683_554_160_000
    samples = []
    for s in range(plan.samples):
        sid = f"{plan.name}-{s:03d}"
        msgs = tuple(Message(role="user", content=f"Caroline: went to the lake on day {s} turn {t}",
                             timestamp=t0 + t * 60_000) for t in range(4))
        questions = tuple(Question(question_id=f"{sid}:q{q:04d}", sample_id=sid,
                                   question=f"[job:{plan.name}] When did Caroline go to the lake? #{q}",
                                   answer=f"day {s}", category="2") for q in range(plan.questions))
        samples.append(Sample(sample_id=sid, sessions=(Session(key="session_1", index=1, started_at_ms=t0,
                                                               messages=msgs),),
                              questions=questions, speakers=("Caroline", "Melanie")))
    return build_inputs(samples, IdScheme(run_id, "synthetic"), out_dir=out_dir)


def _run_job(plan: JobPlan, base_url: str, answer, judge, out: Path, record: dict[str, Any]) -> None:
    from aml_ray.actors.participant import ParticipantSpec
    from aml_ray.run.evidence import RunDir
    from aml_ray.run.pipeline import run_pipeline
    from aml_ray.prompts import load_prompt

    run_id = record["run_id"]
    spec = ParticipantSpec(add_url=f"{base_url}/add", search_url=f"{base_url}/search",
                           max_in_flight=plan.max_in_flight)
    record["start"] = time.monotonic()
    try:
        run_dir = RunDir(out / run_id)
        rows = run_pipeline(tagged_inputs(plan, run_id, run_dir.inputs), run_dir=run_dir, participant=spec,
                            answer=answer, judge=judge, answer_prompt=load_prompt("locomo_answer"),
                            judge_prompt=load_prompt("locomo_judge"), top_k=10, job_key=run_id)
        record["statuses"] = rows["status"].value_counts().to_dicts()
        record["scored"] = int((rows["status"] == "scored").sum())
    except BaseException as exc:  # reported by the caller, never swallowed
        record["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        record["end"] = time.monotonic()


def _model_waiting() -> dict[str, int]:
    """``{job key: requests waiting}`` summed over the cluster's shared ModelClient actors."""
    import ray

    from aml_ray.actors.shared import NAMESPACE, live_leases

    total: dict[str, int] = {}
    for name in live_leases():
        if name.startswith("aml-model-"):
            try:
                load = ray.get(ray.get_actor(name, namespace=NAMESPACE).load.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - the actor was just released: nothing waits there
                continue
            for job, n in load["waiting"].items():
                total[job] = total.get(job, 0) + n
    return total


def _wait(cond, deadline: float, alive) -> bool:
    while not cond():
        if time.monotonic() > deadline or not alive():
            return False
        time.sleep(0.05)
    return True


def run_scenario(big: JobPlan, small: JobPlan, *, model_latency_ms: float = 40.0, model_max_in_flight: int = 2,
                 big_queued: int = 32, out_dir: Path | None = None, timeout_s: float = 300.0) -> dict[str, Any]:
    """Run ``big`` and ``small`` at once against their own participants and one shared model server.

    Ray must be initialised. The model server holds every call (``/hold``) while the queues build:
    ``big`` starts, and once ``big_queued`` of its requests wait at the shared model clients (or 60 s
    passed), ``small`` starts; once all of ``small``'s answer requests wait there too (or 60 s passed), the server lets
    calls through (``/go``). So the two jobs' start-up times on a loaded machine do not decide the
    outcome: what follows is the shared client's admission order (round-robin across jobs), against a
    first-come queue in which ``small`` would wait behind all of ``big``'s requests.

    Returns:
        ``{"jobs": {name: {run_id, start, end, wall_s, scored, questions, statuses | error}},
        "participants": {name: {declared, max_in_flight, over_capacity, adds, searches}},
        "model": {declared, max_in_flight_by_kind, calls: [[arrival, done, kind, tag], ...], released_at,
        waiting_at_release: {job key: n}}, "shared": {actor name: sorted job keys seen holding it},
        "leases_after": {...}}``; times are ``time.monotonic`` seconds (one clock for this process and
        the servers).

    Raises:
        TimeoutError: a job did not finish within ``timeout_s``.
        RuntimeError: a job failed (its error text).
    """
    from aml_ray.actors.shared import live_leases
    from aml_ray.config import ModelEndpoint

    out = Path(out_dir or tempfile.mkdtemp(prefix="aml-drill-many-"))
    records: dict[str, dict[str, Any]] = {p.name: {"run_id": f"{p.name}-{uuid.uuid4().hex[:8]}"} for p in (big, small)}
    shared: dict[str, set[str]] = {}
    with ServerProcess("participant", "--latency-ms", str(big.latency_ms), "--capacity", str(big.max_in_flight)) as p_big, \
            ServerProcess("participant", "--latency-ms", str(small.latency_ms),
                          "--capacity", str(small.max_in_flight)) as p_small, \
            ServerProcess("model", "--latency-ms", str(model_latency_ms), "--tag-regex", TAG_REGEX) as model:
        answer, judge = (ModelEndpoint(role=role, base_url=f"{model.base_url}/v1", model="loopback-model",
                                       max_in_flight=model_max_in_flight) for role in ("answer", "judge"))
        threads = {plan.name: threading.Thread(target=_run_job, args=(plan, url, answer, judge, out, records[plan.name]),
                                               name=f"job-{plan.name}", daemon=True)
                   for plan, url in ((big, p_big.base_url), (small, p_small.base_url))}
        deadline = time.monotonic() + timeout_s
        key = {name: r["run_id"] for name, r in records.items()}
        model.post("hold")
        threads[big.name].start()
        _wait(lambda: _model_waiting().get(key[big.name], 0) >= big_queued, min(deadline, time.monotonic() + 60),
              threads[big.name].is_alive)
        threads[small.name].start()
        _wait(lambda: _model_waiting().get(key[small.name], 0) >= small.samples * small.questions,
              min(deadline, time.monotonic() + 60), threads[small.name].is_alive)
        waiting_at_release = _model_waiting()
        released_at = model.post("go")["at"]
        while any(t.is_alive() for t in threads.values()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs still running after {timeout_s} s")
            for name, jobs in live_leases().items():  # which of this drill's jobs hold each shared actor
                if set(jobs) & set(key.values()):
                    shared.setdefault(name, set()).update(jobs)
            time.sleep(0.1)
        stats = {big.name: p_big.stats(), small.name: p_small.stats()}
        model_stats = model.stats()
    for name, rec in records.items():
        if "error" in rec:
            raise RuntimeError(f"job {name} failed: {rec['error']}")
    plans = {big.name: big, small.name: small}
    return {
        "jobs": {name: {**rec, "wall_s": rec["end"] - rec["start"], "questions": plans[name].samples * plans[name].questions}
                 for name, rec in records.items()},
        "participants": {name: {"declared": plans[name].max_in_flight, "max_in_flight": s["max_in_flight"],
                                "over_capacity": s["over_capacity"], "adds": s["n"].get("add", 0),
                                "searches": s["n"].get("search", 0)} for name, s in stats.items()},
        "model": {"declared": model_max_in_flight, "max_in_flight_by_kind": model_stats["max_in_flight_by_kind"],
                  "calls": model_stats["calls"], "released_at": released_at,
                  "waiting_at_release": {name: waiting_at_release.get(k, 0) for name, k in key.items()}},
        "shared": {name: sorted(jobs) for name, jobs in shared.items()},
        "leases_after": {n: j for n, j in live_leases().items() if set(j) & set(key.values())},  # this drill's jobs
    }


def fairness(calls: list[list], small: str, kind: str, since: float) -> dict[str, float]:
    """Figures of ``small``'s ``kind`` calls among all ``kind`` calls, from the server's arrival log.

    Args:
        calls: the model server's ``[arrival, done, kind, tag]`` log.
        small: the tag of the job looked at.
        kind: ``"answer"`` or ``"judge"``.
        since: when the server started letting calls through (``/go``).

    Returns:
        ``{"small_calls", "other_calls_before"`` (other jobs' arrivals after ``since`` and before
        ``small``'s first: a first-come queue makes these the whole backlog queued ahead of it),
        ``"window_s", "other_calls_in_window", "small_share_in_window"`` (the window runs from
        ``small``'s first to its last arrival), ``"longest_small_run"`` (most consecutive arrivals of
        ``small``: round-robin interleaves, a first-come queue serves its whole batch in one run),
        ``"other_calls_after"}``.
    """
    rows = sorted((c for c in calls if c[2] == kind), key=lambda c: c[0])
    mine = [c[0] for c in rows if c[3] == small]
    first, last = mine[0], mine[-1]
    inside = sum(1 for c in rows if c[3] != small and first <= c[0] <= last)
    run = longest = 0
    for c in rows:
        run = run + 1 if c[3] == small else 0
        longest = max(longest, run)
    return {"small_calls": len(mine),
            "other_calls_before": sum(1 for c in rows if c[3] != small and since <= c[0] < first),
            "window_s": last - first, "other_calls_in_window": inside,
            "small_share_in_window": len(mine) / (len(mine) + inside), "longest_small_run": longest,
            "other_calls_after": sum(1 for c in rows if c[3] != small and c[0] > last)}


def share_timeline(calls: list[list], bucket_s: float = 0.5, t0: float | None = None) -> list[tuple[float, dict[str, int]]]:
    """``[(bucket start in s since t0, {tag: calls arrived in the bucket})]``; t0 default: the first arrival.

    A call held before ``t0`` counts in the first bucket.
    """
    if not calls:
        return []
    t0 = min(c[0] for c in calls) if t0 is None else t0
    buckets: dict[int, dict[str, int]] = {}
    for c in calls:
        row = buckets.setdefault(max(0, int((c[0] - t0) / bucket_s)), {})
        row[c[3]] = row.get(c[3], 0) + 1
    return [(i * bucket_s, buckets.get(i, {})) for i in range(max(buckets) + 1)]


def report(fig: dict[str, Any], small: str) -> str:
    """The drill's printed figures."""
    lines = ["jobs (wall time from the job's start):"]
    t0 = min(r["start"] for r in fig["jobs"].values())
    for name, r in fig["jobs"].items():
        lines.append(f"  {name:6s} {r['questions']:5d} questions, {r['scored']:5d} scored, started at +{r['start'] - t0:5.2f} s, "
                     f"ended at +{r['end'] - t0:6.2f} s, wall {r['wall_s']:6.2f} s")
    lines.append("participants (observed by each server):")
    for name, p in fig["participants"].items():
        lines.append(f"  {name:6s} max in flight {p['max_in_flight']:3d} (declared {p['declared']:3d}), "
                     f"over capacity {p['over_capacity']}, adds {p['adds']}, searches {p['searches']}")
    m = fig["model"]
    lines.append(f"model server held calls until +{m['released_at'] - t0:.2f} s; requests waiting at the shared "
                 f"model clients then: {m['waiting_at_release']}")
    for name, r in fig["jobs"].items():
        done = max(c[1] for c in m["calls"] if c[3] == name)
        lines.append(f"  {name:6s} last model reply {done - m['released_at']:6.2f} s after the release")
    lines.append("model endpoint (one server, answer and judge roles, each declared "
                 f"max_in_flight={m['declared']}):")
    for kind, peak in sorted(m["max_in_flight_by_kind"].items()):
        lines.append(f"  {kind:6s} peak in flight {peak} (declared {m['declared']}), "
                     f"calls {sum(c[2] == kind for c in m['calls'])}")
    lines.append("shared client actors and the jobs seen holding them:")
    for name, jobs in sorted(fig["shared"].items()):
        lines.append(f"  {name}: {', '.join(j.split('-')[0] for j in jobs)}")
    lines.append(f"  leases left after both jobs: {fig['leases_after'] or 'none'}")
    for kind in ("answer", "judge"):
        f = fairness(m["calls"], small, kind, m["released_at"])
        lines.append(f"fairness ({kind}): {f['other_calls_before']} other calls arrived after the release before "
                     f"{small}'s first; its {f['small_calls']} calls arrived over {f['window_s']:.2f} s with "
                     f"{f['other_calls_in_window']} other calls between them (share {f['small_share_in_window']:.0%}, "
                     f"longest run of its own {f['longest_small_run']}); {f['other_calls_after']} other calls came "
                     "after its last")
    lines.append("share of model calls (answer + judge) per job over time, 0.5 s buckets from the release:")
    tags = sorted({c[3] for c in m["calls"]})
    for start, row in share_timeline(m["calls"], t0=m["released_at"]):
        total = sum(row.values()) or 1
        cells = "  ".join(f"{t} {row.get(t, 0):4d} ({row.get(t, 0) / total:4.0%})" for t in tags)
        lines.append(f"  +{start:5.1f} s  {cells}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--big-samples", type=int, default=20)
    ap.add_argument("--big-questions", type=int, default=20, help="questions per sample of the big job")
    ap.add_argument("--small-samples", type=int, default=1)
    ap.add_argument("--small-questions", type=int, default=20)
    ap.add_argument("--model-latency-ms", type=float, default=40.0)
    ap.add_argument("--model-max-in-flight", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="print the raw figures as JSON too")
    a = ap.parse_args(argv)
    from aml_ray.run.ray_runtime import init_ray

    big = JobPlan("big", a.big_samples, a.big_questions, latency_ms=20, max_in_flight=8)
    small = JobPlan("small", a.small_samples, a.small_questions, latency_ms=60, max_in_flight=3)
    init_ray(num_cpus=2)
    fig = run_scenario(big, small, model_latency_ms=a.model_latency_ms, model_max_in_flight=a.model_max_in_flight)
    print(report(fig, small.name))
    if a.json:
        print(json.dumps(fig, default=str))


if __name__ == "__main__":
    main()
