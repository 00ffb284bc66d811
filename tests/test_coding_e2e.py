"""The Coding track end to end on generated repositories: the reference memory system, a local
OpenAI-compatible server as the agent's model, the sandbox on Ray. The scripted model writes the right
diff only when the fix's clue is among the retrieved memories in its prompt."""

from __future__ import annotations

import json
import sqlite3

import polars as pl
import pytest
from pydantic import SecretStr

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.coding.fixtures import generate_bench
from aml_ray.coding.runner import CodingRunConfig, read_attempts, read_steps, run_coding
from aml_ray.coding.sandbox import SandboxConfig, SubprocessSandbox
from aml_ray.config import ModelEndpoint
from aml_ray.run.evidence import RunDir, read_adds
from aml_ray.reference.server import ReferenceServer
from tests.fake_openai import FakeOpenAI, Reply
from tests.servers import ThreadServer

pytestmark = pytest.mark.usefixtures("ray_session")


def clue_script(bench, keys):
    """First step: READ the buggy module. Then DIFF: the fix when the clue is in <memories>, else a
    plausible wrong fix."""
    by_problem = {t.problem_statement: k for t, k in zip(bench.tasks, keys)}

    def script(prompt: str, n: int) -> Reply:
        key = next(k for problem, k in by_problem.items() if problem in prompt)
        if '<step n="1">' not in prompt:
            return Reply(f"Let me look at the code first.\nREAD {key.module}")
        memories = prompt.split("<memories>", 1)[1].split("</memories>", 1)[0]
        if key.clue in memories:
            return Reply(f"The memories show the correct line.\nDIFF\n```diff\n{key.fix_diff}```")
        return Reply(f"DIFF\n{key.wrong_diff}")

    return script


def test_relevant_memory_resolves_noisy_does_not(tmp_path):
    bench, keys = generate_bench(tmp_path / "bench", n_repos=3, seed=7)
    fake = FakeOpenAI(clue_script(bench, keys))
    with ThreadServer(fake.app) as http, ReferenceServer(tmp_path / "ref") as ref:
        cfg = CodingRunConfig(
            bench=bench, participant=ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url),
            answer=ModelEndpoint(role="answer", base_url=f"{http.base_url}/v1", model="gpt-4o-mini",
                                 api_key=SecretStr("sk-agent")),
            out_dir=tmp_path / "run", sandbox=SubprocessSandbox(SandboxConfig(wall_clock_s=60)),
            run_id="run_e2e", participant_label="reference:bm25")
        result = run_coding(cfg)
        db = sqlite3.connect(ref.db_path)
        stored = "\n".join(str(r) for table in [t[0] for t in db.execute(
            "SELECT name FROM sqlite_master WHERE type='table'")] for r in db.execute(f"SELECT * FROM {table}"))
        db.close()

    attempts = result.attempts
    assert attempts.height == 9 and set(attempts["status"]) == {"scored"}
    assert read_attempts(result.run_dir).sort("sample_id").equals(attempts.sort("sample_id"))
    by_cond = {c: attempts.filter(pl.col("condition") == c) for c in ("relevant", "noisy", "baseline")}
    assert by_cond["relevant"]["resolved"].to_list() == [True] * 3
    assert by_cond["noisy"]["resolved"].to_list() == [False] * 3
    assert by_cond["baseline"]["resolved"].to_list() == [False] * 3
    # the participant returned the relevant trajectory (with the clue) only under the relevant condition
    for key in keys:
        rel = attempts.filter((pl.col("instance_id") == key.instance_id) & (pl.col("condition") == "relevant"))
        noisy = attempts.filter((pl.col("instance_id") == key.instance_id) & (pl.col("condition") == "noisy"))
        assert any(key.clue in m["content"] for m in rel["memories"][0])
        assert not any(key.clue in m["content"] for m in noisy["memories"][0])
    assert by_cond["baseline"]["n_memories"].to_list() == [0] * 3
    assert set(by_cond["baseline"]["search_status"]) == {"skipped"}

    # scores: per condition and repository, with coverage and the memory gain
    overall = result.rates.filter(pl.col("repo") == "overall")
    rate = dict(zip(overall["condition"], overall["resolved_rate"]))
    assert rate == {"baseline": 0.0, "noisy": 0.0, "relevant": 1.0}
    assert set(overall["coverage"]) == {1.0}
    assert result.rates.filter(pl.col("repo") != "overall").height == 9  # 3 conditions x 3 repositories
    gains = result.gains.filter(pl.col("repo") == "overall").to_dicts()[0]
    assert gains["gain_vs_noisy"] == 1.0 and gains["gain_vs_baseline"] == 1.0
    info = json.loads(result.run_dir.run_json.read_text())
    assert info["status"] == "completed" and info["summary"]["gain_vs_noisy"] == 1.0
    assert info["prompts"]["agent"]["name"] == "coding_agent" and info["sandbox"]["kind"] == "subprocess"
    assert info["prompts"]["agent_system"]["name"] == "coding_agent_system"
    assert json.loads(result.run_dir.results_json.read_text())["summary"]["conditions"]["relevant"]["n_resolved"] == 3

    # evidence: every Add chunk, every agent step, every test outcome
    adds = read_adds(result.run_dir)
    assert adds.height == int(attempts["n_chunks"].sum()) and set(adds["status"]) == {"ok"}
    assert adds["user_id"].str.starts_with("eval:run_e2e:cambench-local:").all()
    relevant_chunks = attempts.filter(pl.col("condition") == "relevant")["n_chunks"].to_list()
    assert all(n >= 2 for n in relevant_chunks)  # the relevant trajectory has more than 20 turns
    steps = read_steps(result.run_dir)
    assert steps.height == 18 and steps["action"].to_list().count("DIFF") == 9
    assert set(steps.filter(pl.col("action") == "READ")["observation"].str.contains("def ").to_list()) == {True}
    tests = attempts.filter(pl.col("condition") == "relevant")["tests"].to_list()
    assert all(t["outcome"] == "passed" for row in tests for t in row)
    assert attempts["isolation"].drop_nulls().unique().len() == 1
    ran = attempts.filter(pl.col("sandbox_status") == "ok")
    assert ran.height == 9 and set(ran["cross_check"]) == {"agree"} and ran["verdict_flags"].list.len().sum() == 0
    assert set(ran.filter(pl.col("condition") == "relevant")["pytest_returncode"]) == {0}
    assert ran["pytest_summary"].str.contains(r" passed in [\d.]+s$").all()
    assert ran["output_tail"].str.ends_with(ran["pytest_summary"] + "\n").all()
    assert info["sandbox"]["bounds"]["disk"].startswith("/testbed on a tmpfs of 2048 MiB")
    assert info["sandbox"]["bounds"]["cgroup"].startswith("not used (fallback above): ")

    # the gold patch and the hidden tests never reached the model or the participant
    for task in bench.tasks:
        hidden = next(ln for ln in task.test_patch.splitlines() if ln.startswith("+def "))[1:]
        assert task.gold_patch not in stored and all(task.gold_patch not in call for call in fake.calls)
        assert hidden not in stored and all(hidden not in call for call in fake.calls)
        for call in (c for c in fake.calls if task.problem_statement in c and "(no memories)" in c):
            assert keys[bench.tasks.index(task)].clue not in call  # baseline prompts never see the fix
    assert "sk-agent" not in result.run_dir.run_json.read_text()
    assert set(fake.temperatures) == {0}


