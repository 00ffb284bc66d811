"""The console tables of ``aml-ray run`` and ``aml-ray rejudge`` (rich): scores, evidence recall, retrieval."""

from __future__ import annotations

from rich.table import Table


def accuracy_cell(r: dict) -> str:
    """``0.512 [0.473, 0.551]``: a table row's accuracy and its 95 % bootstrap interval (``-`` when none)."""
    if r.get("accuracy") is None:
        return "-"
    if r.get("accuracy_ci_low") is None:  # a table from before the interval columns
        return f"{r['accuracy']:.3f} ± {r['accuracy_se']:.3f}"
    return f"{r['accuracy']:.3f} [{r['accuracy_ci_low']:.3f}, {r['accuracy_ci_high']:.3f}]"


def render_table(result_table, *, offline: bool, title: str, category_names: dict[str, str] | None = None) -> Table:
    """A rich table of the aggregated scores (one row per category, then overall); accuracy with its 95 %
    bootstrap interval (:mod:`aml_ray.scoring.bootstrap`; ``accuracy_se`` stays in results.json)."""
    from aml_ray.scoring.bootstrap import RESAMPLES, SEED

    t = Table(title=title, caption=f"accuracy [95 % percentile bootstrap interval: {RESAMPLES:,} question "
              f"resamples, seed {SEED}]; coverage = scored / total; "
              + ("OFFLINE answerer and judge: not official scores" if offline else "judge: LLM"))
    for col in ("category", "n", "scored", "errors", "excluded", "coverage", "accuracy", "F1", "BLEU-1"):
        t.add_column(col, justify="left" if col == "category" else "right")

    def pct(x):
        return "-" if x is None else f"{x:.3f}"

    for r in result_table.to_dicts():
        acc = accuracy_cell(r)
        name = r["category"] + (f" {category_names[r['category']]}" if r["category"] in (category_names or {}) else "")
        t.add_row(name, str(r["n_total"]), str(r["n_scored"]), str(r["n_errors"]),
                  str(r["n_excluded"]), pct(r["coverage"]), acc, pct(r["f1"]), pct(r["bleu1"]),
                  style="bold" if r["category"] == "overall" else None)
    return t


def render_recall_table(rows: list[dict], *, category_names: dict[str, str] | None = None) -> Table:
    """A rich table of evidence recall (:func:`aml_ray.scoring.evidence_recall.recall_table`): fuzzy rule,
    R@10 and R@100 with their 95 % bootstrap intervals, the exact rule's recall@10 beside them (fits 120
    columns, the width of a non-terminal console)."""
    t = Table(title="evidence recall", caption="recall@K = evidence turns covered by the first K memories (fuzzy: "
              ">= half the turn's content words; exact: the turn's text); n = questions with evidence; "
              "\\[low, high] = 95 % bootstrap interval; recall@25 is in run.json")
    for col in ("category", "n", "R@1", "R@5", "R@10", "R@100", "exact R@10", "hit", "first rank"):
        t.add_column(col, justify="left" if col == "category" else "right")

    def f(x, digits=3):
        return "-" if x is None else f"{x:.{digits}f}"

    for r in rows:
        name = r["category"] + (f" {category_names[r['category']]}" if r["category"] in (category_names or {}) else "")
        def ci(k):
            low, high = r.get(f"recall@{k}_ci_low"), r.get(f"recall@{k}_ci_high")
            return f(r[f"recall@{k}"]) + ("" if low is None else f" [{low:.2f}, {high:.2f}]")

        t.add_row(name, str(r["n"]), *(ci(k) if k in (10, 100) else f(r[f"recall@{k}"]) for k in (1, 5, 10, 100)),
                  f(r["recall_exact@10"]),
                  f(r["hit_share"]), f(r["median_first_rank"], 1), style="bold" if r["category"] == "overall" else None)
    return t


def render_retrieval_table(result_table, *, title: str, category_names: dict[str, str] | None = None) -> Table:
    """A rich table of a retrieval-only run (:func:`aml_ray.scoring.retrieval.retrieval_table`)."""
    t = Table(title=f"{title}, retrieval only", caption="no answer or judge model was called: coverage = "
              "questions whose Search succeeded / total; memories = mean returned per such question")
    for col in ("category", "n", "retrieved", "errors", "excluded", "coverage", "memories", "empty"):
        t.add_column(col, justify="left" if col == "category" else "right")
    for r in result_table.to_dicts():
        name = r["category"] + (f" {category_names[r['category']]}" if r["category"] in (category_names or {}) else "")
        t.add_row(name, str(r["n_total"]), str(r["n_retrieved"]), str(r["n_errors"]), str(r["n_excluded"]),
                  "-" if r["coverage"] is None else f"{r['coverage']:.3f}",
                  "-" if r["memories_mean"] is None else f"{r['memories_mean']:.1f}", str(r["n_empty"]),
                  style="bold" if r["category"] == "overall" else None)
    return t


def ms(value: float | None) -> str:
    """A latency in milliseconds for the console (``-`` when no request of the kind succeeded)."""
    return "-" if value is None else f"{value:.1f} ms"
