"""Compare runs on the same questions: ``aml-ray compare RUN_A RUN_B [RUN_C ...]``.

Each run after the first is compared with the first (the base), question by question. Rules:

- **Comparable runs only.** The entries of :data:`COMPARABLE_ENTRIES` of ``run.json`` must be equal
  (dataset name and sha256, both prompts' sha256, the answer and judge models and temperature, Top K,
  judge runs, the answer context budget, the stream checkpoints). Any difference refuses the comparison
  with :class:`NotComparable`, which names every differing entry with both values: a score difference must
  come from the memory systems, not from what the platform measured (DESIGN.md: "everything else is
  locked"). A retrieval-only run has no verdict to compare and is refused too.
- **Runs of the same size.** The runs' sizes (run.json ``dataset.samples`` and
  ``dataset.scorable_questions``, :data:`SIZE_ENTRIES`) must be equal too: 10 samples against 2 (another
  ``--limit-samples``) is refused with both sizes named, unless ``allow_different_size`` (``aml-ray compare
  --allow-different-size``); then the result says ``different_size`` and the table's title marks it.
- **Re-judged runs.** ``RUN_DIR/rejudge/<label>`` (``aml-ray rejudge``) compares as its source run re-scored
  (:func:`load_rejudged`): ``aml-ray compare RUN_DIR RUN_DIR/rejudge/<label>`` shows what another judge or an
  errata file (:mod:`aml_ray.errata`) changed; a question the errata exclude is left out as ``only_in_base``.
- **Matching.** Questions are matched on ``(sample_id, question_id)``, excluded questions left out. Only
  matched questions are compared; those in one run only are counted (``only_in_base`` /
  ``only_in_other``), e.g. when one run ended partial or runs of different sizes were allowed.
- **Credit** per question as in the score table (:func:`aml_ray.scoring.aggregate.with_credit`): 1 for
  CORRECT (or the scorer's partial credit), 0 for WRONG and for every error.
- **Per category and overall**: each run's accuracy over the matched questions, the difference
  ``other - base``, its paired 95 % bootstrap interval (:func:`aml_ray.scoring.bootstrap.paired_difference_ci`,
  the same question indices drawn for both runs), the questions that flipped (``gained``: credit higher
  in the other run; ``lost``: lower) and a paired test's two-sided p-value: **McNemar's exact test**
  (McNemar 1947; exact conditional form as in Fagerland, Lydersen & Laake, BMC Med. Res. Methodol. 13:91,
  2013) when every credit is 0 or 1, which is the exact binomial (sign) test of the flips, ``gained`` vs
  ``lost`` with p = 1/2; with partial credit the same exact sign test on the questions whose credit
  differs (``test`` says which).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from aml_ray.run.evidence import RunDir, read_questions
from aml_ray.scoring.aggregate import OVERALL, with_credit
from aml_ray.scoring.bootstrap import RESAMPLES, SEED, describe, paired_difference_ci

#: run.json entries that must be equal for two runs to be compared (paths into the JSON object).
COMPARABLE_ENTRIES: tuple[tuple[str, ...], ...] = (
    ("dataset", "name"), ("dataset", "sha256"),
    ("prompts", "answer", "sha256"), ("prompts", "judge", "sha256"),
    ("models", "answer", "model"), ("models", "answer", "temperature"),
    ("models", "judge", "model"), ("models", "judge", "temperature"),
    ("top_k",), ("judge_runs",), ("context_budget_tokens",), ("stream_checkpoints",), ("retrieval_only",),
)

#: run.json entries that give a run's size: samples run and their scorable questions (after --limit-samples).
SIZE_ENTRIES: tuple[tuple[str, ...], ...] = (("dataset", "samples"), ("dataset", "scorable_questions"))
#: What the command line offers to compare runs of different sizes anyway.
ALLOW_DIFFERENT_SIZE = "--allow-different-size"

#: Question evidence columns a comparison reads (never the memories, answers or judge texts).
QUESTION_COLUMNS = ("sample_id", "question_id", "category", "excluded", "status", "verdict", "score")

MCNEMAR = "mcnemar_exact"
SIGN_TEST = "sign_test_exact"


class NotComparable(ValueError):
    """Two runs differ in what the platform measured; ``differences`` names each entry with both values."""

    def __init__(self, base: str, other: str, differences: list[str]):
        self.differences = differences
        super().__init__(f"runs {base} and {other} are not comparable: " + "; ".join(differences))


@dataclass
class LoadedRun:
    """A run directory read for comparison.

    Attributes:
        root: the run directory.
        info: its run.json.
        questions: one row per non-excluded question: ``sample_id``, ``question_id``, ``category`` (str)
            and ``credit`` (float in [0, 1]).
    """

    root: Path
    info: dict[str, Any]
    questions: pl.DataFrame

    @property
    def name(self) -> str:
        """``label (run_id)``: the run label, else the participant's label, and the run id."""
        label = self.info.get("run_label") or self.info.get("participant", {}).get("label") or "run"
        return f"{label} ({self.info.get('run_id', self.root.name)})"

    def describe(self) -> dict[str, Any]:
        """The run as the comparison names it (a re-judged run with errata says which)."""
        return {"run_dir": str(self.root), "run_id": self.info.get("run_id"), "label": self.name,
                "participant": self.info.get("participant", {}).get("label"), "status": self.info.get("status"),
                **({"errata": self.info["errata"]} if self.info.get("errata") else {})}


