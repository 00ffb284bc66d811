"""The fixed cost of a run's start: the dataset, inputs and pre-flight run beside the Ray start, not before it.

No Ray is started here: ``init_ray`` and ``run_pipeline`` are replaced in :mod:`aml_ray.run.evaluation`
(the pipeline's own behaviour is tested in tests/test_pipeline_e2e.py); the pre-flight is the real one
against a dead endpoint in the second test.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pytest

import aml_ray.run.evaluation as evaluation
import aml_ray.run.pipeline as pipeline_module
import aml_ray.run.preflight as preflight_module
from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import model_endpoint_from_env
from aml_ray.run.evaluation import EvaluationConfig, evaluate
from aml_ray.run.outcome import StageFailed
from aml_ray.run.preflight import PreflightReport
from scripts.loopback_servers import ServerProcess

OFFLINE = {"answer": model_endpoint_from_env("answer", {}), "judge": model_endpoint_from_env("judge", {})}
#: Only a guard against a hang: each side waits at most this long for the other (never reached when they overlap).
GUARD_S = 10


def config(tmp_path, locomo_file, url: str) -> EvaluationConfig:
    spec = ParticipantSpec(add_url=f"{url}/add", search_url=f"{url}/search")
    return EvaluationConfig(dataset="locomo", participant=spec, out_dir=tmp_path / "run", data_path=locomo_file,
                            limit_samples=1, **OFFLINE)


def test_the_preflight_runs_while_ray_starts(tmp_path, locomo_file, monkeypatch):
    """Each side waits for the other to have begun: sequential steps (pre-flight, then Ray) would not meet."""
    ray_starting, preflight_running = threading.Event(), threading.Event()
    seen: dict[str, bool] = {}

    def fake_preflight(spec, *, run_id, dataset, top_k, **_):
        preflight_running.set()
        seen["preflight saw Ray starting"] = ray_starting.wait(GUARD_S)
        return PreflightReport(user_id=f"eval:{run_id}:{dataset}:preflight")

    def fake_init_ray(*, num_cpus=None, **kw):
        ray_starting.set()
        seen["Ray start saw the pre-flight"] = preflight_running.wait(GUARD_S)
        seen["Ray start on the calling thread"] = threading.current_thread() is threading.main_thread()
        return False  # "Ray was already running": nothing to shut down

    def stop_before_pipeline(inputs, **kw):
        raise RuntimeError("stopped before the pipeline (test)")

    monkeypatch.setattr(preflight_module, "preflight", fake_preflight)
    monkeypatch.setattr(evaluation, "init_ray", fake_init_ray)
    monkeypatch.setattr(pipeline_module, "run_pipeline", stop_before_pipeline)
    with pytest.raises(RuntimeError, match="stopped before the pipeline"):
        evaluate(config(tmp_path, locomo_file, "http://127.0.0.1:9"))
    assert seen == {"preflight saw Ray starting": True, "Ray start saw the pre-flight": True,
                    "Ray start on the calling thread": True}
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["dataset"]["samples"] == 1  # written before the Ray start; the stop is an internal error's
    assert info["status"] == "failed" and info["failure"]["kind"] == "internal"


def test_the_run_is_prepared_before_the_ray_start_and_without_the_pipelines_imports(tmp_path, locomo_file,
                                                                                     monkeypatch):
    """The run's preparation (inputs, run.json) is done when the Ray start begins, not beside it: sharing the
    interpreter with ``import ray`` and the pipeline's imports delayed the first Add 0.05-0.3 s after the
    probe on 2 cores. And the evaluation module imports neither polars nor the pipeline (0.2 s of CPU that
    stood between the probe and the first Add), and the pipeline, imported once Ray is up, no polars."""
    code = ("import sys, aml_ray.run.evaluation; "
            "print(sorted(m for m in ('polars', 'aml_ray.run.pipeline', 'ray') if m in sys.modules)); "
            "import aml_ray.run.pipeline; print('polars' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "False"]
    seen: dict[str, object] = {}
    run_json = tmp_path / "run" / "run.json"

    def fake_init_ray(*, num_cpus=None, **kw):
        seen["run.json at the Ray start"] = json.loads(run_json.read_text())["status"] if run_json.exists() else None
        seen["sample inputs at the Ray start"] = len(list((tmp_path / "run" / "inputs").glob("*.parquet")))
        return False

    def stop_before_pipeline(inputs, **kw):
        raise RuntimeError("stopped before the pipeline (test)")

    monkeypatch.setattr(preflight_module, "preflight",
                        lambda spec, *, run_id, dataset, top_k, **_: PreflightReport(user_id=f"eval:{run_id}:{dataset}:x"))
    monkeypatch.setattr(evaluation, "init_ray", fake_init_ray)
    monkeypatch.setattr(pipeline_module, "run_pipeline", stop_before_pipeline)
    with pytest.raises(RuntimeError, match="stopped before the pipeline"):
        evaluate(config(tmp_path, locomo_file, "http://127.0.0.1:9"))
    assert seen == {"run.json at the Ray start": "running", "sample inputs at the Ray start": 1}


def test_a_failed_preflight_beside_the_ray_start_fails_the_run_and_stops_that_ray(tmp_path, locomo_file, monkeypatch):
    """The thread's StageFailed reaches the caller; run.json says failed; a Ray this call started is shut down."""
    import ray

    calls: list[str] = []
    monkeypatch.setattr(evaluation, "init_ray", lambda *, num_cpus=None, **kw: calls.append("init") or True)
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append("shutdown"))
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(StageFailed, match="pre-flight add failed") as failed:
        evaluate(config(tmp_path, locomo_file, url))
    assert calls == ["init", "shutdown"]
    assert failed.value.failure["stage"] == "preflight" and failed.value.failure["step"] == "add"
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["status"] == "failed" and info["error"].startswith(f"pre-flight add failed at {url}/add")


