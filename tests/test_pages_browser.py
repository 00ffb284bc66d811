"""The public leaderboard page and a participant's job page in real headless Chromium (Playwright).

Every page is on the site's layout (``base.html``: site navigation, ``/static/site.css``) and served with the
pages' Content-Security-Policy (``PAGE_CSP``: no inline script or style); Chromium reports each refused inline
style or script as a console error, which fails the test (the ``page`` fixture).

The app is served by uvicorn on loopback (``tests.servers.ThreadServer``) over ``create_app`` with test
settings and no job worker; the board is seeded through the store (smoke -> full -> review -> approval).
Chromium is Debian's ``/usr/bin/chromium`` (the session ``browser`` fixture of conftest): the tests never run
``playwright install`` and are skipped when the binary is missing. Screenshots go under ``tmp_path``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
from cryptography.fernet import Fernet
from playwright.sync_api import expect
from pydantic import SecretStr

from aml_ray.serve_app.app import create_app
from aml_ray.serve_app.settings import ServiceSettings
from aml_ray.serve_app.templating import PAGE_CSP
from aml_ray.store.jobs import get_job, mark_failed, record_progress
from aml_ray.store.synthetic import SyntheticEntry, job_in_progress, publish
from tests.servers import ThreadServer

ERROR = "contract error in Add: response field 'success' must be true (got false) for sample conv-26 chunk 3"

ENTRIES = [
    SyntheticEntry("Atlas Memory", "Atlas Labs", "commercial", {"locomo": 0.712, "longmemeval": 0.655},
                   published_at=datetime(2026, 3, 2, tzinfo=timezone.utc)),
    SyntheticEntry("BM25 baseline", "aml-ray", "open_source", {"locomo": 0.481},
                   published_at=datetime(2026, 2, 14, tzinfo=timezone.utc)),
    SyntheticEntry("Cortex", "Cortex Inc.", "commercial", {"locomo": 0.634, "longmemeval": 0.702}, coverage=0.97,
                   published_at=datetime(2026, 3, 20, tzinfo=timezone.utc)),
    SyntheticEntry("GraphMem", "Uni Research", "open_source", {"locomo": 0.587, "longmemeval": 0.540},
                   published_at=datetime(2026, 1, 30, tzinfo=timezone.utc)),
]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[tuple[str, dict[str, tuple[str, str]], object]]:
    """A served app with four published rows and three private jobs; yields (base URL, {name: (key, job id)},
    the app's service)."""
    tmp = tmp_path_factory.mktemp("pages")
    settings = ServiceSettings(database_url=f"sqlite:///{tmp / 'aml.sqlite3'}",
                               master_keys=[SecretStr(Fernet.generate_key().decode())], run_worker=False,
                               health_check=False, runs_dir=tmp / "runs")
    app = create_app(settings)
    service = app.state.service
    jobs = {}
    with service.sessions.begin() as session:
        for entry in ENTRIES:
            publish(session, entry)
        key, job = job_in_progress(session, system="Progress Probe")
        jobs["running"] = (key, job.id)
        key, job = job_in_progress(session, system="Broken Probe", done={"add": 3, "add_failed": 2}, failed=ERROR)
        jobs["failed"] = (key, job.id)
        key, job = job_in_progress(session, system="Partial Probe", done={"add": 28, "add_failed": 1, "search": 152,
                                                                          "answer": 152, "judge": 152})
        mark_failed(job, "1 of 28 Adds failed after retries", status="partial")
        jobs["partial"] = (key, job.id)
    with ThreadServer(app) as server:
        yield server.base_url, jobs, service
    service.engine.dispose()


@pytest.fixture
def browser_errors() -> list[str]:
    """Script errors and console errors of the test's page (a test clears the ones it expects)."""
    return []


@pytest.fixture
def page(browser, browser_errors):
    """A page of a fresh browser context (its own cookies) at 1280 x 800; fails the test on a browser error."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.on("pageerror", lambda exc: browser_errors.append(str(exc)))
    page.on("console", lambda msg: browser_errors.append(msg.text) if msg.type == "error" else None)
    yield page
    context.close()
    assert browser_errors == [], f"browser errors: {browser_errors}"


def board_rows(page) -> list[tuple[str, str, str]]:
    """(rank, system, division) of each row shown."""
    return [(r.locator("td").nth(0).inner_text(), r.get_attribute("data-system"), r.get_attribute("data-division"))
            for r in page.locator("#board tbody tr").all()]


def overflow(page) -> int:
    """Pixels the page is wider than its viewport (0: no horizontal scroll bar)."""
    return page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")


def on_site_layout(page, response, current: str) -> None:
    """Assert the page is on ``base.html`` with the pages' CSP and no inline style, ``current`` the site
    navigation's current item."""
    assert response.headers["content-security-policy"] == PAGE_CSP
    assert "unsafe-inline" not in response.headers["content-security-policy"]
    assert page.locator('header.site nav a[aria-current="page"]').inner_text() == current
    assert page.locator('link[rel="stylesheet"]').get_attribute("href") == "/static/site.css"
    assert page.locator("[style]").count() == 0 and page.locator("style").count() == 0
    assert page.locator("script:not([src])").count() == 0


def verify_key(page, base: str, key: str) -> None:
    """Start the page session of ``key`` on the Evaluation page."""
    page.goto(f"{base}/evaluate")
    page.get_by_label("Leaderboard API key", exact=True).fill(key)
    page.click("#verify-button")
    expect(page.locator("#verified")).to_be_visible()


def test_leaderboard_page_rows_bars_filter_and_screenshot(site, page, tmp_path):
    base, _, _ = site
    response = page.goto(f"{base}/leaderboard/textual")
    on_site_layout(page, response, "Leaderboard")
    assert page.title() == "Textual board · Agent Memory Leaderboard"
    assert page.locator('nav.tabs a[aria-current="page"]').inner_text() == "Textual"
    assert board_rows(page) == [("1", "Atlas Memory", "commercial"), ("2", "Cortex", "commercial"),
                                ("3", "GraphMem", "open_source"), ("4", "BM25 baseline", "open_source")]
    headers = [h.inner_text() for h in page.locator("#board thead th").all()]
    assert headers == ["Rank", "System", "Version", "Division", "Overall ▼", "locomo", "longmemeval", "Coverage",
                       "Date"]
    first = page.locator("#board tbody tr").first
    # Overall is the mean of the datasets: (71.2 + 65.5) / 2 = 68.35 -> 68.3 (rounding half to even)
    assert first.locator("td").nth(4).inner_text().strip() in ("68.3", "68.4")
    bar = first.locator("td").nth(5).locator(".score > meter")  # the bar is the <meter>'s own value
    assert (bar.get_attribute("min"), bar.get_attribute("max"), bar.get_attribute("value")) == ("0", "1", "0.7120")
    assert bar.evaluate("m => m.value") == pytest.approx(0.712) and bar.bounding_box()["width"] >= 40
    baseline = page.locator('tr[data-system="BM25 baseline"] td')
    assert baseline.nth(6).inner_text().strip() == "-"  # no longmemeval score: no bar
    assert baseline.nth(8).inner_text() == "2026-02-14"
    page.screenshot(path=str(tmp_path / "leaderboard-textual.png"), full_page=True)

    page.select_option("#division", "open_source")
    page.click("#apply")
    page.wait_for_url("**division=open_source**")
    assert board_rows(page) == [("1", "GraphMem", "open_source"), ("2", "BM25 baseline", "open_source")]
    assert page.locator("#division").input_value() == "open_source"

    page.select_option("#division", "")
    page.select_option("#dataset", "longmemeval")
    page.click("#apply")
    page.wait_for_url("**dataset=longmemeval**")
    assert [r[1] for r in board_rows(page)] == ["Cortex", "Atlas Memory", "GraphMem"]  # ranked by longmemeval
    headers = [h.inner_text() for h in page.locator("#board thead th").all()]
    assert "longmemeval" in headers and "locomo" not in headers
    page.screenshot(path=str(tmp_path / "leaderboard-textual-longmemeval.png"), full_page=True)

    page.get_by_role("link", name="System").click()
    page.wait_for_url("**sort=system**")
    assert [r[1] for r in board_rows(page)] == ["GraphMem", "Cortex", "Atlas Memory"]
    assert page.locator("#board thead th").nth(1).inner_text() == "System ▼"
    assert (tmp_path / "leaderboard-textual.png").stat().st_size > 10_000


def test_leaderboard_page_fits_1280_and_390_pixels(site, page, tmp_path):
    """The board scrolls inside its own region: the page never scrolls sideways, also on a phone."""
    base, _, _ = site
    widths = {}
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 800})
        page.goto(f"{base}/leaderboard/textual")
        widths[width] = overflow(page)
        region = page.locator("#board-wrap").bounding_box()
        assert region["x"] >= 0 and region["x"] + region["width"] <= width, (width, region)
    assert widths == {1280: 0, 390: 0}
    assert page.locator("#board-wrap").evaluate("e => e.scrollWidth > e.clientWidth")  # 390 px: the table scrolls
    page.screenshot(path=str(tmp_path / "leaderboard-390.png"), full_page=True)