def load_run(path: Path) -> LoadedRun:
    """Read a run directory's run.json and its questions' credits.

    Raises:
        FileNotFoundError: no run.json in ``path``.
        ValueError: run.json is not JSON, or the run is retrieval-only (no verdict to compare).
        aml_ray.run.evidence.EvidenceError: a damaged evidence file.
    """
    path = Path(path)
    if (path / "rejudge.json").is_file() and not (path / "run.json").is_file():
        return load_rejudged(path)
    run_json = path / "run.json"
    if not run_json.is_file():
        raise FileNotFoundError(f"{path}: no run.json there; pass a run directory made by 'aml-ray run'")
    try:
        info = json.loads(run_json.read_text())
    except ValueError as exc:
        raise ValueError(f"{run_json} is damaged: {exc}") from None
    if info.get("retrieval_only"):
        raise ValueError(f"{path}: a retrieval-only run has no answers or verdicts to compare")
    return LoadedRun(root=path, info=info, questions=_credits(read_questions(RunDir(path), columns=QUESTION_COLUMNS)))


def _credits(rows: pl.DataFrame) -> pl.DataFrame:
    """:data:`QUESTION_COLUMNS` rows -> the non-excluded ones' ``sample_id, question_id, category, credit``."""
    return (with_credit(rows).filter(~pl.col("excluded"))
            .select("sample_id", "question_id", pl.col("category").cast(pl.String), "credit"))