@pytest.mark.usefixtures("ray_session")
def test_a_cluster_of_its_own_runs_without_the_client_registry(tmp_path, locomo_file, monkeypatch):
    """A driver that started its own local cluster spawns its participant client itself (one worker start
    less before the first Add) and kills it at the end; the shared registry is never asked.

    The session's Ray stands in for that cluster: ``init_ray`` says it started it, and its shutdown is
    replaced so the session's cluster lives on.
    """
    import ray

    import aml_ray.actors.shared as shared
    from aml_ray.reference.server import ReferenceServer

    def no_registry(method, *args, **kw):
        raise AssertionError(f"the registry was asked to {method}")

    monkeypatch.setattr(evaluation, "init_ray", lambda *, num_cpus=None, **kw: True)
    monkeypatch.setattr(evaluation, "started_here", lambda: True)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(shared, "_call", no_registry)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with ReferenceServer(tmp_path / "ref") as ref:
        cfg = config(tmp_path, locomo_file, "http://unused")
        cfg.participant = ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url)
        cfg.retrieval_only = True
        result = evaluate(cfg)
    info = result.run_info
    assert info["status"] == "completed" and info["adds"]["ok"] == info["dataset"]["chunks"] > 0
    assert info["search"]["failed"] == 0 and info["participant_concurrency"]["replies"] > 0
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    assert not [n for n in names if "-private-" in n], names  # the run's own client was killed at the end


def test_evaluate_waits_for_the_preflight_its_caller_started(tmp_path, locomo_file, monkeypatch):
    """``aml-ray run`` starts the pre-flight before the evaluation's imports (``start_preflight``) and hands it to
    :func:`evaluate`, which waits for that one instead of probing again; one started for another run is refused
    before any run file."""
    calls: list[str] = []

    def fake_preflight(spec, *, run_id, dataset, top_k, **_):
        calls.append(run_id)
        return PreflightReport(user_id=f"eval:{run_id}:{dataset}:preflight")

    def stop_before_pipeline(inputs, **kw):
        raise RuntimeError("stopped before the pipeline (test)")

    monkeypatch.setattr(preflight_module, "preflight", fake_preflight)
    monkeypatch.setattr(evaluation, "init_ray", lambda *, num_cpus=None, **kw: False)
    monkeypatch.setattr(pipeline_module, "run_pipeline", stop_before_pipeline)
    cfg = config(tmp_path, locomo_file, "http://127.0.0.1:9")
    other = preflight_module.start_preflight(cfg.participant, run_id="run_other", dataset="locomo", top_k=10)
    with pytest.raises(ValueError, match="preflight: started for run run_other"):
        evaluate(cfg, preflight=other)
    assert not (tmp_path / "run" / "run.json").exists()
    started = preflight_module.start_preflight(cfg.participant, run_id=cfg.run_id, dataset="locomo", top_k=10)
    with pytest.raises(RuntimeError, match="stopped before the pipeline"):
        evaluate(cfg, preflight=started)
    assert calls == ["run_other", cfg.run_id]  # the two started here; evaluate() probed no third time


