"""The console tables of ``aml-ray rejudge --panel`` (rich): per-protocol accuracy, agreement, calibration, board."""

from __future__ import annotations

from rich.table import Table

from aml_ray.run.panel import PanelResult

#: Disagreeing questions printed per run (panel.json holds them all).
SHOWN_DISAGREEMENTS = 5


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def panel_tables(result: PanelResult) -> list[Table]:
    """The tables to print for a panel result, in order: per run (protocols, pairs), calibration, board."""
    offline = " (offline lexical stand-ins, not judge models)" if result.offline else ""
    tables = []
    for run in result.runs:
        t = Table(title=f"judge panel: {run.name}{offline}",
                  caption=f"spread {_num(run.report['spread'])}; {len(run.report['disagreements'])} questions where "
                          f"the protocols disagree (written to {run.out_dir / 'panel.json'})")
        for col in ("protocol", "accuracy [95 % CI]", "questions", "judge errors"):
            t.add_column(col)
        for p in run.report["protocols"]:
            t.add_row(p["name"], f"{_num(p['accuracy'])} [{_num(p['ci_low'])}, {_num(p['ci_high'])}]",
                      str(p["questions"]), str(p["judge_errors"]))
        answered = run.report["protocols"][0]["answered"] if run.report["protocols"] else 0
        pairs = Table(title=f"agreement between protocols: {run.name}",
                      caption=f"over the {answered} answered questions; below, the first questions they disagree on")
        for col in ("protocols", "agreement", "Cohen's kappa"):
            pairs.add_column(col)
        for pair in run.report["pairs"]:
            pairs.add_row(f"{pair['a']} / {pair['b']}", _num(pair["agreement"]), _num(pair["kappa"]))
        for d in run.report["disagreements"][:SHOWN_DISAGREEMENTS]:
            labels = ", ".join(f"{k} {v}" for k, v in d["labels"].items())
            pairs.add_row(f"  {d['question_id']}", labels, "")
        tables += [t, pairs]
    if result.calibration:
        c = Table(title=f"calibration set: {result.calibration['items']} items, human CORRECT "
                        f"{_num(result.calibration['human_correct'])}")
        for col in ("protocol", "agreement with human", "Cohen's kappa", "accuracy"):
            c.add_column(col)
        for p in result.calibration["protocols"]:
            c.add_row(p["name"], _num(p["agreement"]), _num(p["kappa"]), _num(p["accuracy"]))
        tables.append(c)
    if result.board:
        names = [p["name"] for p in result.runs[0].report["protocols"]]
        taus = "; ".join(f"tau({t['a']}, {t['b']}) {_num(t['tau'])}" for t in result.board["taus"])
        flips = ", ".join(result.board["flips"]) or "none"
        b = Table(title="board: rank under each protocol", caption=f"Kendall {taus}. Ranks that flip: {flips}")
        b.add_column("run")
        for name in names:
            b.add_column(f"{name} accuracy (rank)")
        for run in result.runs:
            acc = {p["name"]: p["accuracy"] for p in run.report["protocols"]}
            b.add_row(run.name, *(f"{_num(acc[n])} ({result.board['ranks'][run.name][n]})" for n in names))
        tables.append(b)
    return tables
