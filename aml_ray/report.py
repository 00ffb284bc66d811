"""A self-contained HTML report of one or more runs: ``aml-ray report RUN_DIR [RUN_DIR ...] --out report.html``.

One HTML file with everything inline: CSS in a ``<style>`` element, each plot a base64 PNG in an ``<img>``
``data:`` URI; no script, no font, no stylesheet or image is fetched (no CDN, no external URL), so the
file opens offline and can be attached to an issue or a review. Plots (matplotlib, the Agg canvas; several
runs overlaid, one colour each):

- accuracy per category and overall, with the 95 % percentile bootstrap interval as error bars
  (:func:`aml_ray.scoring.aggregate`, recomputed from the question evidence, so a run written before the
  interval columns gets them too);
- Add latency (``latency_ms`` of the Adds whose status is ``ok``) and Search latency (``search_latency_ms``
  of the questions whose Search succeeded), in milliseconds: histograms, log-spaced bins when the values
  span more than two decades, the median as a dashed line;
- context tokens: the tokens of the answer context per non-excluded question (``context_tokens``);
- what ``aml-ray explain`` found, where it was run (:mod:`aml_ray.explain.figures`): the reference baselines
  beside each score, the failure attribution bar and the accuracy-vs-context-budget curve per dataset.

A suite run directory (``suite.json``, no ``run.json``) stands for each of its bundles that ran.
"""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

import aml_ray
from aml_ray.run.evidence import RunDir, read_adds, read_questions
from aml_ray.scoring.aggregate import OVERALL, STATUSES, aggregate, latency_summary
from aml_ray.scoring.bootstrap import CONFIDENCE, RESAMPLES, SEED

#: Question evidence columns the report reads (never the memories, answers or judge texts).
QUESTION_COLUMNS = ("category", "excluded", "status", "verdict", "score", "f1", "bleu1", "search_status",
                    "search_latency_ms", "context_tokens")
#: Colours of the runs, in order (matplotlib's default "tab10" cycle; colour-blind-safe enough for 2-4 runs).
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
#: Figure resolution in dots per inch (PNG); figures are drawn in inches and shown at their CSS width.
DPI = 110
#: Values spanning more than this ratio (max / min) get log-spaced histogram bins and a log axis.
LOG_SPAN = 100.0
BINS = 30


@dataclass
class RunData:
    """What the report shows of one run.

    Attributes:
        root: the run directory.
        info: its run.json.
        label: the run label, else the participant label (a bundle name is added for a suite's runs).
        table: the score table (:func:`aml_ray.scoring.aggregate`; empty for a retrieval-only run).
        add_ms / search_ms: latencies (ms) of the successful Adds and Searches, shape ``(n,)``.
        context_tokens: tokens of the answer context per non-excluded question with one, shape ``(n,)``.
    """

    root: Path
    info: dict[str, Any]
    label: str
    table: pl.DataFrame
    add_ms: np.ndarray
    search_ms: np.ndarray
    context_tokens: np.ndarray
    colour: str = COLOURS[0]
    category_names: dict[str, str] = field(default_factory=dict)

    @property
    def dataset(self) -> str:
        return str(self.info.get("dataset", {}).get("name", "?"))


def run_dirs(paths: list[Path]) -> list[tuple[Path, str | None]]:
    """The run directories behind ``paths``: a run directory itself, or each bundle of a suite run directory
    that ran (with the bundle name). In the order given.

    Raises:
        FileNotFoundError: a path holds neither run.json nor suite.json.
    """
    found: list[tuple[Path, str | None]] = []
    for path in map(Path, paths):
        if (path / "run.json").is_file():
            found.append((path, None))
        elif (path / "suite.json").is_file():
            suite = json.loads((path / "suite.json").read_text())
            found += [(Path(b["run_dir"]), b["name"]) for b in suite.get("bundles", []) if b.get("run_dir")]
        else:
            raise FileNotFoundError(f"{path}: no run.json or suite.json there; pass a directory made by 'aml-ray run'")
    return found