@pytest.mark.usefixtures("ray_session")
def test_when_passed_fires_in_the_preflights_loop_before_its_thread_ends():
    """The head start is released from inside the pre-flight, the moment the probe's Search was checked,
    not by the future's callbacks after the probe's client closed and its thread ended; never for a failed
    pre-flight; at once, in the calling thread, once it passed."""
    seen: list[tuple[str, bool, dict[str, float]]] = []
    with ServerProcess("participant", "--latency-ms", "20", "--add-latency-ms", "150", "--capacity", "64") as server:
        spec = ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search")
        started = preflight_module.start_preflight(spec, run_id="run_pass", dataset="locomo", top_k=10)
        started.when_passed(lambda r: seen.append((threading.current_thread().name, started.future.done(),
                                                   r.lone_latencies())))
        report = started.result()
        assert len(seen) == 1
        thread, future_done, lone = seen[0]
        assert thread.startswith("aml-ray-preflight") and future_done is False
        assert lone == report.lone_latencies() and set(lone) == {spec.add_url, spec.search_url}
        started.when_passed(lambda r: seen.append((threading.current_thread().name, True, {})))
        assert seen[1][0] == threading.current_thread().name  # already passed: at once, here
    dead = ParticipantSpec(add_url="http://127.0.0.1:9/add", search_url="http://127.0.0.1:9/search")
    failed = preflight_module.start_preflight(dead, run_id="run_dead", dataset="locomo", top_k=10)
    failed.when_passed(lambda r: seen.append(("dead", True, {})))
    with pytest.raises(preflight_module.PreflightFailed):
        failed.result()
    assert len(seen) == 2


def test_the_ray_shutdown_goes_beside_the_scoring(tmp_path, locomo_file, monkeypatch):
    """Once the pipeline returned, the run's own Ray is shut down in a thread while the tables are computed from
    the evidence (no Ray needed there); run.json is written after both, with the shutdown's time. Each side
    waits for the other to have begun: a shutdown before the scoring would not meet it. The session's Ray stands
    in for the run's own (``init_ray`` says it started it; the shutdown is replaced)."""
    from aml_ray.reference.server import ReferenceServer

    scoring, shutting_down = threading.Event(), threading.Event()
    seen: dict[str, bool] = {}
    read_adds = evaluation.read_adds

    def shutdown_ray():
        shutting_down.set()
        seen["shutdown saw the scoring"] = scoring.wait(GUARD_S)
        seen["shutdown in a thread of its own"] = threading.current_thread() is not threading.main_thread()
        return []

    def scoring_read_adds(run_dir):
        scoring.set()
        seen["scoring saw the shutdown"] = shutting_down.wait(GUARD_S)
        return read_adds(run_dir)

    monkeypatch.setattr(evaluation, "init_ray", lambda *, num_cpus=None, **kw: True)
    monkeypatch.setattr(evaluation, "shutdown_ray", shutdown_ray)
    monkeypatch.setattr(evaluation, "read_adds", scoring_read_adds)
    with ReferenceServer(tmp_path / "ref") as ref:
        cfg = config(tmp_path, locomo_file, "http://unused")
        cfg.participant = ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url)
        cfg.retrieval_only = True
        result = evaluate(cfg)
    assert seen == {"shutdown saw the scoring": True, "scoring saw the shutdown": True,
                    "shutdown in a thread of its own": True}
    assert result.run_info["status"] == "completed" and "ray_shutdown_s" in result.run_info["timings"]



