"""``aml-ray rejudge RUN_DIR... --panel``: finished runs' answers judged under every protocol of the judge panel.

For each run the stored answers (never regenerated) are judged under each protocol of
:data:`aml_ray.scoring.panel.PANEL` with the judge configured now (``JUDGE_*`` variables, or offline
stand-ins); a calibration set, when given, is judged under each protocol once. Written per run to
``RUN_DIR/rejudge/<label>/``: ``panel.json`` (``panel``: each protocol's prompt name and sha256, and its offline
rule when offline; the run's report, :func:`aml_ray.scoring.panel.run_report`; ``calibration``; ``board`` when
several runs were given) and ``questions-<protocol>.parquet`` (the rows
as judged under each protocol). The original evidence is never touched.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aml_ray.config import ModelEndpoint
from aml_ray.scoring.calibration import CalibrationItem
from aml_ray.scoring.panel import (PANEL, PANEL_SCORERS, GENERAL_VARIANT, PanelProtocol, board_report,
                                   calibration_report, label_of, offline_verdict, run_report)

#: The question evidence columns the panel reads (never the memories).
COLUMNS = ("question_id", "sample_id", "question", "gold", "answer", "category", "excluded", "search_status",
           "answer_status")


@dataclass
class RunPanel:
    """One run's panel: where it was written and its report (``panel.json``'s content)."""

    run_id: str
    name: str
    out_dir: Path
    report: dict[str, Any]


@dataclass
class PanelResult:
    """The panel over one or more runs.

    Attributes:
        runs: one :class:`RunPanel` per run, in the order given.
        calibration: the calibration report, or None without a calibration set.
        board: :func:`aml_ray.scoring.panel.board_report` over the runs, or None for one run.
        offline: whether the offline stand-ins judged (no judge endpoint).
    """

    runs: list[RunPanel]
    calibration: dict[str, Any] | None = None
    board: dict[str, Any] | None = None
    offline: bool = False
    protocols: list[dict[str, Any]] = field(default_factory=list)


def _status(row: dict[str, Any]) -> str:
    return ("search_error" if row["search_status"] != "ok" else "answer_error" if row["answer_status"] != "ok" else
            "judge_error" if row.get("judge_status") != "ok" else "scored")


def _golds(row: dict[str, Any]) -> list[str]:
    gold = json.loads(row["gold"])
    return [str(g) for g in gold] if isinstance(gold, list) else [str(gold)]


async def judge_under(protocol: PanelProtocol, rows: list[dict[str, Any]], *, scorer_name: str, suite_prompt,
                      judge: ModelEndpoint, model) -> list[dict[str, Any]]:
    """Copies of ``rows`` judged under ``protocol`` (their ``verdict``, ``judge_raw``, ``status`` filled).

    Args:
        protocol: the panel protocol.
        rows: answered or unanswered question rows (:data:`COLUMNS`); not changed.
        scorer_name: the dataset's scorer (``binary_judge`` or ``category_judge``).
        suite_prompt: the run's own judge prompt (:class:`aml_ray.prompts.Prompt`), for the ``suite`` protocol.
        judge: the judge endpoint; offline: :func:`aml_ray.scoring.panel.offline_verdict`.
        model: the judge model client, None offline.
    """
    from aml_ray.prompts import load_prompt
    from aml_ray.stages.category_judge import bind
    from aml_ray.stages.judge import judge_rows
    from aml_ray.stages.scorers import get_scorer
    from aml_ray.stages.scorers_upstream import yes_no_rows

    out = [{**r, "verdict": None, "judge_raw": None, "judge_status": None, "judge_error": None} for r in rows]
    todo = [r for r in out if not r["excluded"] and r["answer_status"] == "ok"]
    if judge.offline:
        for r in todo:
            r["verdict"], r["judge_raw"] = offline_verdict(protocol.name, r["answer"], _golds(r))
            r["judge_status"] = "ok"
    elif todo:
        kw = {"endpoint": judge, "model": model, "f1_rule": "token", "max_parse_retries": 2, "judge_runs": 1}
        if protocol.prompt is None:
            await get_scorer(scorer_name)(todo, prompt=suite_prompt, **kw)
        elif protocol.name == "longmemeval-upstream" and scorer_name != "category_judge":
            await yes_no_rows(todo, prompt=bind(load_prompt(protocol.prompt), category=GENERAL_VARIANT), **kw)
        elif protocol.name == "longmemeval-upstream":
            await get_scorer("category_judge")(todo, prompt=load_prompt(protocol.prompt), **kw)
        else:
            await judge_rows(todo, prompt=load_prompt(protocol.prompt), **kw)
    for r in out:
        r["status"] = None if r["excluded"] else _status(r)
    return out


def _read_run(root: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from aml_ray.run.evidence import RunDir, read_questions
    from aml_ray.run.rejudge import completed_run_info

    run_dir = RunDir(root)
    return completed_run_info(run_dir), read_questions(run_dir, COLUMNS).to_dicts()


def _run_name(info: dict[str, Any]) -> str:
    label = (info.get("participant") or {}).get("label") or info.get("run_label")
    return f"{info['run_id']} ({label})" if label else info["run_id"]


def rejudge_panel(run_roots: list[Path], judge: ModelEndpoint, *, label: str | None = None,
                  calibration: list[CalibrationItem] | None = None, batch_size: int = 64) -> PanelResult:
    """Judge finished runs' answers under every panel protocol; write and return the reports.

    Args:
        run_roots: one or more completed run directories of one dataset, judged by one judge prompt.
        judge: the judge endpoint (offline: the lexical stand-ins).
        label: folder name under each run's ``rejudge/`` (default ``panel-<UTC timestamp>``).
        calibration: items with human verdicts (:func:`aml_ray.scoring.calibration.load_calibration`), or None.
        batch_size: questions per concurrent batch.

    Raises:
        FileNotFoundError: a directory without run.json.
        ValueError: a run that did not complete or is given twice; runs of different datasets or judge prompts; a
            dataset whose scorer is not a binary judge (rubric or option scoring); a label that exists.
    """
    from aml_ray.actors.model import ModelClient
    from aml_ray.datasets.registry import get_dataset
    from aml_ray.prompts import load_prompt
    from aml_ray.run.evidence import write_json_atomic, write_parquet_atomic
    import pyarrow as pa

    if not run_roots:
        raise ValueError("no run directory given: pass at least one RUN_DIR")
    loaded = [(Path(root), *_read_run(Path(root))) for root in run_roots]
    first = loaded[0][1]
    ids = [info["run_id"] for _, info, _ in loaded]
    if len(set(ids)) != len(ids):
        raise ValueError(f"a run is given twice (run ids {ids}): give each run directory once")
    for root, info, _ in loaded[1:]:
        if info["dataset"]["name"] != first["dataset"]["name"]:
            raise ValueError(f"{root} is a {info['dataset']['name']!r} run and {loaded[0][0]} a "
                             f"{first['dataset']['name']!r} run: a board compares runs of one dataset")
        if info["prompts"]["judge"]["sha256"] != first["prompts"]["judge"]["sha256"]:
            raise ValueError(f"{root} was judged with another judge prompt than {loaded[0][0]}: a board compares "
                             "runs judged alike")
    spec = get_dataset(first["dataset"]["name"])
    if spec.scorer not in PANEL_SCORERS:
        raise ValueError(f"dataset {spec.name!r} is scored by {spec.scorer!r}; the judge panel re-judges binary "
                         f"judges only ({', '.join(PANEL_SCORERS)})")
    pinned = first["prompts"]["judge"]
    suite_prompt = load_prompt(pinned.get("source") if Path(str(pinned.get("source"))).is_file() else pinned["name"],
                               pinned["sha256"])
    label = label or datetime.now(timezone.utc).strftime("panel-%Y%m%dT%H%M%SZ")
    for root, _, _ in loaded:
        if (root / "rejudge" / label).exists():
            raise ValueError(f"{root / 'rejudge' / label} exists: choose another --label")

    async def judge_all() -> tuple[list[dict[str, list[dict[str, Any]]]], dict[str, list[str]]]:
        model = None if judge.offline else ModelClient(judge)

        async def under(protocol: PanelProtocol, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
            done: list[dict[str, Any]] = []
            for i in range(0, len(rows), batch_size):
                done += await judge_under(protocol, rows[i:i + batch_size], scorer_name=spec.scorer,
                                          suite_prompt=suite_prompt, judge=judge, model=model)
            return done

        try:
            per_run = [{p.name: await under(p, rows) for p in PANEL} for _, _, rows in loaded]
            cal = {}
            if calibration:
                cal_rows = [item.as_row() for item in calibration]
                cal = {p.name: [label_of(r) for r in await under(p, cal_rows)] for p in PANEL}
            return per_run, cal
        finally:
            if model is not None:
                await model.aclose()

    per_run, cal_labels = asyncio.run(judge_all())
    result = PanelResult(runs=[], offline=judge.offline,
                         protocols=[{"name": p.name, **_prompt_of(p, suite_prompt),
                                     **({"offline_rule": p.offline_rule} if judge.offline else {})} for p in PANEL])
    if calibration:
        result.calibration = calibration_report([item.human_verdict for item in calibration], cal_labels)
    for (root, info, _), judged in zip(loaded, per_run):
        result.runs.append(RunPanel(run_id=info["run_id"], name=_run_name(info), out_dir=root / "rejudge" / label,
                                    report=run_report(judged)))
    if len(result.runs) > 1:
        result.board = board_report({run.name: {p["name"]: p["accuracy"] or 0.0 for p in run.report["protocols"]}
                                     for run in result.runs})
    for run, judged in zip(result.runs, per_run):
        for name, rows in judged.items():
            write_parquet_atomic(pa.Table.from_pylist(rows), run.out_dir / f"questions-{name}.parquet")
        write_json_atomic({"source_run_id": run.run_id, "name": run.name, "judge": judge.describe(),
                           "offline": judge.offline, "panel": result.protocols, **run.report,
                           "calibration": result.calibration, "board": result.board,
                           "finished_at": datetime.now(timezone.utc).isoformat()}, run.out_dir / "panel.json")
    return result


def _prompt_of(protocol: PanelProtocol, suite_prompt) -> dict[str, Any]:
    from aml_ray.prompts import load_prompt

    prompt = suite_prompt if protocol.prompt is None else load_prompt(protocol.prompt)
    return {"prompt": prompt.name, "sha256": prompt.sha256}
