"""The Coding evaluation: Add trajectories, Search the problem, run the locked agent, test its diff.

One **attempt** is one task under one condition (one user_id):

1. ``relevant`` / ``noisy``: the condition's trajectories are Added in order (one session each,
   Textual chunking) through the ``ParticipantClient`` actor, then one Search with the problem statement
   (Top K, formal 100). ``baseline``: no Add, no Search; the same agent runs without memories.
2. The locked agent (:mod:`aml_ray.coding.agent`) runs on the driver through the ``ModelClient`` actor.
3. Its diff is tested in the sandbox as a Ray task with ``max_retries`` (:func:`sandbox_remote`).
4. The attempt is scored with SWE-bench's resolved rule (:mod:`aml_ray.coding.scoring`).

Attempts run concurrently (``max_concurrent_attempts``); the participant's and model's limits hold
through their actors, the sandbox's through Ray's CPU accounting. Evidence (Parquet, atomic)::

    <run_dir>/run.json, results.json, results.parquet (rates), gains.parquet
    <run_dir>/evidence/adds/<sample>.parquet         one row per Add chunk (Textual ADD_SCHEMA)
    <run_dir>/evidence/agent_steps/<sample>.parquet  one row per agent step (STEP_SCHEMA)
    <run_dir>/evidence/attempts/<sample>.parquet     one row per attempt (ATTEMPT_SCHEMA), written last

Resume: an attempt whose attempts file exists is read back, not run again (memory is never deleted).
A contract error or a non-retryable participant status stops the run (AML: "Contract errors stop
immediately"); run.json then says ``failed`` with the error.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

import aml_ray
from aml_ray.actors.participant import ParticipantError, ParticipantSpec
from aml_ray.coding.agent import STEP_SCHEMA, AgentBudget, AgentResult, run_agent
from aml_ray.coding.sandbox import (
    Sandbox,
    SandboxJob,
    SubprocessSandbox,
    TestReport,
    materialize_snapshot,
    sandbox_remote,
)
from aml_ray.coding.scoring import memory_gain, report_resolved, resolved_rates, summary
from aml_ray.coding.task import CONDITIONS, CodingBench, CodingTask, Condition
from aml_ray.coding.trajectories import add_requests, sample_id, search_request
from aml_ray.config import ModelEndpoint
from aml_ray.contract import FORMAL_TOP_K, ContractError
from aml_ray.run.evidence import ADD_SCHEMA, MEMORY_TYPE, RunDir, to_table, write_json_atomic, write_parquet_atomic
from aml_ray.ids import IdScheme, new_run_id
from aml_ray.prompts import load_prompt

TEST_TYPE = pa.struct([("nodeid", pa.string()), ("kind", pa.string()), ("outcome", pa.string())])

#: One row per attempt (task x condition).
ATTEMPT_SCHEMA = pa.schema([
    ("dataset", pa.string()), ("instance_id", pa.string()), ("repo", pa.string()), ("condition", pa.string()),
    ("sample_id", pa.string()), ("user_id", pa.string()), ("n_trajectories", pa.int32()),
    ("n_chunks", pa.int32()), ("add_status", pa.string()), ("add_error", pa.string()),
    ("search_status", pa.string()), ("search_error", pa.string()), ("search_latency_ms", pa.float64()),
    ("search_request_sha256", pa.string()), ("memories", pa.list_(MEMORY_TYPE)), ("n_memories", pa.int32()),
    ("memories_in_context", pa.int32()), ("memories_cut", pa.int32()), ("context_tokens", pa.int32()),
    ("agent_steps", pa.int32()), ("agent_stop_reason", pa.string()), ("agent_error", pa.string()),
    ("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()), ("diff", pa.string()),
    ("diff_sha256", pa.string()), ("sandbox_status", pa.string()), ("sandbox_detail", pa.string()),
    ("timed_out", pa.bool_()), ("tests", pa.list_(TEST_TYPE)), ("tests_wall_s", pa.float64()),
    ("isolation", pa.string()), ("files_changed", pa.list_(pa.string())), ("resolved", pa.bool_()),
    ("status", pa.string()), ("error", pa.string()), ("wall_s", pa.float64()),
    ("pytest_returncode", pa.int32()), ("pytest_summary", pa.string()), ("output_tail", pa.string()),
    ("cross_check", pa.string()), ("verdict_flags", pa.list_(pa.string())),
])


def _read_attempts(path: Path) -> pa.Table:
    """An attempts file in :data:`ATTEMPT_SCHEMA`; columns a file written before them lacks are null."""
    table = pq.read_table(path)
    for f in ATTEMPT_SCHEMA:
        if f.name not in table.column_names:
            table = table.append_column(f, pa.nulls(table.num_rows, f.type))
    return table.select(ATTEMPT_SCHEMA.names).cast(ATTEMPT_SCHEMA)


class CodingRunFailed(RuntimeError):
    """A contract error or non-retryable participant status stopped the run (run.json says why)."""


@dataclass
class CodingRunConfig:
    """Everything one Coding evaluation needs.

    Attributes:
        bench: the tasks and trajectories.
        participant: the memory system's endpoints and capacity.
        answer: the locked answer model's endpoint (the agent's model; an offline endpoint is refused).
        out_dir: the run directory.
        conditions: which conditions to run (default relevant, noisy, baseline).
        top_k: Search Top K (formal 100).
        budget: the agent's limits.
        sandbox: where tests run (default :class:`SubprocessSandbox` with default limits).
        run_id / run_label / participant_label: recorded in ids and run.json.
        max_concurrent_attempts: attempts in flight at once (default 8).
        sandbox_retries: Ray ``max_retries`` of a sandbox task (default 2).
        sandbox_cpus: CPUs reserved per sandbox task (default 1).
        limit_tasks: only the first N tasks.
        prompt / prompt_sha256: override of the agent's user-message template (name, path or URL) and its pin.
        system_prompt / system_prompt_sha256: override of the agent's fixed system prompt and its pin.
        resume: continue the run in ``out_dir`` (its run_id is reused; finished attempts are read back).
    """

    bench: CodingBench
    participant: ParticipantSpec
    answer: ModelEndpoint
    out_dir: Path
    conditions: tuple[Condition, ...] = CONDITIONS
    top_k: int = FORMAL_TOP_K
    budget: AgentBudget = field(default_factory=AgentBudget)
    sandbox: Sandbox = field(default_factory=SubprocessSandbox)
    run_id: str = field(default_factory=new_run_id)
    run_label: str | None = None
    participant_label: str | None = None
    max_concurrent_attempts: int = 8
    sandbox_retries: int = 2
    sandbox_cpus: float = 1.0
    limit_tasks: int | None = None
    prompt: str | None = None
    prompt_sha256: str | None = None
    system_prompt: str | None = None
    system_prompt_sha256: str | None = None
    resume: bool = False

    def __post_init__(self) -> None:
        bad = [c for c in self.conditions if c not in CONDITIONS]
        if bad or not self.conditions:
            raise ValueError(f"conditions {list(self.conditions)}: choose from {', '.join(CONDITIONS)}")
        if self.answer.offline:
            raise ValueError("the Coding track needs an answer model: set ANSWER_API_BASE and ANSWER_MODEL "
                             "(there is no offline coding agent)")
        if self.top_k < 1 or self.max_concurrent_attempts < 1:
            raise ValueError("top_k and max_concurrent_attempts must be >= 1")


@dataclass
class CodingResult:
    """A finished Coding run: the attempts, the rates per condition/repository and the gains."""

    run_dir: RunDir
    attempts: pl.DataFrame
    rates: pl.DataFrame
    gains: pl.DataFrame
    run_info: dict[str, Any]


def _folders(run_dir: RunDir) -> tuple[Path, Path]:
    return run_dir.root / "evidence" / "agent_steps", run_dir.root / "evidence" / "attempts"


def _prompts(cfg: CodingRunConfig):
    """The agent's user-message template and fixed system prompt, pinned when the config pins them."""
    from aml_ray.coding.agent import AGENT_PROMPT, AGENT_SYSTEM_PROMPT

    return (load_prompt(cfg.prompt or AGENT_PROMPT, cfg.prompt_sha256),
            load_prompt(cfg.system_prompt or AGENT_SYSTEM_PROMPT, cfg.system_prompt_sha256))


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class _Attempts:
    """Runs attempts; holds the actor handles, the id scheme, the prompt and the run directory."""

    def __init__(self, cfg: CodingRunConfig, participant, model, run_dir: RunDir, ids: IdScheme,
                 on_progress: Callable[[str, dict[str, int]], None] | None):
        from aml_ray.actors.model import ActorModel

        self.cfg, self.participant, self.model = cfg, participant, ActorModel(model)
        self.run_dir, self.ids, self.on_progress = run_dir, ids, on_progress
        self.prompt, self.system_prompt = _prompts(cfg)
        self.steps_dir, self.attempts_dir = _folders(run_dir)
        self.done = 0
        self._views: dict[str, Path] = {}
        self._view_lock = asyncio.Lock()
        self._tmp = Path(tempfile.mkdtemp(prefix="aml-coding-views-"))

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)

    async def _repo_view(self, task: CodingTask) -> Path:
        """The snapshot as a directory the agent can read (archives extracted once per task)."""
        assert task.snapshot is not None
        src = Path(task.snapshot)
        if src.is_dir():
            return src
        async with self._view_lock:
            if task.instance_id not in self._views:
                dest = self._tmp / task.instance_id
                await asyncio.to_thread(materialize_snapshot, src, dest)
                self._views[task.instance_id] = dest
        return self._views[task.instance_id]

    async def run(self, task: CodingTask, condition: Condition) -> dict[str, Any]:
        sid = sample_id(task.instance_id, condition)
        done_file = self.attempts_dir / f"{sid}.parquet"
        if done_file.is_file():  # resume: a finished attempt is never run twice
            return _read_attempts(done_file).to_pylist()[0]
        t0 = time.perf_counter()
        trajectories = self.cfg.bench.memory(task, condition)
        row: dict[str, Any] = {
            "dataset": self.ids.dataset, "instance_id": task.instance_id, "repo": task.repo,
            "condition": condition, "sample_id": sid, "user_id": self.ids.user_id(sid),
            "n_trajectories": len(trajectories), "n_chunks": 0, "add_status": "skipped",
            "search_status": "skipped", "memories": [], "n_memories": 0, "resolved": False, "status": "scored"}
        try:
            await self._attempt(task, condition, sid, trajectories, row)
        finally:
            row["wall_s"] = time.perf_counter() - t0
        write_parquet_atomic(to_table([row], ATTEMPT_SCHEMA), done_file)
        self.done += 1
        if self.on_progress:
            self.on_progress("done", {"attempts": self.done})
        return row

    async def _attempt(self, task: CodingTask, condition: Condition, sid: str, trajectories, row: dict) -> None:
        if task.snapshot is None:
            row.update(status="no_snapshot", error="no repository snapshot: the operator provides one per task "
                       "(see aml_ray/coding/README.md)")
            return
        memories: list[dict[str, Any]] = []
        if condition != "baseline":
            requests, meta = add_requests(self.ids, sid, trajectories)
            row["n_chunks"] = len(requests)
            if requests:
                outcomes = await self._participant(self.participant.add_sample.remote(
                    [r.model_dump(exclude_none=True) for r in requests]))
                write_parquet_atomic(to_table([{
                    "sample_id": sid, "chunk_index": m["chunk_index"], "n_words": m["n_words"],
                    "request_id": r.request_id, "user_id": r.user_id, "session_id": r.session_id,
                    "n_messages": len(r.messages), "request_sha256": o["request_sha256"], "status": o["status"],
                    "http_status": o["http_status"], "attempts": o["attempts"],
                    "retried_statuses": o["retried_statuses"], "latency_ms": o["latency_ms"],
                    "elapsed_ms": o["elapsed_ms"], "contract": "ok" if o["status"] == "ok" else None,
                    "error": o["error"]} for r, m, o in zip(requests, meta, outcomes)], ADD_SCHEMA),
                    self.run_dir.add_file(sid))
                failed = [o for o in outcomes if o["status"] != "ok"]
                row["add_status"] = "error" if failed else "ok"
                if failed:
                    row.update(status="add_error", add_error=failed[0]["error"], error=failed[0]["error"])
                    return
            req = search_request(self.ids, sid, task.problem_statement, self.cfg.top_k)
            ref = f"{self.ids.user_id(sid)}:q-problem"
            out = (await self._participant(self.participant.search_batch.remote(
                [{"ref": ref, "request": req.to_body()}])))[0]
            row.update(search_status=out["status"], search_error=out["error"], search_latency_ms=out["latency_ms"],
                       search_request_sha256=out["request_sha256"], memories=out["memories"],
                       n_memories=len(out["memories"]))
            if out["status"] != "ok":
                row.update(status="search_error", error=out["error"])
                return
            memories = out["memories"]
        agent = await run_agent(task.agent_view(), await self._repo_view(task), memories, model=self.model,
                                model_name=self.cfg.answer.model, budget=self.cfg.budget, prompt=self.prompt,
                                system_prompt=self.system_prompt)
        self._write_steps(sid, task, condition, agent)
        row.update(memories_in_context=agent.memories_in_context, memories_cut=agent.memories_cut,
                   context_tokens=agent.context_tokens, agent_steps=len(agent.steps),
                   agent_stop_reason=agent.stop_reason, agent_error=agent.error,
                   prompt_tokens=agent.prompt_tokens, completion_tokens=agent.completion_tokens,
                   diff=agent.diff, diff_sha256=_sha(agent.diff) if agent.diff else None)
        if agent.stop_reason == "model_error":
            row.update(status="model_error", error=agent.error)
            return
        if not agent.diff:  # no candidate: unresolved without running the tests (the bug is still there)
            row.update(sandbox_status="not_run", sandbox_detail="the agent submitted no diff")
            return
        job = SandboxJob(instance_id=task.instance_id, snapshot=task.snapshot, diff=agent.diff,
                         test_patch=task.test_patch, fail_to_pass=task.fail_to_pass, pass_to_pass=task.pass_to_pass)
        try:
            report: TestReport = await sandbox_remote(self.cfg.sandbox, job, max_retries=self.cfg.sandbox_retries,
                                                      num_cpus=self.cfg.sandbox_cpus)
        except Exception as exc:  # noqa: BLE001 - the worker died past its retries: recorded, the run goes on
            row.update(status="sandbox_error", sandbox_status="error", error=f"{type(exc).__name__}: {exc}")
            return
        f2p = set(task.fail_to_pass)
        detail = "; ".join(filter(None, [report.detail, report.harness_restored and (
            "harness files the diff touched, restored from the snapshot: " + ", ".join(report.harness_restored))]))
        row.update(sandbox_status=report.status, sandbox_detail=detail or None, timed_out=report.timed_out,
                   tests=[{"nodeid": t, "kind": "FAIL_TO_PASS" if t in f2p else "PASS_TO_PASS", "outcome": o}
                          for t, o in report.tests.items()],
                   tests_wall_s=report.wall_s, isolation=report.isolation, files_changed=report.files_changed,
                   resolved=report_resolved(report, task.fail_to_pass, task.pass_to_pass),
                   pytest_returncode=report.returncode, pytest_summary=report.summary_line,
                   output_tail=report.output_tail, cross_check=report.cross_check, verdict_flags=report.flags)
        if report.status == "error":  # the platform's side failed (snapshot, test patch, runtime)
            row.update(status="sandbox_error", error=report.detail, resolved=False)

    async def _participant(self, ref):
        try:
            return await ref
        except (ContractError, ParticipantError) as exc:
            raise CodingRunFailed(f"{type(exc).__name__}: {exc}") from exc

    def _write_steps(self, sid: str, task: CodingTask, condition: str, agent: AgentResult) -> None:
        rows = [{"sample_id": sid, "instance_id": task.instance_id, "condition": condition, **s} for s in agent.steps]
        write_parquet_atomic(to_table(rows, STEP_SCHEMA), self.steps_dir / f"{sid}.parquet")