def _retrieval_run_on_the_reference_system(tmp_path, locomo_file) -> dict:
    """run.json's content of a retrieval-only run of the first LoCoMo sample against the reference BM25 system."""
    from aml_ray.reference.server import ReferenceServer

    with ReferenceServer(tmp_path / "ref") as ref:
        cfg = config(tmp_path, locomo_file, "http://unused")
        cfg.participant = ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url)
        cfg.retrieval_only = True
        return evaluate(cfg).run_info


def test_the_memories_are_checked_once_along_with_the_pipeline_and_agree_with_the_evidence(tmp_path, locomo_file,
                                                                                           monkeypatch):
    """The run's tail: the isolation check and the evidence recall each read and converted every
    question's memories (two passes over the evidence; with the reference BM25 participant's 100 memories a
    question, most of ``_score``'s 0.73 s under cProfile); then one pass served both, after the pipeline
    (1.0 s of the README's LoCoMo run's tail). Now a fresh run makes that pass along with the pipeline, on
    each table the driver receives (``RunningChecks``), and reads no evidence file for it; its leaks, recall
    table and ``recall.parquet`` are those of the pass over the evidence files. A pass that failed in the
    checks' thread is made again from the files."""
    import pyarrow.parquet as pq

    import aml_ray.run.memory_checks as checks_module
    from aml_ray.datasets.registry import get_dataset
    from aml_ray.ids import IdScheme
    from aml_ray.run.evidence import RunDir
    from aml_ray.run.inputs import build_inputs

    passes: list[tuple[str, ...]] = []
    fed: list[int] = []
    read, feed = checks_module.iter_question_rows, checks_module.RunningChecks.feed

    def counted(files, columns):
        passes.append(tuple(columns))
        return read(files, columns)

    def counted_feed(self, table):
        fed.append(table.num_rows)
        return feed(self, table)

    monkeypatch.setattr(checks_module, "iter_question_rows", counted)
    monkeypatch.setattr(checks_module.RunningChecks, "feed", counted_feed)
    info = _retrieval_run_on_the_reference_system(tmp_path, locomo_file)
    assert passes == [] and sum(fed) == info["dataset"]["scorable_questions"]
    assert info["status"] == "completed" and info["isolation"] == {"leaking_questions": 0, "examples": []}
    overall = next(r for r in info["evidence_recall"]["table"] if r["category"] == "overall")
    assert overall["n"] > 100 and 0 < overall["recall@10"] <= 1
    run_dir = RunDir(tmp_path / "run")
    along = pq.read_table(run_dir.recall)
    samples = get_dataset("locomo").load(locomo_file)[:1]
    inputs = build_inputs(samples, IdScheme(info["run_id"], "locomo"), out_dir=tmp_path / "inputs-again")
    leaks, table, flags = checks_module.memory_checks(samples, inputs, run_dir)  # the pass over the files
    assert len(passes) == 1 and {"user_id", "sample_id", "memories"} <= set(passes[0])
    assert (leaks, table, flags) == ([], info["evidence_recall"]["table"], []) and pq.read_table(run_dir.recall).equals(along)
    failing = checks_module.RunningChecks(samples, inputs)
    failing.feed(pa.table({"not_a_question_column": [1]}))
    assert failing.finish(run_dir) == ([], info["evidence_recall"]["table"], [])
    assert len(passes) == 2  # made again from the files


