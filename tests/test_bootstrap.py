"""Bootstrap intervals (aml_ray.scoring.bootstrap): known vectors at the fixed seed, pairing, stratification."""

import doctest

import numpy as np
import pytest

from aml_ray.scoring import bootstrap
from aml_ray.scoring.bootstrap import (RESAMPLES, SEED, bootstrap_means, mean_ci, mean_of_means_ci,
                                       paired_difference_ci)


def test_docstring_examples():
    result = doctest.testmod(bootstrap, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted >= 6


def test_half_right_of_100_questions():
    low, high = mean_ci([1.0] * 50 + [0.0] * 50)
    assert low <= 0.5 <= high
    # seed 0, 2,000 resamples; the normal approximation's width is 2 * 1.96 * sqrt(0.25 / 100) = 0.196
    assert (round(low, 2), round(high, 2)) == (0.40, 0.60)
    assert round(high - low, 2) == 0.20


def test_interval_is_the_percentiles_of_a_resample_matrix():
    """The documented rule, spelled out: one (B, n) index matrix from default_rng(SEED) over the sorted values."""
    values = np.array([0, 1, 1, 0, 1, 1, 1, 0, 1, 1], dtype=float)
    index = np.random.default_rng(SEED).integers(0, values.size, size=(RESAMPLES, values.size))
    means = np.sort(values)[index].mean(axis=1)
    assert mean_ci(values) == tuple(np.quantile(means, [0.025, 0.975]))


def test_blocks_draw_the_same_resamples_as_one_matrix(monkeypatch):
    values = np.arange(50, dtype=float) / 50
    whole = bootstrap_means(values, resamples=300)
    monkeypatch.setattr(bootstrap, "MAX_CELLS", 50 * 7)  # 7 resamples per block, 43 blocks
    assert np.array_equal(bootstrap_means(values, resamples=300), whole)


def test_an_interval_of_a_whole_dataset_holds_a_few_megabytes_at_once():
    """LoCoMo's 1,986 questions x 2,000 resamples are 4 million index cells: drawn at once, the index matrix
    and the credits it gathers took 64 MB together, the largest step in a suite driver's and a bundle
    runner's memory as the corpus grew (docs/benchmarks.md). Drawn in blocks, the peak stays at a few MB."""
    import tracemalloc

    values = np.random.default_rng(7).integers(0, 2, size=1986).astype(float)
    tracemalloc.start()
    try:
        mean_of_means_ci([values, values[:500]])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 12 * 2**20, f"{peak / 2**20:.1f} MiB"


def test_order_does_not_matter_and_seed_does():
    values = [1.0] * 30 + [0.0] * 70
    assert mean_ci(values) == mean_ci(list(reversed(values))) == mean_ci(values, seed=SEED)
    # another seed draws other resamples (the interval's ends, on a 0.01 grid here, may still agree)
    assert not np.array_equal(bootstrap_means(values, rng=np.random.default_rng(1)), bootstrap_means(values))


def test_width_shrinks_with_n():
    small = mean_ci([1.0] * 10 + [0.0] * 10)
    large = mean_ci([1.0] * 1000 + [0.0] * 1000)
    assert small[1] - small[0] > 3 * (large[1] - large[0])
    assert round(large[1] - large[0], 2) == 0.04  # 2 * 1.96 * sqrt(0.25 / 2000) = 0.0438


def test_paired_difference():
    a = [1.0] * 40 + [0.0] * 60
    assert paired_difference_ci(a, a) == (0.0, 0.0)
    # B gains 20 questions that A missed and loses none: every difference is 0 or +1, mean 0.2
    b = [1.0] * 60 + [0.0] * 40
    low, high = paired_difference_ci(a, b)
    assert 0 < low < 0.2 < high
    # pairing matters: the unpaired difference of two independent intervals would be wider
    a_low, a_high = mean_ci(a)
    b_low, b_high = mean_ci(b)
    assert high - low < (b_high - b_low) + (a_high - a_low)
    with pytest.raises(ValueError, match="differ in length"):
        paired_difference_ci([1.0], [1.0, 0.0])


def test_mean_of_means_resamples_each_dataset():
    # datasets of 10 and 1,000 questions: the unweighted mean of their means, 0.5, not the pooled 0.9...
    small, large = [1.0] * 5 + [0.0] * 5, [1.0] * 1000
    low, high = mean_of_means_ci([small, large])
    assert low < 0.75 < high and high <= 1.0
    # ... and only the small dataset varies: the interval is half the small dataset's own, to 2 decimals
    s_low, s_high = mean_ci(small)
    assert round(high - low, 2) == round((s_high - s_low) / 2, 2)
    assert mean_of_means_ci([]) == (None, None)
    with pytest.raises(ValueError, match="empty"):
        mean_of_means_ci([[1.0], []])


def test_bad_inputs():
    assert mean_ci([]) == (None, None)
    with pytest.raises(ValueError, match="NaN"):
        mean_ci([1.0, float("nan")])
    with pytest.raises(ValueError, match="resamples"):
        mean_ci([1.0], resamples=0)
    with pytest.raises(ValueError, match="confidence"):
        mean_ci([1.0], confidence=1.0)


# --- the suite's Overall ----------------------------------------------------------------------------------


def _suite_result():
    from types import SimpleNamespace

    from aml_ray.run.suite_run import BundleOutcome, overall_of

    outcomes = [
        BundleOutcome("small", "small", "Small", "ran", score=0.5, score_se=0.158, coverage=1.0, n_total=10,
                      n_scored=10, credits=[1.0] * 5 + [0.0] * 5),
        BundleOutcome("large", "large", "Large", "ran", score=1.0, score_se=0.0, coverage=1.0, n_total=1000,
                      n_scored=1000, credits=[1.0] * 1000),
        BundleOutcome("absent", "absent", "Absent", "skipped", reason="absent: x not found"),
    ]
    suite = SimpleNamespace(name="textual", version="v1",
                            aggregation=SimpleNamespace(rule="Overall = unweighted mean of the dataset scores."))
    return SimpleNamespace(suite=suite, outcomes=outcomes, overall=overall_of(outcomes))


def test_suite_overall_interval_resamples_within_each_dataset():
    overall = _suite_result().overall
    assert overall["score"] == pytest.approx(0.75) and overall["datasets"] == 2
    assert (overall["score_ci_low"], overall["score_ci_high"]) == mean_of_means_ci([[1.0] * 5 + [0.0] * 5,
                                                                                   [1.0] * 1000])
    # pooling the 1,010 questions would give a tight interval around 0.995; the stratified one is around 0.75
    assert overall["score_ci_low"] < 0.75 < overall["score_ci_high"] <= 0.9


def test_suite_overall_interval_is_none_without_credits():
    from aml_ray.run.suite_run import BundleOutcome, overall_of

    overall = overall_of([BundleOutcome("a", "a", "A", "ran", score=0.5, n_total=2, n_scored=2)])
    assert overall["score"] == 0.5 and overall["score_ci_low"] is None and overall["score_ci_high"] is None
    assert overall_of([])["score_ci_low"] is None


def test_suite_overall_table_shows_the_interval():
    from rich.console import Console

    from aml_ray.suite_cli import overall_table

    result = _suite_result()
    console = Console(record=True, width=200)
    console.print(overall_table(result, offline=True))
    text = " ".join(console.export_text().split())  # the caption wraps
    low, high = result.overall["score_ci_low"], result.overall["score_ci_high"]
    assert f"0.750 [{low:.3f}, {high:.3f}]" in text
    assert "0.500 ± 0.158" in text  # a bundle without its result table keeps score ± standard error
    assert "2,000 question resamples, seed 0" in text and "within the dataset" in text


def _overall_table_text(outcome, width: int) -> tuple[str, str]:
    """The suite Overall table of one bundle's ``outcome`` at ``width`` columns: its text, and its note
    column's text joined across wrapped lines."""
    from types import SimpleNamespace

    from rich.console import Console

    from aml_ray.run.suite_run import overall_of
    from aml_ray.suite_cli import overall_table

    suite = SimpleNamespace(name="textual", version="v1",
                            aggregation=SimpleNamespace(rule="Overall = unweighted mean of the dataset scores."))
    console = Console(record=True, width=width)
    console.print(overall_table(SimpleNamespace(suite=suite, outcomes=[outcome], overall=overall_of([outcome])),
                                offline=False))
    text = console.export_text()
    notes = "".join(line.split("│")[-2].strip() for line in text.splitlines() if line.count("│") >= 8)
    return text, notes


def test_suite_overall_table_keeps_a_long_skip_reason_whole():
    """A bundle's skip or failure reason is the user's next step: the Overall table folds it in its note
    column instead of cutting it at 60 characters (ScriptMem's reason ended in "…")."""
    from aml_ray.run.suite_run import BundleOutcome

    reason = ("refused: /data/scriptmem/scriptmem.json: sha256 0123abcd differs from the pinned 4567ef01; "
              "pass --allow-hash-mismatch to run it anyway (recorded)")
    outcome = BundleOutcome("scriptmem", "scriptmem", "ScriptMem", "failed", reason=reason)
    text, notes = _overall_table_text(outcome, 120)
    assert "…" not in text
    assert reason.replace(" ", "") in notes.replace(" ", "")


def test_suite_overall_table_names_an_absent_bundles_file_at_80_columns():
    """An absent bundle's note keeps the file looked for and the fetch command (it read only
    "absent (aml-ray datasets fetch ...)")."""
    from aml_ray.run.suite_run import BundleOutcome

    reason = "absent: ../shared/datasets/beam/beam_100k.json not found (aml-ray datasets fetch beam)"
    text, notes = _overall_table_text(BundleOutcome("beam", "beam", "BEAM", "skipped", reason=reason), 80)
    assert max(map(len, text.splitlines())) <= 80
    assert reason.replace(" ", "") in notes.replace(" ", "")


@pytest.mark.parametrize("max_cells", [bootstrap.MAX_CELLS, 40 * 7])
def test_intervals_of_several_columns_share_one_draw_per_length_and_equal_one_by_one(monkeypatch, max_cells):
    """``mean_cis`` (the recall table's K columns of one category, issue 29's run tail): one index matrix per
    length, the very intervals ``mean_ci`` gives each column alone, in blocks too; an empty column (None, None)."""
    from aml_ray.scoring.bootstrap import mean_cis

    monkeypatch.setattr(bootstrap, "MAX_CELLS", max_cells)
    rng = np.random.default_rng(3)
    columns = [rng.random(40), (rng.random(40) > 0.5).astype(float), [], rng.random(13), rng.random(40)]
    assert mean_cis(columns) == [mean_ci(c) for c in columns]
    assert mean_cis(columns)[2] == (None, None)
    with pytest.raises(ValueError, match="NaN"):
        mean_cis([[0.5, float("nan")]])


def test_the_recall_table_intervals_are_each_columns_own(monkeypatch):
    """The recall table's intervals, drawn once per category for every K, are those of each K's column alone."""
    from aml_ray.scoring.evidence_recall import KS, recall_table

    rng = np.random.default_rng(7)
    rows = [{"question_id": f"q{i}", "category": str(i % 3), "n_evidence": 1, "n_unresolved": 0, "first_rank": 1,
             **{f"recall@{k}": float(rng.random()) for k in KS}, **{f"recall_exact@{k}": 0.0 for k in KS}}
            for i in range(30)]
    table = recall_table(rows)
    for entry in table:
        members = [r for r in rows if entry["category"] in ("overall", r["category"])]
        for k in KS:
            assert (entry[f"recall@{k}_ci_low"], entry[f"recall@{k}_ci_high"]) == mean_ci([r[f"recall@{k}"] for r in members])
