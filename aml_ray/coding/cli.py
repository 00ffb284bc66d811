"""``aml-ray coding``: generate fixture benches and run the Coding evaluation.

``aml-ray coding generate OUT`` writes a bench of tiny repositories (offline, seeded);
``aml-ray coding run --bench OUT`` runs it against a participant with the answer model from
``ANSWER_API_BASE``/``ANSWER_MODEL`` (there is no offline coding agent).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

coding_app = typer.Typer(help="The Coding track: memory-assisted repository tasks scored by their tests.",
                         no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def rates_table(rates, gains, title: str) -> tuple[Table, Table]:
    """Rich tables of the resolved rates (per condition and repository) and the memory gains."""
    t = Table(title=title, caption="resolved rate ± standard error; coverage = scored / attempted")
    for col in ("condition", "repository", "attempted", "scored", "coverage", "resolved"):
        t.add_column(col, justify="left" if col in ("condition", "repository") else "right")
    for r in rates.to_dicts():
        t.add_row(r["condition"], r["repo"], str(r["n_attempted"]), str(r["n_scored"]), f"{r['coverage']:.3f}",
                  "not run" if r["resolved_rate"] is None else f"{r['resolved_rate']:.3f} ± {r['resolved_se']:.3f}",
                  style="bold" if r["repo"] == "overall" else None)
    g = Table(title="memory gain (resolved-rate difference)")
    for col in ("repository", "relevant", "noisy", "baseline", "relevant - noisy", "relevant - baseline"):
        g.add_column(col, justify="left" if col == "repository" else "right")

    for r in gains.to_dicts():
        g.add_row(r["repo"], *("-" if r[c] is None else f"{r[c]:.3f}" for c in ("relevant", "noisy", "baseline")),
                  *("-" if r[c] is None else f"{r[c]:+.3f}" for c in ("gain_vs_noisy", "gain_vs_baseline")),
                  style="bold" if r["repo"] == "overall" else None)
    return t, g


@coding_app.command("generate")
def generate(
    out: Annotated[Path, typer.Argument(help="Folder for the bench (bench.json, trajectories/, repos/).")],
    repos: Annotated[int, typer.Option(min=1, max=4, help="Number of repositories (tasks).")] = 3,
    tasks: Annotated[Optional[int], typer.Option(min=1, max=1000, help="Number of tasks (CAMBench's shape: 150); "
                                                 "overrides --repos.")] = None,
    seed: Annotated[int, typer.Option(help="Random seed (same seed, same files).")] = 0,
) -> None:
    """Write an offline fixture bench (bench.json and cambench.jsonl): tiny repositories with seeded bugs."""
    from aml_ray.cli_common import console, fail as _fail
    from aml_ray.coding.cambench import write_cambench
    from aml_ray.coding.fixtures import generate_bench

    if (out / "bench.json").exists():
        _fail(f"{out}/bench.json exists; choose an empty folder")
    bench, _ = generate_bench(out, n_repos=repos, seed=seed, n_tasks=tasks)
    write_cambench(bench, out)
    console.print(f"wrote {len(bench.tasks)} tasks ({', '.join(bench.repos())}) and "
                  f"{len(bench.trajectories)} trajectories to {out} (bench.json, cambench.jsonl)")


@coding_app.command("run")
def run(
    bench: Annotated[Optional[Path], typer.Option(help="A bench folder (bench.json).")] = None,
    cambench: Annotated[Optional[Path], typer.Option(help="A CAMBench task/condition file (cambench.jsonl; "
                                                     "format in aml_ray/coding/cambench.py).")] = None,
    swecontextbench: Annotated[Optional[Path], typer.Option(help="SWE-ContextBench Lite rows folder "
                                                            "(instead of --bench).")] = None,
    experience: Annotated[Optional[Path], typer.Option(help="Past-experience transcripts (*.jsonl) for "
                                                       "--swecontextbench.")] = None,
    snapshots: Annotated[Optional[Path], typer.Option(help="Repository snapshots, one per instance_id "
                                                      "(folder or archive), for --swecontextbench.")] = None,
    participant: Annotated[str, typer.Option(help="Participant base URL or 'reference:bm25'.")] = "reference:bm25",
    add_url: Annotated[Optional[str], typer.Option(help="Add endpoint override.")] = None,
    search_url: Annotated[Optional[str], typer.Option(help="Search endpoint override.")] = None,
    auth: Annotated[str, typer.Option(help="none | Token | Bearer | X-Api-Key")] = "none",
    secret_env: Annotated[Optional[str], typer.Option(help="Variable holding the Memory System Key.")] = None,
    conditions: Annotated[str, typer.Option(help="Comma-separated: relevant,noisy,baseline.")
                          ] = "relevant,noisy,baseline",
    top_k: Annotated[int, typer.Option(min=1, help="Search Top K (formal: 100).")] = 100,
    out: Annotated[Optional[Path], typer.Option(help="Run directory (default ./runs/<run_id>).")] = None,
    resume: Annotated[bool, typer.Option(help="Continue the run in --out.")] = False,
    limit_tasks: Annotated[Optional[int], typer.Option(min=1, help="Only the first N tasks.")] = None,
    max_steps: Annotated[int, typer.Option(min=1, help="Agent steps per attempt.")] = 8,
    max_total_tokens: Annotated[int, typer.Option(min=1, help="Agent tokens per attempt.")] = 200_000,
    wall_clock_s: Annotated[float, typer.Option(help="Test wall-clock limit, seconds.")] = 300.0,
    memory_mb: Annotated[int, typer.Option(help="Test address-space limit, MiB.")] = 4096,
    pids_limit: Annotated[int, typer.Option(min=8, help="Most processes/threads the tests may have.")] = 256,
    unsandboxed: Annotated[bool, typer.Option(
        "--unsandboxed", help="UNSAFE: run the tests without namespaces (no read-only root, no pid or network "
                              "namespace); recorded as unsandboxed in run.json and every attempt.")] = False,
    python: Annotated[Optional[str], typer.Option(help="Interpreter that runs the tests.")] = None,
    container_image: Annotated[Optional[str], typer.Option(help="Run tests in this image ({instance_id} is "
                                                           "replaced) instead of a subprocess.")] = None,
    container_runtime: Annotated[str, typer.Option(help="docker | podman")] = "docker",
    max_in_flight: Annotated[int, typer.Option(min=1, help="Participant's max in-flight requests.")] = 64,
    rps: Annotated[Optional[float], typer.Option(help="Participant's requests/s limit.")] = None,
    num_cpus: Annotated[Optional[int], typer.Option(help="CPUs for the local Ray cluster.")] = None,
) -> None:
    """Run the Coding evaluation and print resolved rates per condition and the memory gain."""
    from aml_ray.cli_common import console, fail as _fail, open_participant as _participant
    from aml_ray.coding.agent import AgentBudget
    from aml_ray.coding.bench import load_bench
    from aml_ray.coding.cambench import load_cambench
    from aml_ray.coding.runner import CodingRunConfig, CodingRunFailed, run_coding
    from aml_ray.coding.sandbox import ContainerSandbox, SandboxConfig, SandboxUnavailable, SubprocessSandbox
    from aml_ray.coding.swecontextbench import lite_bench
    from aml_ray.config import model_endpoint_from_env
    from aml_ray.ids import new_run_id

    if sum(x is not None for x in (bench, cambench, swecontextbench)) != 1:
        _fail("give exactly one of --bench, --cambench and --swecontextbench")
    try:
        loaded = (load_bench(bench) if bench else load_cambench(cambench) if cambench
                  else lite_bench(swecontextbench, experience_dir=experience, snapshots_dir=snapshots))
        answer = model_endpoint_from_env("answer")
        config = SandboxConfig(wall_clock_s=wall_clock_s, memory_mb=memory_mb, pids_limit=pids_limit,
                               unsandboxed=unsandboxed, python=python)
    except (FileNotFoundError, ValueError) as exc:
        _fail(str(exc))
    sandbox = (ContainerSandbox(container_image, config, runtime=container_runtime) if container_image
               else SubprocessSandbox(config))
    try:
        sandbox.check()
    except SandboxUnavailable as exc:
        _fail(str(exc))
    if unsandboxed:
        console.print("[bold red]--unsandboxed: the tests run WITHOUT isolation; every attempt records "
                      "isolation=unsandboxed[/]")
    run_id = new_run_id()
    out = out or Path("runs") / run_id
    out.mkdir(parents=True, exist_ok=True)
    with _participant(participant, add_url, search_url, auth, secret_env, out, max_in_flight, rps) as (label, spec):
        try:
            cfg = CodingRunConfig(bench=loaded, participant=spec, answer=answer, out_dir=out,
                                  conditions=tuple(c.strip() for c in conditions.split(",") if c.strip()),
                                  top_k=top_k,
                                  budget=AgentBudget(max_steps=max_steps, max_total_tokens=max_total_tokens),
                                  sandbox=sandbox, run_id=run_id, participant_label=label, limit_tasks=limit_tasks,
                                  resume=resume)
            console.print(f"[bold]aml-ray coding[/] run [cyan]{cfg.run_id}[/]: {loaded.name} "
                          f"({len(loaded.tasks)} tasks) x {label} -> {out}")
            result = run_coding(cfg, num_cpus=num_cpus)
        except (CodingRunFailed, FileExistsError, ValueError) as exc:
            _fail(f"{exc}\n  run.json and evidence are in {out}")
    rates, gains = rates_table(result.rates, result.gains,
                               f"{loaded.name}: {label} (run {result.run_info['run_id']})")
    console.print(rates)
    console.print(gains)
    console.print(f"evidence: {out}/evidence (attempts, agent_steps, adds); run.json and results.json in {out}")