def _evaluate_in_a_process(tmp_path, locomo_file, *, setup: str, config: str, call: str, report: str,
                           participant: tuple[str, ...]):
    """``evaluate`` of LoCoMo in a Python process of its own, with a local cluster of its own (as ``aml-ray run``
    starts one), against a loopback participant started with ``participant``; returns the JSON that the
    code ``report`` printed last. ``setup`` runs first (after ``url, out, data`` are set), ``config`` adds
    :class:`EvaluationConfig` arguments, ``call`` :func:`evaluate` ones (``", on_progress=..."``)."""
    from scripts.loopback_servers import ServerProcess

    code = ("import json, sys\n"
            "from pathlib import Path\n"
            "from aml_ray.actors.participant import ParticipantSpec\n"
            "from aml_ray.config import model_endpoint_from_env\n"
            "from aml_ray.run.evaluation import EvaluationConfig, evaluate\n"
            "url, out, data = sys.argv[1:4]\n"
            + setup +
            "spec = ParticipantSpec(add_url=f'{url}/add', search_url=f'{url}/search')\n"
            "cfg = EvaluationConfig(dataset='locomo', participant=spec, out_dir=Path(out), data_path=Path(data),\n"
            f"                       {config},\n"
            "                       answer=model_endpoint_from_env('answer', {}), judge=model_endpoint_from_env('judge', {}))\n"
            f"result = evaluate(cfg, num_cpus=2{call})\n"
            + report)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a new local cluster, never the session's
    with ServerProcess("participant", *participant) as server:
        out = subprocess.run([sys.executable, "-c", code, server.base_url, str(tmp_path / "run"), str(locomo_file)],
                             capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_single_stage_run_never_imports_ray_data(tmp_path, locomo_file):
    """A retrieval-only run (one stage, run without Ray Data) in a process of its own, with its own cluster:
    the driver never imports ``ray.data`` (about 0.3 s of CPU); its console and progress settings are set
    where a Ray Data pipeline is built."""
    reported = _evaluate_in_a_process(
        tmp_path, locomo_file, setup="", config="limit_samples=1, retrieval_only=True", call="",
        report="print(json.dumps([result.run_info['status'], 'ray.data' in sys.modules]))\n",
        participant=("--latency-ms", "1", "--add-latency-ms", "1", "--capacity", "64"))
    assert reported == ["completed", False]


#: Modules ``aml-ray run`` does not need before its pre-flight may send: the
#: pre-flight's first Add waits for every import made before it.
NOT_BEFORE_THE_PREFLIGHT = ("polars", "pyarrow", "pandas", "numpy", "httpx", "ray")


def test_aml_ray_run_starts_its_preflight_before_importing_tables_http_or_ray(tmp_path, locomo_file):
    """What ``aml-ray run`` has imported when it starts the pre-flight, in a process of its own: none of
    :data:`NOT_BEFORE_THE_PREFLIGHT`. At 8a28f84 the dataset check imported polars (the suite bundles' judge
    protocols, through the scoring package's re-export of its score table), the participant client pyarrow,
    the dataset fetcher httpx: 0.2-0.3 s before the probe Add. The pre-flight is replaced by a stand-in
    that reports and ends the process (nothing is sent)."""
    code = ("import json, os, sys\n"
            "import aml_ray.run.preflight as preflight\n"
            "def report(*args, **kwargs):\n"
            f"    print(json.dumps(sorted(m for m in {NOT_BEFORE_THE_PREFLIGHT!r} if m in sys.modules)), flush=True)\n"
            "    os._exit(0)\n"
            "preflight.start_preflight = report\n"
            "from aml_ray.cli import app\n"
            "app(['run', '--data', sys.argv[1], '--limit-samples', '1', '--out', sys.argv[2],\n"
            "     '--participant', 'http://127.0.0.1:9'])\n")
    out = subprocess.run([sys.executable, "-c", code, str(locomo_file), str(tmp_path / "run")], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_evaluate_refuses_a_dataset_with_nothing_to_score_before_any_run_file(tmp_path, monkeypatch):
    """Service jobs and suite bundles call evaluate() without the command line's check: an empty dataset
    is refused there too (it used to run and end ``completed``), with no run.json and no Ray start."""
    from aml_ray.datasets.validate import DatasetFormatError

    monkeypatch.setattr(evaluation, "init_ray", lambda **kw: False)
    data = tmp_path / "empty.json"
    data.write_text("[]")
    cfg = config(tmp_path, data, "http://127.0.0.1:9")
    cfg.allow_hash_mismatch = True
    with pytest.raises(DatasetFormatError, match="holds no sample; a run would measure nothing"):
        evaluate(cfg)
    assert not (tmp_path / "run" / "run.json").exists()


def test_aml_ray_run_computes_the_code_provenance_beside_the_preflight(tmp_path, locomo_file):
    """The path to the first Add: run.json's git commit (a ``git rev-parse`` child) and pipeline
    code hash were computed in the run's preparation, which the first Add waits for (0.08-0.13 s in traced
    runs while Ray started beside it). ``aml-ray run`` now starts them in a thread of their own right after
    the pre-flight (:mod:`aml_ray.run.provenance`), and run.json still records them. In a process of its
    own; Ray's start is replaced, and the participant's routes answer 404, so the pre-flight stops the run
    (exit 1) once run.json is written."""
    from aml_ray.run.provenance import git_commit, pipeline_code_hash
    from scripts.loopback_servers import ServerProcess

    code = ("import json, subprocess, sys, threading\n"
            "import aml_ray.run.evaluation as evaluation\n"
            "evaluation.init_ray = lambda **kw: False\n"
            "run, threads = subprocess.run, []\n"
            "def watched(args, *a, **kw):\n"
            "    if list(args[:1]) == ['git']:\n"
            "        threads.append(threading.current_thread().name)\n"
            "    return run(args, *a, **kw)\n"
            "subprocess.run = watched\n"
            "from aml_ray.cli import app\n"
            "try:\n"
            "    app(['run', '--data', sys.argv[1], '--limit-samples', '1', '--out', sys.argv[2],\n"
            "         '--participant', sys.argv[3]])\n"
            "except SystemExit as exc:\n"
            "    print(json.dumps([exc.code, threads]))\n")
    with ServerProcess("participant", "--latency-ms", "1") as server:
        out = subprocess.run([sys.executable, "-c", code, str(locomo_file), str(tmp_path / "run"),
                              f"{server.base_url}/no-such-route"], capture_output=True, text=True, timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [1, ["aml-ray-provenance"]], out.stderr[-2000:]
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["status"] == "failed" and info["error"].startswith("pre-flight add failed")
    assert info["git_commit"] == git_commit() and info["pipeline_code_sha256"] == pipeline_code_hash()


def _cluster_processes(ray_tmpdir: str) -> list[tuple[int, str]]:
    """The processes whose environment names ``ray_tmpdir`` (a cluster's raylet, GCS, agents and workers
    inherit the driver's ``RAY_TMPDIR``), zombies left out: ``[(pid, name), ...]``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("RAY_TMPDIR") == ray_tmpdir and proc.status() != psutil.STATUS_ZOMBIE:
                found.append((proc.pid, proc.name()))
        except psutil.Error:
            pass
    return found


def test_aml_ray_run_stops_its_own_cluster_and_leaves_no_process_of_it(tmp_path, locomo_file):
    """``aml-ray run`` with a cluster of its own shuts it down with ``ray.shutdown()`` beside the scoring
    (run.json's ``ray_shutdown_s``), and no process of the cluster outlives the command (Ray's agents and
    workers included); the run's status, results and exit code are the run's."""
    from scripts.loopback_servers import ServerProcess

    ray_tmp = tempfile.mkdtemp(prefix="amlx-", dir="/tmp")  # short: Ray's socket paths live under it
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, "RAY_TMPDIR": ray_tmp}
    with ServerProcess("participant", "--latency-ms", "1", "--add-latency-ms", "5", "--capacity", "64") as server:
        out = subprocess.run([str(Path(sys.executable).parent / "aml-ray"), "run", "--num-cpus", "2",
                              "--participant", server.base_url, "--data", str(locomo_file), "--limit-samples", "1",
                              "--out", str(tmp_path / "run")],
                             capture_output=True, text=True, timeout=180, env=env)
    left = _cluster_processes(ray_tmp)
    deadline = time.monotonic() + 5  # the kernel kills the raylet and the GCS as the command ends
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _cluster_processes(ray_tmp)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["status"] == "completed" and info["timings"]["ray_shutdown_s"] > 0
    assert info["ray_cluster"]["started_here"] is True
    assert "samples 1, chunks 28" in out.stdout
    assert left == []
    shutil.rmtree(ray_tmp, ignore_errors=True)


_WARM_CODE = """
import sys, threading
from aml_ray.config import ModelEndpoint
from aml_ray.stages.answer import AnswerStage
from aml_ray.stages.ingest import IngestStage
from aml_ray.stages.judge_stage import JudgeStage

answer = {"endpoint": ModelEndpoint(role="answer", base_url=None, model="offline"), "client": None,
          "prompt": "locomo_answer"}
judge = {"endpoint": ModelEndpoint(role="judge", base_url=None, model="offline"), "client": None,
         "prompt": "locomo_judge"}
if sys.argv[1] == "ingest":
    stage = IngestStage(None, sys.argv[2], models=(answer, judge))
    stage._loading.join()
    assert stage._models_error is None, stage._models_error
else:
    AnswerStage(**answer, warm_up=True), JudgeStage(**judge, warm_up=True)
    for thread in threading.enumerate():
        if thread.name.endswith("-warm-up"):
            thread.join()
print(sorted(m for m in ("bpe_openai", "nltk.stem.porter", "nltk.translate.bleu_score") if m in sys.modules))
"""


@pytest.mark.parametrize("where", ["ingest", "ray_data_stages"])
def test_the_models_first_use_imports_are_made_before_the_first_batch(tmp_path, where):
    """The offline judge imported nltk (its stemmer and BLEU, 0.16 s of CPU by py-spy) on the first
    task's rows, after that task's last Search; the Ingest actor's loading thread, and a Ray Data stage's
    constructor with ``warm_up``, now make the tokenizer's and nltk's imports while the Adds run."""
    out = subprocess.run([sys.executable, "-c", _WARM_CODE, where, str(tmp_path)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "['bpe_openai', 'nltk.stem.porter', 'nltk.translate.bleu_score']"


def test_a_private_single_stage_run_keeps_its_progress_in_the_ingest_actor(tmp_path, locomo_file):
    """A Ray worker process costs about 1 % of a core for as long as the run lasts (Ray's 10 ms
    signal check; docs/ray-notes.md) and a second of CPU to start; the ProgressTracker actor took 0.47-0.52 ms
    a question at full rate against a one-at-a-time participant. In a cluster of its own, a single-stage run
    keeps the tracker in its Ingest actor: no ``ray::ProgressTracker`` process, and the progress the driver
    shows still counts every Add and question, the head start's Adds included."""
    reported = _evaluate_in_a_process(
        tmp_path, locomo_file,
        setup=("import psutil\n"
               "titles, last = set(), {}\n"
               "def seen(phase, snapshot):\n"
               "    last.update(snapshot)\n"
               "    for p in psutil.Process().children(recursive=True):\n"
               "        try:\n"
               "            titles.update(w for w in p.cmdline()[:1] if w.startswith('ray::'))\n"
               "        except psutil.Error:\n"
               "            pass\n"),
        config="limit_samples=2", call=", on_progress=seen",
        report=("info = result.run_info\n"
                "print(json.dumps([info['status'], info['head_start']['adds'] > 0, info['dataset']['chunks'],\n"
                "                  info['dataset']['scorable_questions'], last, sorted(titles)]))\n"),
        participant=("--latency-ms", "2", "--add-latency-ms", "40", "--capacity", "64"))
    status, head_start_sent, chunks, scorable, progress, titles = reported
    assert status == "completed" and head_start_sent
    assert {k: progress.get(k) for k in ("add", "search", "answer", "judge")} == {
        "add": chunks, "search": scorable, "answer": scorable, "judge": scorable}
    assert any(t.startswith("ray::IngestFromFiles") for t in titles), titles
    assert not [t for t in titles if "ProgressTracker" in t], titles



def test_the_tails_first_use_imports_are_made_during_the_run(tmp_path, locomo_file):
    """The run's tail: the scoring's first bootstrap interval imported ``numpy.random`` and
    ``numpy.ma``, and ``ray.shutdown()`` beside it ``ray.dag`` (about 0.04 s of CPU, after the last Search);
    the pipeline's last step, reading the question evidence back, imported ``pyarrow.dataset`` at Parquet's
    first read (0.05 s). They are imported while the pipeline runs (:func:`aml_ray.run.evaluation.warm_tail`):
    all four are loaded when the evidence is first read back, in a run of its own process."""
    reported = _evaluate_in_a_process(
        tmp_path, locomo_file,
        setup=("import aml_ray.run.evaluation as evaluation\n"
               "import aml_ray.run.pipeline as pipeline\n"
               "read, seen = pipeline.read_questions, []\n"
               "def watched(*args, **kwargs):\n"
               "    if not seen:\n"
               "        seen.extend(m for m in ('numpy.random', 'numpy.ma', 'ray.dag', 'pyarrow.dataset')\n"
               "                    if m in sys.modules)\n"
               "    return read(*args, **kwargs)\n"
               "pipeline.read_questions = watched\n"),
        config="limit_samples=1, retrieval_only=True", call="",
        report="print(json.dumps([result.run_info['status'], seen]))\n",
        participant=("--latency-ms", "1", "--add-latency-ms", "20", "--capacity", "64"))
    assert reported == ["completed", ["numpy.random", "numpy.ma", "ray.dag", "pyarrow.dataset"]]


@pytest.mark.usefixtures("ray_session")
def test_a_samples_first_parts_are_answered_while_its_last_search_is_still_out(tmp_path, locomo_file, monkeypatch):
    """The run's tail: with the offline models in the Ingest actor, a sample's last
    ``ANSWERED_LAST_ROWS`` questions are searched in a call of their own, and the others are answered and
    judged as their Searches return, so they are counted while the sample's last Search is still held at the
    participant. Before, a sample was answered
    only once its last Search had returned: the tail after the run's last Search held all of its rows'
    answering (24-36 ms for 81-152 rows at a one-at-a-time participant)."""
    import asyncio

    from fastapi import FastAPI

    from aml_ray.stages.ingest import ANSWERED_LAST_ROWS
    from scripts.loopback_servers import add_reply, search_reply
    from tests.servers import ThreadServer

    from aml_ray.datasets.registry import get_dataset
    from aml_ray.ids import IdScheme
    from aml_ray.run.inputs import build_inputs

    cfg = config(tmp_path, locomo_file, "http://127.0.0.1:9")
    first = get_dataset("locomo").load(locomo_file)[0]
    inputs = build_inputs([first], IdScheme("count", "locomo"), out_dir=tmp_path / "count")
    assert inputs.n_scorable > 2 * ANSWERED_LAST_ROWS  # a first part to answer before the last
    expected_searches = inputs.n_scorable + 1  # and the pre-flight's
    held, answered_while_held = threading.Event(), threading.Event()
    searches: dict[str, object] = {"n": 0}
    app = FastAPI()

    @app.post("/add")
    async def add(body: dict):
        return add_reply(body)

    @app.post("/search")
    async def search(body: dict):
        searches["n"] += 1
        if searches["n"] == expected_searches:  # the sample's last Search: held until answers are counted
            held.set()
            searches["released by the answers"] = await asyncio.to_thread(answered_while_held.wait, GUARD_S)
        return search_reply(body, 2)

    def seen(kind: str, values: dict) -> None:
        if kind == "done" and held.is_set() and values.get("answer", 0) >= inputs.n_scorable - ANSWERED_LAST_ROWS:
            answered_while_held.set()

    with ThreadServer(app) as server:
        spec = ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search",
                               max_in_flight=2)
        cfg.participant = spec
        # no head start: it would send every Add of the sample, and the Ingest actor's first two calls to the
        # participant's client would be the two Search calls, which an async actor need not run in the order
        # sent (Ray's actor task execution order); here the second part's then reached the participant first
        cfg.head_start = False
        result = evaluate(cfg, on_progress=seen)
    assert result.run_info["status"] == "completed"
    assert searches == {"n": expected_searches, "released by the answers": True}