def test_empty_track_page_says_so(site, page):
    base, _, _ = site
    page.goto(f"{base}/leaderboard/coding")
    assert page.locator("#empty").inner_text() == "No published results on this board yet."
    page.get_by_role("link", name="Textual").click()
    assert page.locator("#board tbody tr").count() == len(ENTRIES)


def test_job_link_leads_to_the_one_job_page_with_live_progress_for_its_key_only(site, page, browser, tmp_path):
    base, jobs, service = site
    key, job_id = jobs["running"]
    page.goto(f"{base}/jobs/{job_id}")  # no page session: verify the key first, then on to the job's page
    assert page.url == f"{base}/evaluate?job={job_id}"
    assert page.locator("#return-job").inner_text() == f"Verify the key that started job {job_id} to see its page."

    other = browser.new_context().new_page()  # another participant's key sees no such job
    other.goto(f"{base}/jobs/{job_id}")
    other.get_by_label("Leaderboard API key", exact=True).fill(jobs["failed"][0])
    other.click("#verify-button")
    expect(other.locator("h1")).to_have_text("Job not found")
    assert other.url == f"{base}/evaluate/jobs/{job_id}"
    other.context.close()

    page.get_by_label("Leaderboard API key", exact=True).fill(key)
    page.click("#verify-button")
    page.wait_for_url(f"{base}/evaluate/jobs/{job_id}")
    response = page.goto(f"{base}/jobs/{job_id}")  # the short link, with a page session: the same page
    assert page.url == f"{base}/evaluate/jobs/{job_id}"
    assert response.request.redirected_from.url == f"{base}/jobs/{job_id}"
    on_site_layout(page, response, "Evaluation")
    assert page.locator('script[src="/static/evaluate.js"]').count() == 1
    assert page.locator("#status").inner_text() == "running"
    rows = [(r.get_attribute("data-stage"), r.locator("td").nth(1).inner_text())
            for r in page.locator("#stages tbody tr").all()]
    assert rows == [("add", "28 / 28"), ("search", "61 / 152"), ("answer", "40 / 152"), ("judge", "12 / 152"),
                    ("aggregate", "0 / 1")]
    search = page.locator('tr[data-stage="search"] progress')
    assert (search.get_attribute("max"), search.get_attribute("value")) == ("152", "61")
    assert page.locator("#error").count() == 0
    assert key not in page.content() and key not in page.url

    with service.sessions.begin() as session:  # the job moves on: the page shows it without a reload
        record_progress(get_job(session, job_id), "done", {"add": 28, "search": 100, "answer": 40, "judge": 12})
    expect(page.locator('tr[data-stage="search"] td').nth(1)).to_have_text("100 / 152", timeout=10_000)
    assert page.url == f"{base}/evaluate/jobs/{job_id}"
    page.screenshot(path=str(tmp_path / "job-running.png"), full_page=True)