def read_attempts(run_dir: RunDir) -> pl.DataFrame:
    """All attempt rows of a run (schema :data:`ATTEMPT_SCHEMA`)."""
    files = sorted(_folders(run_dir)[1].glob("*.parquet"))
    if not files:
        return pl.from_arrow(ATTEMPT_SCHEMA.empty_table())  # type: ignore[return-value]
    tables = [_read_attempts(f) for f in files]
    return pl.from_arrow(pa.concat_tables(tables))  # type: ignore[return-value]


def read_steps(run_dir: RunDir) -> pl.DataFrame:
    """All agent step rows of a run (schema :data:`STEP_SCHEMA`)."""
    files = sorted(_folders(run_dir)[0].glob("*.parquet"))
    if not files:
        return pl.from_arrow(STEP_SCHEMA.empty_table())  # type: ignore[return-value]
    tables = [pq.read_table(f).cast(STEP_SCHEMA) for f in files]
    return pl.from_arrow(pa.concat_tables(tables))  # type: ignore[return-value]


async def _run_all(cfg: CodingRunConfig, tasks: list[CodingTask], run_dir: RunDir, ids: IdScheme,
                   on_progress) -> list[dict[str, Any]]:
    from aml_ray.actors.model import spawn_model_client
    from aml_ray.actors.participant import spawn_participant_client

    import ray

    participant = spawn_participant_client(cfg.participant)
    model = spawn_model_client(cfg.answer)
    runner = _Attempts(cfg, participant, model, run_dir, ids, on_progress)
    gate = asyncio.Semaphore(cfg.max_concurrent_attempts)

    async def one(task: CodingTask, condition: Condition) -> dict[str, Any]:
        async with gate:
            return await runner.run(task, condition)

    try:
        return list(await asyncio.gather(*(one(t, c) for t in tasks for c in cfg.conditions)))
    finally:
        runner.close()
        for handle in (participant, model):
            try:
                await handle.aclose.remote()
            finally:
                ray.kill(handle)