def test_resume_reads_finished_attempts_back(tmp_path):
    bench, keys = generate_bench(tmp_path / "bench", n_repos=1, seed=2)
    fake = FakeOpenAI(clue_script(bench, keys))
    with ThreadServer(fake.app) as http, ReferenceServer(tmp_path / "ref") as ref:
        def config(**kw):
            return CodingRunConfig(
                bench=bench, participant=ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url),
                answer=ModelEndpoint(role="answer", base_url=f"{http.base_url}/v1", model="m"),
                out_dir=tmp_path / "run", conditions=("relevant",),
                sandbox=SubprocessSandbox(SandboxConfig(wall_clock_s=60)), **kw)

        first = run_coding(config())
        calls = len(fake.calls)
        with pytest.raises(FileExistsError):
            run_coding(config())
        again = run_coding(config(resume=True))
    assert len(fake.calls) == calls  # nothing was asked again
    assert again.attempts["resolved"].to_list() == first.attempts["resolved"].to_list() == [True]
    assert again.run_info["run_id"] == first.run_info["run_id"]
    assert RunDir(tmp_path / "run").run_json.is_file()


def test_refused_looping_and_breaking_diffs_are_recorded_unresolved(tmp_path):
    """Through the runner: relevant -> a diff outside the repository, noisy -> an endless loop,
    baseline -> a fix that breaks a passing test. Each is scored unresolved, with its reason in evidence."""
    bench, keys = generate_bench(tmp_path / "bench", n_repos=1, seed=4)
    key = keys[0]

    def script(prompt: str, n: int) -> Reply:
        memories = prompt.split("<memories>", 1)[1].split("</memories>", 1)[0]
        if key.clue in memories:
            return Reply("DIFF\n--- a/../escape.py\n+++ b/../escape.py\n@@ -0,0 +1 @@\n+print('out')\n")
        if "(no memories)" in memories:
            return Reply("DIFF\n" + key.breaking_diff)
        return Reply("DIFF\n" + key.looping_diff)

    fake = FakeOpenAI(script)
    with ThreadServer(fake.app) as http, ReferenceServer(tmp_path / "ref") as ref:
        result = run_coding(CodingRunConfig(
            bench=bench, participant=ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url),
            answer=ModelEndpoint(role="answer", base_url=f"{http.base_url}/v1", model="m"),
            # the looping diff runs to this limit; the baseline's tests take a few seconds on a busy machine
            out_dir=tmp_path / "run", sandbox=SubprocessSandbox(SandboxConfig(wall_clock_s=20))))
    rows = {r["condition"]: r for r in result.attempts.to_dicts()}
    assert all(r["status"] == "scored" and r["resolved"] is False for r in rows.values())
    assert rows["relevant"]["sandbox_status"] == "refused" and "'..'" in rows["relevant"]["sandbox_detail"]
    assert rows["noisy"]["sandbox_status"] == "timeout" and rows["noisy"]["timed_out"] is True
    assert {t["outcome"] for t in rows["noisy"]["tests"]} <= {"timeout", "not_run"}
    broken = {t["nodeid"]: t for t in rows["baseline"]["tests"]}
    assert rows["baseline"]["sandbox_status"] == "ok"
    assert all(t["outcome"] == "passed" for t in broken.values() if t["kind"] == "FAIL_TO_PASS")
    assert any(t["outcome"] == "failed" for t in broken.values() if t["kind"] == "PASS_TO_PASS")
    assert result.run_info["sandbox_statuses"] == {"ok": 1, "refused": 1, "timeout": 1}
    assert set(result.rates["resolved_rate"]) == {0.0} and set(result.rates["coverage"]) == {1.0}
    assert not (tmp_path / "escape.py").exists()