def load_run(path: Path, bundle: str | None = None) -> RunData:
    """Read what the report needs from a run directory.

    Raises:
        FileNotFoundError: no run.json.
        ValueError: run.json is damaged.
        aml_ray.run.evidence.EvidenceError: a damaged evidence file.
    """
    path = Path(path)
    try:
        info = json.loads((path / "run.json").read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no run.json there; pass a directory made by 'aml-ray run'") from None
    except ValueError as exc:
        raise ValueError(f"{path / 'run.json'} is damaged: {exc}") from None
    run_dir = RunDir(path)
    questions = read_questions(run_dir, columns=QUESTION_COLUMNS)
    dataset = info.get("dataset", {}).get("name", "?")
    # rows with a result (a stopped run's unfinished questions have none); excluded rows are only counted
    with_result = questions.filter(pl.col("excluded") | pl.col("status").is_in(STATUSES))
    table = (aggregate(with_result.with_columns(pl.lit(dataset).alias("dataset")))
             if not info.get("retrieval_only") and with_result.filter(~pl.col("excluded")).height else pl.DataFrame())
    adds = read_adds(run_dir)
    label = info.get("run_label") or info.get("participant", {}).get("label") or path.name
    try:
        from aml_ray.datasets.registry import get_dataset

        names = dict(get_dataset(dataset).category_names)
    except (KeyError, ValueError):
        names = {}
    return RunData(
        root=path, info=info, label=f"{label} · {bundle}" if bundle else label, table=table,
        add_ms=_values(adds.filter(pl.col("status") == "ok")["latency_ms"]),
        search_ms=_values(questions.filter(pl.col("search_status") == "ok")["search_latency_ms"]),
        context_tokens=_values(questions.filter(~pl.col("excluded"))["context_tokens"]),
        category_names=names)


def _values(series: pl.Series) -> np.ndarray:
    return series.cast(pl.Float64).drop_nulls().drop_nans().to_numpy()


# --- figures -------------------------------------------------------------------------------------------------


def new_figure(width_in: float, height_in: float):
    """A figure of the report's style (constrained layout, light y grid, no top or right spine): ``(fig, ax)``."""
    from matplotlib.figure import Figure  # the object API on the Agg canvas: no pyplot, no global backend

    fig = Figure(figsize=(width_in, height_in), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="y", color="#e5e5e5", linewidth=0.8)
    ax.set_axisbelow(True)
    return fig, ax


def png_of(fig) -> str:
    """The figure as a base64 PNG (for a ``data:image/png;base64,`` URI)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _category_label(category: str, names: dict[str, str]) -> str:
    name = names.get(category)
    if not name or name.replace(" ", "_").replace("-", "_") == category.replace("-", "_"):
        return category
    return f"{category} {name}"


def _accuracy(run: RunData, key: tuple[str, str]) -> float | None:
    rows = run.table.filter((pl.col("dataset") == key[0]) & (pl.col("category") == key[1]))["accuracy"]
    return rows[0] if rows.len() else None


def accuracy_figure(runs: list[RunData]) -> str | None:
    """Grouped bars: accuracy per category and overall, one bar per run, the bootstrap interval as error bar.

    Returns:
        A base64 PNG, or None when no run has a score table (retrieval-only runs only).
    """
    scored = [r for r in runs if r.table.height]
    if not scored:
        return None
    several = len({r.dataset for r in scored}) > 1
    keys: list[tuple[str, str]] = []
    for r in scored:
        for row in r.table.iter_rows(named=True):
            key = (row["dataset"], row["category"])
            if key not in keys:
                keys.append(key)
    keys.sort(key=lambda k: (k[0], k[1] == OVERALL))  # each dataset's categories in table order, overall last
    keys = [k for k in keys if any(_accuracy(r, k) is not None for r in scored)]  # not all-excluded categories
    names = {k: v for r in scored for k, v in r.category_names.items()}
    labels = [(f"{d} · " if several else "") + _category_label(c, names) for d, c in keys]
    fig, ax = new_figure(9.0, 3.0)
    width = 0.8 / len(scored)
    x = np.arange(len(keys))
    for i, r in enumerate(scored):
        rows = {(row["dataset"], row["category"]): row for row in r.table.iter_rows(named=True)}
        acc = np.array([rows[k]["accuracy"] if k in rows and rows[k]["accuracy"] is not None else np.nan for k in keys])
        low = np.array([rows[k]["accuracy_ci_low"] if k in rows and rows[k]["accuracy_ci_low"] is not None else np.nan
                        for k in keys])
        high = np.array([rows[k]["accuracy_ci_high"] if k in rows and rows[k]["accuracy_ci_high"] is not None
                         else np.nan for k in keys])
        error = np.vstack([np.clip(acc - low, 0, None), np.clip(high - acc, 0, None)])
        ax.bar(x - 0.4 + width * (i + 0.5), acc, width * 0.92, yerr=np.nan_to_num(error), capsize=3,
               color=r.colour, alpha=0.85, label=r.label, error_kw={"elinewidth": 1.1, "ecolor": "#333333"})
    ax.set_xticks(x, labels, rotation=20 if len(keys) > 6 else 0, ha="right" if len(keys) > 6 else "center")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.legend(frameon=False, fontsize="small", loc="upper left", ncols=min(len(scored), 3))
    return png_of(fig)


def histogram_figure(runs: list[RunData], attribute: str, xlabel: str, unit: str) -> str:
    """Overlaid histograms of one per-run array (``add_ms``, ``search_ms`` or ``context_tokens``), with each
    run's median as a dashed line; log-spaced bins when the values span more than :data:`LOG_SPAN`.

    Returns:
        A base64 PNG (a figure that says "no data" when no run has a value).
    """
    fig, ax = new_figure(3.3, 2.6)
    arrays = [getattr(r, attribute) for r in runs]
    values = np.concatenate([a for a in arrays if a.size]) if any(a.size for a in arrays) else np.array([])
    if values.size == 0:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="#777777")
        ax.set_xlabel(xlabel)
        return png_of(fig)
    positive = values[values > 0]
    log = positive.size == values.size and values.max() / values.min() > LOG_SPAN
    if log:
        bins = np.geomspace(values.min(), values.max(), BINS + 1)
        ax.set_xscale("log")
    else:
        bins = np.linspace(values.min(), values.max() if values.max() > values.min() else values.min() + 1, BINS + 1)
    for r, array in zip(runs, arrays):
        if array.size == 0:
            ax.plot([], [], color=r.colour, label="no data")
            continue
        median = float(np.median(array))
        ax.hist(array, bins=bins, histtype="stepfilled", alpha=0.3, color=r.colour)
        ax.hist(array, bins=bins, histtype="step", linewidth=1.4, color=r.colour,
                label=f"median {median:,.0f} {unit}" if median >= 10 else f"median {median:.2g} {unit}")
        ax.axvline(median, color=r.colour, linestyle="--", linewidth=1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("count")
    ax.legend(frameon=False, fontsize="small", loc="best")  # colours: the runs table's swatches
    return png_of(fig)


# --- the page ------------------------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _summary(r: RunData) -> dict[str, Any]:
    overall = r.table.filter(pl.col("category") == OVERALL).to_dicts() if r.table.height else []
    acc = overall[0] if overall else {}
    add, search = latency_summary(r.add_ms), latency_summary(r.search_ms)
    return {
        "label": r.label, "colour": r.colour, "run_id": r.info.get("run_id"), "dataset": r.dataset,
        "participant": r.info.get("participant", {}).get("label"), "status": r.info.get("status"),
        "top_k": r.info.get("top_k"), "run_dir": str(r.root),
        "questions": r.info.get("dataset", {}).get("scorable_questions"),
        "accuracy": "-" if acc.get("accuracy") is None else (
            f"{acc['accuracy']:.3f} [{_fmt(acc.get('accuracy_ci_low'))}, {_fmt(acc.get('accuracy_ci_high'))}]"),
        "add_latency": f"{_fmt(add['p50'], 1)} / {_fmt(add['p95'], 1)}",
        "search_latency": f"{_fmt(search['p50'], 1)} / {_fmt(search['p95'], 1)}",
        "context_tokens": "-" if r.context_tokens.size == 0 else f"{r.context_tokens.mean():,.0f}",
        "offline": r.info.get("offline_models", False), "retrieval_only": r.info.get("retrieval_only", False),
    }


def _category_rows(runs: list[RunData]) -> list[dict[str, Any]]:
    """One row per (dataset, category) of any run: the category and each run's ``accuracy [low, high] (n)``."""
    keys: list[tuple[str, str]] = []
    for r in runs:
        for row in r.table.iter_rows(named=True) if r.table.height else ():
            if (row["dataset"], row["category"]) not in keys:
                keys.append((row["dataset"], row["category"]))
    keys.sort(key=lambda k: (k[0], k[1] == OVERALL))
    names = {k: v for r in runs for k, v in r.category_names.items()}
    out = []
    for dataset, category in keys:
        cells = []
        for r in runs:
            rows = r.table.filter((pl.col("dataset") == dataset) & (pl.col("category") == category)).to_dicts() \
                if r.table.height else []
            row = rows[0] if rows else None
            cells.append("" if row is None else f"- ({row['n_excluded']} excluded)" if row["accuracy"] is None else
                         f"{row['accuracy']:.3f} [{_fmt(row['accuracy_ci_low'])}, {_fmt(row['accuracy_ci_high'])}]"
                         f" (n {row['n_total']})")
        out.append({"dataset": dataset, "category": _category_label(category, names), "cells": cells,
                    "overall": category == OVERALL})
    return out


def render_report(runs: list[RunData], *, title: str = "aml-ray report") -> str:
    """The report's HTML (module rules), from loaded runs.

    Raises:
        ValueError: no run.
    """
    import jinja2

    if not runs:
        raise ValueError("no run to report: give at least one run directory")
    for i, r in enumerate(runs):
        r.colour = COLOURS[i % len(COLOURS)]
    figures = []
    accuracy = accuracy_figure(runs)
    if accuracy is not None:
        figures.append({"id": "accuracy", "png": accuracy, "wide": True,
                        "caption": f"Accuracy per category and overall, with the {CONFIDENCE:.0%} percentile "
                                   f"bootstrap interval (question-level, {RESAMPLES:,} resamples, seed {SEED}); "
                                   "errors count as wrong."})
    figures += [
        {"id": "search-latency", "png": histogram_figure(runs, "search_ms", "Search latency (ms)", "ms"),
         "caption": "Search latency per question (ms: search_latency_ms of each successful Search); "
                    "dashed: the median."},
        {"id": "add-latency", "png": histogram_figure(runs, "add_ms", "Add latency (ms)", "ms"),
         "caption": "Add latency per chunk (ms: latency_ms of each successful Add); dashed: the median."},
        {"id": "context-tokens", "png": histogram_figure(runs, "context_tokens", "context tokens", "tokens"),
         "caption": "Tokens of the answer context per question (the memories Search returned, cut to the "
                    "context budget); dashed: the median."},
    ]
    from aml_ray.explain.figures import attribution_figure, baseline_rows, budget_figures

    attribution = attribution_figure(runs)
    figures += [*([attribution] if attribution else []), *budget_figures(runs)]
    env = jinja2.Environment(loader=jinja2.PackageLoader("aml_ray", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    return env.get_template("report.html.j2").render(
        title=title, runs=[_summary(r) for r in runs], figures=figures, categories=_category_rows(runs),
        baselines=baseline_rows(runs),
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), version=aml_ray.__version__,
        resamples=RESAMPLES, seed=SEED, offline=any(r.info.get("offline_models") for r in runs))


def write_report(paths: list[Path], out: Path, *, title: str = "aml-ray report") -> Path:
    """Read the runs behind ``paths`` (:func:`run_dirs`) and write the report to ``out``.

    Returns:
        ``out``.

    Raises:
        FileNotFoundError: a path is no run or suite directory.
        ValueError: no path, or a damaged run.json.
        aml_ray.run.evidence.EvidenceError: a damaged evidence file.
    """
    if not paths:
        raise ValueError("no run to report: give at least one run directory")
    runs = [load_run(path, bundle) for path, bundle in run_dirs(paths)]
    html = render_report(runs, title=title)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    return out
