"""``aml-ray report``: one self-contained HTML file, opened in real headless Chromium (Playwright).

Two real runs on LoCoMo conv-26 (made once for the module, through Ray, offline answerer and judge): the
reference BM25 system and a loopback participant whose Search returns nothing. Chromium is Debian's
``/usr/bin/chromium`` as in tests/test_pages_browser.py (never ``playwright install``); every request
that is not the report file itself is failed and recorded, so the page must show everything offline.
"""

from __future__ import annotations

import base64
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.cli import app
from aml_ray.config import model_endpoint_from_env
from aml_ray.run.evaluation import EvaluationConfig, evaluate
from aml_ray.reference.server import ReferenceServer
from aml_ray.report import DPI, RunData, histogram_figure, load_run, run_dirs
from tests.planted import empty_app
from tests.servers import ThreadServer

CHROMIUM = Path(os.environ.get("AML_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
OFFLINE = {"answer": model_endpoint_from_env("answer", {}), "judge": model_endpoint_from_env("judge", {})}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, locomo_file, ray_session):
    """``(bm25_dir, empty_dir)``: conv-26 (1 sample) against reference:bm25 and against the empty participant."""
    tmp = tmp_path_factory.mktemp("report")
    with ReferenceServer(tmp / "ref") as ref:
        spec = ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url)
        evaluate(EvaluationConfig(dataset="locomo", participant=spec, out_dir=tmp / "bm25", data_path=locomo_file,
                                  limit_samples=1, run_label="bm25", participant_label="reference:bm25", **OFFLINE))
    with ThreadServer(empty_app()) as server:
        spec = ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search")
        evaluate(EvaluationConfig(dataset="locomo", participant=spec, out_dir=tmp / "empty", data_path=locomo_file,
                                  limit_samples=1, run_label="empty", participant_label="empty", **OFFLINE))
    return tmp / "bm25", tmp / "empty"


@pytest.fixture(scope="module")
def report_file(runs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("html") / "report.html"
    res = CliRunner().invoke(app, ["report", str(runs[0]), str(runs[1]), "--out", str(out), "--title", "bm25 vs empty"])
    assert res.exit_code == 0, res.output
    assert "report written to" in res.output
    return out


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])  # IHDR width, height


def test_report_is_one_self_contained_file(report_file):
    html = report_file.read_text()
    # nothing to fetch: no script, stylesheet link, external src/href or CSS url(); figures are data: URIs
    for needle in ("<script", "<link", 'src="http', "src='http", 'href="http', "url(", "@import"):
        assert needle not in html, needle
    assert html.count('src="data:image/png;base64,') == 4
    # the accuracy figure: 9 x 3 inches at DPI; the histograms 3.3 x 2.6 inches
    first = html.split('src="data:image/png;base64,')[1].split('"')[0]
    assert _png_size(base64.b64decode(first)) == (round(9.0 * DPI), round(3.0 * DPI))


def test_report_opens_in_chromium_with_its_figures_and_no_request(report_file, tmp_path):
    from playwright.sync_api import sync_playwright

    assert CHROMIUM.exists(), f"{CHROMIUM} missing: run scripts/install_test_deps.sh (Debian chromium)"
    requests: list[str] = []

    def only_the_file(route):
        if route.request.url.startswith("file://"):
            route.continue_()
        else:  # any network request: recorded and failed
            requests.append(route.request.url)
            route.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 900})
            page.route("**/*", only_the_file)
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(report_file.resolve().as_uri())
            page.wait_for_load_state("load")
            assert page.title() == "bm25 vs empty"
            images = page.locator("figure img")
            assert images.count() == 4
            for i in range(4):  # every PNG decoded by the browser, shown at a real size
                size = images.nth(i).evaluate("img => [img.complete, img.naturalWidth, img.clientWidth]")
                assert size[0] is True and size[1] > 300 and size[2] > 250, size
            captions = page.locator("figcaption").all_inner_texts()
            assert len(captions) == 4
            assert captions[0].startswith("Accuracy per category and overall, with the 95% percentile bootstrap")
            assert "Search latency" in captions[1] and "Add latency" in captions[2] and "context" in captions[3]
            assert [page.locator(f"figure#{i}").count() for i in
                    ("accuracy", "search-latency", "add-latency", "context-tokens")] == [1, 1, 1, 1]
            rows = page.locator("table.runs tbody tr").all_inner_texts()
            assert len(rows) == 2 and "bm25" in rows[0] and "empty" in rows[1]
            assert "OFFLINE" in page.locator(".warn").inner_text()
            categories = page.locator("table.categories tbody tr").all_inner_texts()
            assert [c.split("\t")[1] for c in categories] == ["1 multi-hop", "2 temporal", "3 open-domain",
                                                              "4 single-hop", "5 adversarial", "overall"]
            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        finally:
            browser.close()
    assert requests == [] and errors == []
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_report_figures_show_the_runs_figures(runs):
    bm25, empty = (load_run(p) for p in runs)
    info = json.loads((runs[0] / "run.json").read_text())
    # the same question set; the table has the bootstrap columns; latencies and context tokens from evidence
    overall = bm25.table.filter(bm25.table["category"] == "overall").to_dicts()[0]
    assert overall["n_total"] == 152 and overall["accuracy_ci_low"] < overall["accuracy"] < overall["accuracy_ci_high"]
    assert bm25.add_ms.size == info["adds"]["ok"] and bm25.search_ms.size == 152
    assert np.median(bm25.add_ms) == pytest.approx(info["adds"]["latency_ms"]["p50"])
    assert bm25.context_tokens.size == 152 and bm25.context_tokens.mean() > empty.context_tokens.mean()


def test_a_suite_directory_stands_for_its_bundles(runs, tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "suite.json").write_text(json.dumps({"bundles": [
        {"name": "locomo", "status": "ran", "run_dir": str(runs[0])},
        {"name": "beam", "status": "skipped"}]}))
    assert run_dirs([suite, runs[1]]) == [(runs[0], "locomo"), (runs[1], None)]
    with pytest.raises(FileNotFoundError, match="no run.json or suite.json"):
        run_dirs([tmp_path / "nothing"])
    res = CliRunner().invoke(app, ["report", str(tmp_path / "nothing"), "--out", str(tmp_path / "r.html")])
    assert res.exit_code == 2 and "no run.json or suite.json" in res.output and not (tmp_path / "r.html").exists()


def test_histogram_without_data_says_so():
    run = RunData(root=Path("."), info={}, label="x", table=None, add_ms=np.array([]), search_ms=np.array([]),
                  context_tokens=np.array([]))
    png = base64.b64decode(histogram_figure([run], "add_ms", "Add latency (ms)", "ms"))
    assert _png_size(png) == (round(3.3 * DPI), round(2.6 * DPI))
