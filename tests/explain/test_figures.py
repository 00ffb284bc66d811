"""The report's explanations (aml_ray.explain.figures): baselines beside the score, the attribution bar and the
budget curve, in ``aml-ray report``'s HTML, from real runs of the planted dataset (tests.planted): two planted
participants and the ``none`` and ``oracle`` reference baselines through the reference server."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from aml_ray.cli import app
from aml_ray.reference.server import ReferenceServer
from tests.planted import evaluate_planted, gold_only_app, never_gold_app, planted_run, write_dataset
OFFLINE_ENV = {"ANSWER_API_BASE": "", "JUDGE_API_BASE": "", "AML_DATASETS_DIR": ""}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, ray_session):
    tmp = tmp_path_factory.mktemp("figures")
    data = write_dataset(tmp)
    out = {}
    for name, api in (("gold-only", gold_only_app()), ("never-gold", never_gold_app())):
        out[name] = planted_run(tmp, data, api, name)
    for baseline in ("none", "oracle"):
        options = {"baseline": baseline, "dataset": "locomo", "data": str(data)}
        with ReferenceServer(tmp / f"ref-{baseline}", baseline=options) as ref:
            out[baseline] = evaluate_planted(tmp / baseline, data, ref.add_url, ref.search_url, f"reference:{baseline}")
    return out


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_the_report_shows_baselines_beside_each_score_and_the_explanations(runs, tmp_path):
    res = CliRunner().invoke(app, ["explain", str(runs["never-gold"]), "--budgets", "1k,2k"], env=OFFLINE_ENV)
    assert res.exit_code == 0, res.output
    out = tmp_path / "report.html"
    res = CliRunner().invoke(app, ["report", *(str(runs[n]) for n in ("gold-only", "never-gold", "none", "oracle")),
                                   "--out", str(out)], env=OFFLINE_ENV)
    assert res.exit_code == 0, res.output
    html = out.read_text()
    text = _text(html)
    # none 0, oracle 1 on the planted dataset: gold-only closes the whole gap, never-gold none of it
    assert "gold-only 1.000 0.000 - 1.000 1.00" in text
    assert "never-gold 0.000 0.000 - 1.000 0.00" in text
    assert 'id="attribution"' in html and 'id="budget-locomo"' in html
    assert "Why questions were wrong" in text


def test_without_explanations_or_baselines_the_report_has_neither(runs, tmp_path):
    out = tmp_path / "report.html"
    res = CliRunner().invoke(app, ["report", str(runs["gold-only"]), "--out", str(out)], env=OFFLINE_ENV)
    assert res.exit_code == 0, res.output
    html = out.read_text()
    assert "Beside the reference baselines" not in html
    assert 'id="attribution"' not in html and 'id="budget-' not in html