def _entry(info: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = info
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def differences(base: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """The :data:`COMPARABLE_ENTRIES` that differ between two run.json objects, as ``"entry: a != b"``.

    Examples:
        >>> differences({"top_k": 100, "judge_runs": 1}, {"top_k": 10, "judge_runs": 1})
        ['top_k: 100 != 10']
    """
    return [f"{'.'.join(p)}: {_entry(base, p)!r} != {_entry(other, p)!r}" for p in COMPARABLE_ENTRIES
            if _entry(base, p) != _entry(other, p)]


def run_size(info: dict[str, Any]) -> dict[str, int | None]:
    """A run's size from its run.json: ``{"samples": n, "scorable_questions": n}`` (None where not recorded).

    Examples:
        >>> run_size({"dataset": {"samples": 2, "scorable_questions": 304, "questions": 380}})
        {'samples': 2, 'scorable_questions': 304}
    """
    return {path[-1]: _entry(info, path) for path in SIZE_ENTRIES}


def describe_size(size: dict[str, int | None]) -> str:
    """``"10 sample(s), 1540 scorable question(s)"`` (``?`` for a count run.json does not record)."""
    def n(key: str) -> str:
        return "?" if size[key] is None else str(size[key])

    return f"{n('samples')} sample(s), {n('scorable_questions')} scorable question(s)"


def size_difference(base: dict[str, Any], other: dict[str, Any]) -> str | None:
    """How two run.json objects differ in size (:data:`SIZE_ENTRIES`), or None when they do not.

    A count that one run does not record (a run.json of an older aml-ray) is not compared.

    Examples:
        >>> size_difference({"dataset": {"samples": 10, "scorable_questions": 1540}},
        ...                 {"dataset": {"samples": 2, "scorable_questions": 304}})
        'size: 10 sample(s), 1540 scorable question(s) != 2 sample(s), 304 scorable question(s)'
        >>> size_difference({"dataset": {"samples": 2}}, {"dataset": {"samples": 2}}) is None
        True
    """
    a, b = run_size(base), run_size(other)
    if all(a[k] is None or b[k] is None or a[k] == b[k] for k in a):
        return None
    return f"size: {describe_size(a)} != {describe_size(b)}"


def refusals(base: dict[str, Any], other: dict[str, Any], *, allow_different_size: bool = False) -> list[str]:
    """Why two runs may not be compared: :func:`differences`, then their :func:`size_difference` (with the
    option that allows it) unless ``allow_different_size``. Empty when they may."""
    found = differences(base, other)
    size = None if allow_different_size else size_difference(base, other)
    if size:
        found.append(f"{size}; pass {ALLOW_DIFFERENT_SIZE} to compare the questions both runs hold")
    return found


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pair counts.

    Under the null hypothesis each discordant question is equally likely to go either way, so
    ``min(gained, lost)`` is Binomial(``gained + lost``, 1/2); p = ``min(1, 2 P(X <= min(gained, lost)))``,
    computed exactly with ``math.comb`` (McNemar 1947; Fagerland et al. 2013, the exact conditional test).

    Examples:
        >>> mcnemar_exact(1, 6)   # 2 (1 + 7) / 2**7
        0.125
        >>> mcnemar_exact(0, 0), mcnemar_exact(3, 3)
        (1.0, 1.0)

    Args:
        gained: questions right (or with more credit) in the other run only.
        lost: questions right in the base run only.

    Raises:
        ValueError: a negative count.
    """
    if gained < 0 or lost < 0:
        raise ValueError(f"discordant counts must be >= 0, got {gained}, {lost}")
    n = gained + lost
    tail = Fraction(sum(math.comb(n, i) for i in range(min(gained, lost) + 1)), 2 ** n)
    return float(min(Fraction(1), 2 * tail))


def _row(category: str, base: np.ndarray, other: np.ndarray, *, resamples: int, seed: int) -> dict[str, Any]:
    n = int(base.size)
    gained, lost = int((other > base).sum()), int((other < base).sum())
    binary = bool(np.isin(base, (0.0, 1.0)).all() and np.isin(other, (0.0, 1.0)).all())
    low, high = paired_difference_ci(base, other, resamples=resamples, seed=seed)
    acc_base = float(base.mean()) if n else None
    acc_other = float(other.mean()) if n else None
    return {"category": category, "n": n, "accuracy_base": acc_base, "accuracy_other": acc_other,
            "difference": None if n == 0 else float((other - base).mean()),
            "difference_ci_low": low, "difference_ci_high": high, "gained": gained, "lost": lost,
            "p_value": mcnemar_exact(gained, lost), "test": MCNEMAR if binary else SIGN_TEST}


def _category_order(categories: list[str]) -> list[str]:
    numbered = sorted((c for c in categories if c.lstrip("-").isdigit()), key=int)
    return numbered + sorted(c for c in categories if not c.lstrip("-").isdigit())


def load_rejudged(path: Path) -> LoadedRun:
    """A re-judged run (``RUN_DIR/rejudge/<label>``, :mod:`aml_ray.run.rejudge`) read for comparison: its source
    run's run.json with the re-judge's judge model and the errata it applied (``errata``; the label says its
    version), and its own question rows.

    Raises:
        FileNotFoundError: the source run's run.json is gone.
        ValueError: rejudge.json is damaged.
    """
    source = path.parent.parent
    if not (source / "run.json").is_file():
        raise FileNotFoundError(f"{path}: a re-judged run, but its source run's run.json ({source}) is gone")
    try:
        done = json.loads((path / "rejudge.json").read_text())
    except ValueError as exc:
        raise ValueError(f"{path / 'rejudge.json'} is damaged: {exc}") from None
    info = json.loads((source / "run.json").read_text())
    errata = done.get("errata")
    label = (info.get("run_label") or info.get("participant", {}).get("label") or "run") + f", re-judged {path.name}"
    if errata:
        label += f" with errata {errata['bundle']} {errata['version']}"
    info = {**info, "run_label": label, "models": {**info.get("models", {}), "judge": done["judge"]},
            **({"errata": errata} if errata else {})}
    return LoadedRun(root=path, info=info,
                     questions=_credits(pl.read_parquet(path / "questions.parquet", columns=list(QUESTION_COLUMNS))))


def compare_pair(base: LoadedRun, other: LoadedRun, *, resamples: int = RESAMPLES, seed: int = SEED,
                 allow_different_size: bool = False) -> dict[str, Any]:
    """Compare ``other`` with ``base`` on their matched questions (module rules).

    Args:
        base / other: loaded runs (:func:`load_run`).
        resamples / seed: of the paired bootstrap (defaults :data:`~aml_ray.scoring.bootstrap.RESAMPLES`,
            :data:`~aml_ray.scoring.bootstrap.SEED`).
        allow_different_size: compare runs whose sizes differ (:data:`SIZE_ENTRIES`) on the questions both hold.

    Returns:
        ``{"base", "other", "sizes", "different_size", "matched", "only_in_base", "only_in_other", "rows",
        "flipped"}``: ``sizes`` ``{"base": {...}, "other": {...}}`` (:func:`run_size`), ``different_size``
        true when they differ (only possible when allowed); ``rows`` one dict per category of the base run
        then ``"overall"`` (keys ``category``, ``n``, ``accuracy_base``, ``accuracy_other``, ``difference``
        (other - base), ``difference_ci_low`` / ``_high``, ``gained``, ``lost``, ``p_value``, ``test``);
        ``flipped`` ``{"gained": [...], "lost": [...]}`` with ``{"question_id", "sample_id", "category",
        "credit_base", "credit_other"}`` per flipped question.

    Raises:
        NotComparable: a :data:`COMPARABLE_ENTRIES` entry differs (all of them named), the sizes differ and
            ``allow_different_size`` is off (both sizes named), or no question matches.
    """
    diffs = refusals(base.info, other.info, allow_different_size=allow_different_size)
    if diffs:
        raise NotComparable(base.name, other.name, diffs)
    keys = ["sample_id", "question_id"]
    joined = base.questions.join(other.questions.select(*keys, pl.col("credit").alias("credit_other")),
                                 on=keys, how="inner").rename({"credit": "credit_base"}).sort(keys)
    if joined.height == 0:
        raise NotComparable(base.name, other.name, ["no question of one run is in the other (sample_id, question_id)"])
    rows = []
    for category in _category_order(joined["category"].unique().drop_nulls().to_list()):
        part = joined.filter(pl.col("category") == category)
        rows.append(_row(category, part["credit_base"].to_numpy(), part["credit_other"].to_numpy(),
                         resamples=resamples, seed=seed))
    rows.append(_row(OVERALL, joined["credit_base"].to_numpy(), joined["credit_other"].to_numpy(),
                     resamples=resamples, seed=seed))
    columns = ["question_id", "sample_id", "category", "credit_base", "credit_other"]
    return {
        "base": base.describe(), "other": other.describe(),
        "sizes": {"base": run_size(base.info), "other": run_size(other.info)},
        "different_size": size_difference(base.info, other.info) is not None, "matched": joined.height,
        "only_in_base": base.questions.height - joined.height, "only_in_other": other.questions.height - joined.height,
        "rows": rows,
        "flipped": {"gained": joined.filter(pl.col("credit_other") > pl.col("credit_base")).select(columns).to_dicts(),
                    "lost": joined.filter(pl.col("credit_other") < pl.col("credit_base")).select(columns).to_dicts()},
    }


def compare_runs(paths: Sequence[Path], *, resamples: int = RESAMPLES, seed: int = SEED,
                 allow_different_size: bool = False) -> dict[str, Any]:
    """Compare every run after the first with the first (what ``aml-ray compare`` prints).

    Args:
        paths: two or more run directories; ``paths[0]`` is the base.
        resamples / seed: of the paired bootstrap.
        allow_different_size: compare runs whose sizes differ from the base's (``--allow-different-size``).

    Returns:
        ``{"dataset", "bootstrap", "comparisons"}``: the dataset name, the bootstrap's method
        (:func:`aml_ray.scoring.bootstrap.describe` with these resamples and seed) and one
        :func:`compare_pair` result per later run, in order.

    Raises:
        ValueError: fewer than two paths.
        NotComparable: some run differs from the base, or has another size unless ``allow_different_size``;
            the message names every differing entry (both sizes) of every such run (checked before any
            question is compared).
        FileNotFoundError / aml_ray.run.evidence.EvidenceError: as :func:`load_run`.
    """
    if len(paths) < 2:
        raise ValueError(f"give at least two run directories to compare, got {len(paths)}")
    runs = [load_run(p) for p in paths]
    base = runs[0]
    refused = [(r, d) for r in runs[1:]
               if (d := refusals(base.info, r.info, allow_different_size=allow_different_size))]
    if len(refused) == 1:
        raise NotComparable(base.name, refused[0][0].name, refused[0][1])
    if refused:  # every refused run, each difference prefixed with the run it belongs to
        raise NotComparable(base.name, ", ".join(r.name for r, _ in refused),
                            [f"{r.name}: {d}" for r, ds in refused for d in ds])
    return {"dataset": _entry(base.info, ("dataset", "name")),
            "bootstrap": {**describe(), "resamples": resamples, "seed": seed, "paired": True},
            "comparisons": [compare_pair(base, other, resamples=resamples, seed=seed,
                                         allow_different_size=allow_different_size) for other in runs[1:]]}


def p_text(p: float) -> str:
    """A p-value for a table: ``1`` when exactly 1, three decimals, or two significant digits below 0.001.

    Examples:
        >>> p_text(1.0), p_text(0.125), p_text(3.1e-07)
        ('1', '0.125', '3.1e-07')
    """
    if p == 1:
        return "1"
    return f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def different_size_note(comparison: dict[str, Any]) -> str:
    """``DIFFERENT SIZES: A 1 sample(s), ...; B 2 sample(s), ...: only the N questions both hold are
    compared``: how a :func:`compare_pair` result of runs of different sizes is marked (table title, warning)."""
    sizes = comparison["sizes"]
    return (f"DIFFERENT SIZES: A {describe_size(sizes['base'])}; B {describe_size(sizes['other'])}: only the "
            f"{comparison['matched']} questions both hold are compared")


def render_comparison(comparison: dict[str, Any], *, category_names: dict[str, str] | None = None):
    """A rich table of one :func:`compare_pair` result: per category both accuracies, the difference
    with its interval, the flips and the p-value; runs of different sizes are marked in the title
    (:func:`different_size_note`)."""
    from rich.table import Table

    def num(x: float | None, sign: bool = False) -> str:
        return "-" if x is None else (f"{x:+.3f}" if sign else f"{x:.3f}")

    base, other = comparison["base"]["label"], comparison["other"]["label"]
    caption = (f"{comparison['matched']} matched questions (only in A {comparison['only_in_base']}, only in B "
               f"{comparison['only_in_other']}); B - A with its paired 95 % percentile bootstrap interval "
               f"({RESAMPLES:,} question resamples, seed {SEED}); gained = right in B only, lost = right in A only; "
               "p: McNemar's exact test (exact sign test with partial credit)")
    title = f"A = {base}\nB = {other}"
    if comparison.get("different_size"):
        title += "\n" + different_size_note(comparison)
    t = Table(title=title, caption=caption)
    for col in ("category", "n", "A", "B", "B - A [95 % CI]", "gained", "lost", "p"):
        t.add_column(col, justify="left" if col == "category" else "right")
    for r in comparison["rows"]:
        name = r["category"] + (f" {category_names[r['category']]}" if r["category"] in (category_names or {}) else "")
        diff = "-" if r["difference"] is None else (
            f"{num(r['difference'], True)} [{num(r['difference_ci_low'], True)}, {num(r['difference_ci_high'], True)}]")
        t.add_row(name, str(r["n"]), num(r["accuracy_base"]), num(r["accuracy_other"]), diff, str(r["gained"]),
                  str(r["lost"]), p_text(r["p_value"]) + ("" if r["test"] == MCNEMAR else " (sign)"),
                  style="bold" if r["category"] == OVERALL else None)
    return t