def run_coding(cfg: CodingRunConfig, *, num_cpus: int | None = None,
               on_progress: Callable[[str, dict[str, int]], None] | None = None) -> CodingResult:
    """Run a Coding evaluation (see the module docstring).

    Args:
        cfg: the configuration.
        num_cpus: CPUs for a local Ray cluster started here (ignored when Ray is running).
        on_progress: called with ``("totals", {"attempts": n})`` once, then ``("done", {"attempts": k})``.

    Returns:
        The :class:`CodingResult`.

    Raises:
        CodingRunFailed: a contract error or non-retryable participant status; run.json says ``failed``.
        FileExistsError: ``out_dir`` holds a run and ``resume`` is False.
        SandboxUnavailable: this host cannot provide the sandbox's isolation (nothing was started).
    """
    import json

    from aml_ray.run.ray_runtime import init_ray

    cfg.sandbox.check()  # refuse to start where the sandbox cannot isolate the tests (no silent fallback)
    run_dir = RunDir(cfg.out_dir)
    if run_dir.run_json.exists():
        if not cfg.resume:
            raise FileExistsError(f"{run_dir.run_json} exists: choose a new directory or resume the run")
        cfg.run_id = json.loads(run_dir.run_json.read_text(encoding="utf-8"))["run_id"]
    tasks = list(cfg.bench.tasks[: cfg.limit_tasks] if cfg.limit_tasks else cfg.bench.tasks)
    ids = IdScheme(cfg.run_id, cfg.bench.name)
    prompt, system_prompt = _prompts(cfg)
    info: dict[str, Any] = {
        "run_id": cfg.run_id, "run_label": cfg.run_label, "track": "coding", "status": "running",
        "started_at": datetime.now(timezone.utc).isoformat(),
        "bench": {"name": cfg.bench.name, "root": str(cfg.bench.root) if cfg.bench.root else None,
                  "tasks": len(tasks), "repos": sorted({t.repo for t in tasks}),
                  "trajectories": len(cfg.bench.trajectories),
                  "without_snapshot": sum(t.snapshot is None for t in tasks)},
        "conditions": list(cfg.conditions), "attempts": len(tasks) * len(cfg.conditions), "top_k": cfg.top_k,
        "participant": {"label": cfg.participant_label, **cfg.participant.describe()},
        "models": {"answer": cfg.answer.describe()},
        "prompts": {role: {"name": p.name, "sha256": p.sha256, "source": p.path}
                    for role, p in (("agent", prompt), ("agent_system", system_prompt))},
        "agent_budget": asdict(cfg.budget), "sandbox": cfg.sandbox.describe(),
        "sandbox_retries": cfg.sandbox_retries, "package_version": aml_ray.__version__,
    }
    write_json_atomic(info, run_dir.run_json)
    if on_progress:
        on_progress("totals", {"attempts": info["attempts"]})
    started = init_ray(num_cpus=num_cpus)
    t0 = time.perf_counter()
    try:
        asyncio.run(_run_all(cfg, tasks, run_dir, ids, on_progress))
    except CodingRunFailed as exc:
        info.update(status="failed", error=str(exc), wall_s=round(time.perf_counter() - t0, 3),
                    finished_at=datetime.now(timezone.utc).isoformat())
        write_json_atomic(info, run_dir.run_json)
        raise
    finally:
        if started:
            from aml_ray.run.ray_runtime import shutdown_ray

            shutdown_ray()
    attempts = read_attempts(run_dir)
    rates = resolved_rates(attempts)
    gains = memory_gain(rates)
    write_parquet_atomic(rates.to_arrow(), run_dir.results_parquet)
    write_parquet_atomic(gains.to_arrow(), run_dir.root / "gains.parquet")
    head = summary(attempts)
    write_json_atomic({"run_id": cfg.run_id, "track": "coding", "summary": head, "rates": rates.to_dicts(),
                       "gains": gains.to_dicts()}, run_dir.results_json)
    info.update(status="completed", finished_at=datetime.now(timezone.utc).isoformat(),
                wall_s=round(time.perf_counter() - t0, 3), summary=head,
                statuses=dict(sorted(attempts.group_by("status").len().iter_rows())),
                sandbox_statuses=dict(sorted((str(k), v) for k, v in
                                             attempts.group_by("sandbox_status").len().iter_rows())),
                tokens={"prompt": int(attempts["prompt_tokens"].fill_null(0).sum()),
                        "completion": int(attempts["completion_tokens"].fill_null(0).sum())})
    write_json_atomic(info, run_dir.run_json)
    return CodingResult(run_dir=run_dir, attempts=attempts, rates=rates, gains=gains, run_info=info)