def test_job_page_shows_the_error_summary_of_a_failed_job(site, page, tmp_path):
    base, jobs, _ = site
    key, job_id = jobs["failed"]
    verify_key(page, base, key)
    response = page.goto(f"{base}/jobs/{job_id}")
    assert response.headers["cache-control"] == "no-store"
    assert response.headers["content-security-policy"] == PAGE_CSP
    assert page.locator("#status").inner_text() == "failed"
    assert page.locator("#error-text").inner_text() == ERROR
    badge = page.locator("#status").evaluate("e => getComputedStyle(e).backgroundColor")
    assert badge == "rgb(251, 218, 218)"  # red
    add = page.locator('#stages tr[data-stage="add"] td')
    assert (add.nth(1).inner_text(), add.nth(2).inner_text()) == ("3 / 28", "2")  # 2 failed
    page.screenshot(path=str(tmp_path / "job-failed.png"), full_page=True)


def test_job_page_shows_a_partial_job_amber_with_its_failed_units(site, page):
    """Issue 24: a run whose evidence misses an Add is 'partial', never 'completed', and says how many failed."""
    base, jobs, _ = site
    key, job_id = jobs["partial"]
    verify_key(page, base, key)
    page.goto(f"{base}/jobs/{job_id}")
    assert page.locator("#status").inner_text() == "partial"
    assert page.locator("#status").evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(253, 236, 200)"
    assert page.locator("#stage-line").count() == 0  # a finished job shows no current stage
    add = page.locator('#stages tr[data-stage="add"] td')
    assert (add.nth(1).inner_text(), add.nth(2).inner_text()) == ("28 / 28", "1")
    assert page.locator("#error-text").inner_text() == "1 of 28 Adds failed after retries"
