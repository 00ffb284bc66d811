"""The service's pages walked in real headless Chromium (Playwright) over a real loopback uvicorn server.

One flow, as participant and admin (issue 28, items 5-7): the access-request form -> the one-time status
token -> admin sign-in and the request with everything submitted -> approve -> the submitter's status
page shows the Leaderboard API key once -> the Evaluation page (verify key, bound version, run label,
smoke, then full with the checklist that keeps the start button disabled until every item is checked)
-> the job page updating itself (stages, done / failed counts) -> the private per-category result table
-> the admin review queue (system, version, scores, gate checks) -> approve -> the public board.

The app runs without its job dispatcher: the test moves each job through the store's own progress calls
(:mod:`aml_ray.store.jobs`), the ones the dispatcher makes, so the pages' polling is what is tested and
the test takes seconds. ``/docs`` and ``/redoc`` are loaded with every non-loopback request aborted
(item 8). Screenshots go under ``tmp_path``, or ``$AML_SCREENSHOT_DIR`` (the README's docs/img/).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
from cryptography.fernet import Fernet
from playwright.sync_api import expect
from pydantic import SecretStr

from aml_ray.serve_app.app import create_app
from aml_ray.serve_app.settings import ServiceSettings
from aml_ray.store.jobs import get_job, mark_completed, mark_running, record_progress
from aml_ray.store.results import open_review, save_result
from tests.conftest import LOCOMO_FILE
from tests.servers import ThreadServer

ADMIN = "admin-token-pages-0123456789abcdef"
MSK = "msk-pages-secret-6f5e4d3c2b1a"
CHECKLIST = ("smoke_passed", "contract_followed", "run_instructions_complete", "original_work_disclosed",
             "no_integrity_violation")
TOTALS = {"add": 28, "search": 152, "answer": 152, "judge": 152}
#: The per-category rows a finished full job stores (shape of aml_ray.scoring.aggregate).
TABLE = [{"dataset": "locomo", "category": c, "accuracy": a, "accuracy_ci_low": lo, "accuracy_ci_high": hi,
          "coverage": 1.0, "f1": f1, "bleu1": None, "n_total": n, "n_scored": n, "n_errors": 0, "n_excluded": 0}
         for c, a, lo, hi, f1, n in [("overall", 0.625, 0.546, 0.697, 0.41, 152), ("single-hop", 0.5, 0.344, 0.656, 0.3, 32),
                                     ("multi-hop", 0.7, 0.6, 0.79, 0.5, 70), ("temporal", 0.6, 0.46, 0.74, 0.36, 50)]]
GATE = {"passed": True, "checks": {name: {"ok": True, "detail": detail} for name, detail in [
    ("full_run_completed", "mode full, status completed"), ("all_tasks_succeeded", "0 failed Adds, 0 question errors"),
    ("answer_model", "'gpt-4o-mini' vs baseline 'gpt-4o-mini'"), ("unique", "no other publication of this version")]}}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[tuple[str, object]]:
    """(base URL, service) of an app with an admin token, loopback endpoints allowed and no dispatcher."""
    tmp = tmp_path_factory.mktemp("pages-flow")
    settings = ServiceSettings(database_url=f"sqlite:///{tmp / 'aml.sqlite3'}",
                               master_keys=[SecretStr(Fernet.generate_key().decode())], admin_token=SecretStr(ADMIN),
                               allow_loopback=True, run_worker=False, health_check=False, runs_dir=tmp / "runs",
                               dataset_paths={"locomo": LOCOMO_FILE})
    if hasattr(settings, "suites"):  # durable jobs run the track's suite: one LoCoMo bundle, as the service tests
        from tests.service_suites import locomo_only_suite

        settings.suites = {"textual": locomo_only_suite()}
    app = create_app(settings)
    with ThreadServer(app) as server:
        yield server.base_url, app.state.service
    app.state.service.engine.dispose()


@pytest.fixture
def shots(tmp_path) -> Path:
    out = Path(os.environ.get("AML_SCREENSHOT_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def new_page(browser, errors: list[str]):
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    return page


def progress(service, job_id: str, done: dict[str, int] | None = None) -> None:
    """What the dispatcher records while a job runs: running, stage totals, done (and failed) counts."""
    with service.sessions.begin() as s:
        job = get_job(s, job_id)
        if job.status == "queued":
            mark_running(job, run_dir="")
            record_progress(job, "totals", TOTALS)
        if done:
            record_progress(job, "done", done)


def write_panel(run_dir: Path) -> None:
    """What ``aml-ray rejudge RUN_DIR --panel`` leaves in a job's LoCoMo run: its panel.json, the report of four
    answers judged under each protocol (CORRECT for 3, 2 and 1 of them: accuracies 0.75, 0.5, 0.25)."""
    from aml_ray.run.evidence import write_json_atomic
    from aml_ray.scoring.panel import PANEL, run_report

    def rows(correct: int) -> list[dict]:
        return [{"question_id": f"q{i}", "excluded": False, "answer_status": "ok", "status": "scored",
                 "verdict": "CORRECT" if i < correct else "WRONG", "question": f"Question {i}?", "gold": '["x"]',
                 "answer": "x", "category": "single-hop"} for i in range(4)]

    report = run_report({p.name: rows(correct) for p, correct in zip(PANEL, (3, 2, 1))})
    write_json_atomic({"source_run_id": "r1", "name": "EngineMem", "offline": False, **report,
                       "finished_at": "2026-12-06T10:00:00+00:00"}, run_dir / "locomo" / "rejudge" / "p1" / "panel.json")


def finish(service, job_id: str, *, review: bool) -> None:
    """What the dispatcher records when a job completes: the result table, then the review of a full job (whose
    run directory then gets a judge panel, :func:`write_panel`)."""
    with service.sessions.begin() as s:
        job = get_job(s, job_id)
        if review:
            job.run_dir = str(Path(service.settings.runs_dir) / job.id)
            write_panel(Path(job.run_dir))
        save_result(s, job, TABLE, {"models": {"answer": {"model": "gpt-4o-mini"}}})
        record_progress(job, "done", TOTALS)
        mark_completed(s, job)
        if review:
            open_review(s, job, GATE)


def start_job(page) -> str:
    """Click the start button; the job page's id (a refusal fails the test with the page's messages)."""
    page.click("#start-button")
    page.wait_for_url(re.compile(r"/evaluate/jobs(/job_[A-Za-z0-9_-]+)?$"))
    assert page.locator("#form-errors").count() == 0, page.locator("#form-errors").inner_text()
    return page.url.rsplit("/", 1)[1]


def fill_access_request(page, base: str) -> None:
    page.goto(f"{base}/apply")
    for field, value in [("contact_name", "Ada Lovelace"), ("contact_email", "ada@example.org"),
                         ("organization", "Engine Lab"), ("system_name", "EngineMem"), ("version_label", "v1.2"),
                         ("add_url", "http://127.0.0.1:9/add"), ("search_url", "http://127.0.0.1:9/search"),
                         ("repository_url", "https://github.com/engine-lab/enginemem"), ("commit", "0a1b2c3d4e5f"),
                         ("attribution", "Builds on MemGPT (Packer et al., 2023)"),
                         ("method_changes", "BM25 over session summaries")]:
        page.get_by_label(re.compile(r"^" + {"contact_name": "Contact name", "contact_email": "Contact email",
                                             "organization": "Organization", "system_name": "System name",
                                             "version_label": "Version label", "add_url": "Add URL",
                                             "search_url": "Search URL", "repository_url": "Public repository",
                                             "commit": "Fixed commit", "attribution": "Attribution",
                                             "method_changes": "Method changes"}[field])).fill(value)
    page.select_option("#f-division", "open_source")
    page.select_option("#f-auth_scheme", "Bearer")
    page.fill("#f-memory_system_key", MSK)
    page.click("#submit")


def test_participant_and_admin_walk_the_pages_end_to_end(site, browser, shots):
    base, service = site
    errors: list[str] = []
    participant, admin = new_page(browser, errors), new_page(browser, errors)
    seen: list[str] = []  # every participant/admin page's HTML, searched for the secrets at the end

    # 7: the request form answers with a one-time status token
    fill_access_request(participant, base)
    expect(participant.get_by_role("heading", name="Access request received")).to_be_visible()
    token = participant.locator("#status-token").inner_text()
    assert token.startswith("amls_") and len(token) > 40
    seen.append(participant.content())

    # 6: the admin signs in and sees everything submitted, then approves
    admin.goto(f"{base}/admin")
    admin.get_by_label("Admin token").fill("wrong-token")
    admin.click("#login-button")
    expect(admin.locator("#login-error")).to_have_text("Wrong admin token.")
    assert errors == ["Failed to load resource: the server responded with a status of 401 (Unauthorized)"]
    errors.clear()  # Chromium logs the refused sign-in (401) as a console error: expected here
    admin.get_by_label("Admin token").fill(ADMIN)
    admin.click("#login-button")
    admin.wait_for_url("**/admin/access-requests")
    card = admin.locator("article[data-request]")
    expect(card).to_have_count(1)
    assert card.locator(".contact").inner_text() == "Ada Lovelace <ada@example.org>, Engine Lab"
    assert card.locator(".add-url").inner_text() == "http://127.0.0.1:9/add"
    assert card.locator(".repository").inner_text() == "https://github.com/engine-lab/enginemem"
    assert card.locator(".commit").inner_text() == "0a1b2c3d4e5f"
    assert card.locator(".attribution").inner_text() == "Builds on MemGPT (Packer et al., 2023)"
    assert "Bearer (Memory System Key held encrypted)" in card.inner_text()
    seen.append(admin.content())
    card.get_by_role("button", name="Approve").click()
    expect(admin.locator("#notice")).to_contain_text("waits, encrypted, on the submitter's status page")
    expect(admin.locator("#empty")).to_be_visible()
    seen.append(admin.content())

    # 7: the submitter reads the key once on the status page
    participant.goto(f"{base}/access-requests/status")
    participant.get_by_label(re.compile("Status token")).fill(token)
    participant.click("#status-button")
    expect(participant.locator("#request-status")).to_have_text("approved")
    key = participant.locator("#leaderboard-key").inner_text()
    assert key.startswith("aml_")
    participant.get_by_label(re.compile("Status token")).fill(token)
    participant.click("#status-button")
    expect(participant.locator("#key-taken")).to_have_text("The key of this request was already shown once.")
    assert key not in participant.content()
    assert all(key not in html for html in seen)  # the admin's pages never showed it

    # 5: verify the key, see the bound version, run a smoke
    participant.goto(f"{base}/evaluate")
    participant.get_by_label("Leaderboard API key", exact=True).fill(key)
    participant.click("#verify-button")
    expect(participant.locator("#verified")).to_contain_text(key[:8])
    assert key not in participant.content()
    assert [r.inner_text().split("\t")[:3] for r in participant.locator("#versions tbody tr").all()] == [
        ["EngineMem", "v1.2", "textual"]]
    participant.get_by_label("Run label").fill("smoke-1")
    expect(participant.locator("#start-button")).to_be_enabled()  # smoke needs no checklist
    smoke_id = start_job(participant)
    progress(service, smoke_id)
    finish(service, smoke_id, review=False)

    # full: the checklist keeps the start button disabled until every item is checked
    participant.goto(f"{base}/evaluate")
    participant.get_by_label("Run label").fill("full-1")
    participant.get_by_role("radio", name=re.compile("full: the fixed suite")).check()
    start = participant.locator("#start-button")
    expect(start).to_be_disabled()
    expect(participant.locator("#start-hint")).to_have_text(
        "Full run: confirm 5 more checklist items to unlock the start button.")
    for name in CHECKLIST[:-1]:
        participant.locator(f"#check-{name}").check()
        expect(start).to_be_disabled()
    expect(participant.locator("#start-hint")).to_have_text(
        "Full run: confirm 1 more checklist item to unlock the start button.")
    participant.locator(f"#check-{CHECKLIST[-1]}").check()
    expect(start).to_be_enabled()
    participant.screenshot(path=str(shots / "evaluate-checklist.png"), full_page=True)
    full_id = start_job(participant)
    expect(participant.locator("#status")).to_have_text("queued")
    participant.evaluate("window.__notReloaded = true")

    # live progress: the page polls and redraws itself, done and failed counts per stage
    progress(service, full_id, {"add": 28, "add_failed": 1, "search": 61, "answer": 40, "judge": 12})
    expect(participant.locator("#status")).to_have_text("running")
    add_row = participant.locator('#stages tr[data-stage="add"] td')
    expect(add_row.nth(1)).to_have_text("28 / 28")
    expect(add_row.nth(2)).to_have_text("1")
    expect(participant.locator('#stages tr[data-stage="search"] td').nth(1)).to_have_text("61 / 152")
    assert participant.locator('#stages tr[data-stage="search"] progress').get_attribute("value") == "61"
    participant.screenshot(path=str(shots / "evaluate-job-live.png"), full_page=True)
    progress(service, full_id, {"search": 152, "answer": 140, "judge": 120})
    expect(participant.locator('#stages tr[data-stage="judge"] td').nth(1)).to_have_text("120 / 152")

    # the private result table, still the same page (no reload)
    finish(service, full_id, review=True)
    expect(participant.locator("#status")).to_have_text("completed")
    expect(participant.locator("#results")).to_be_visible()
    assert participant.evaluate("window.__notReloaded") is True
    rows = [[c.inner_text() for c in r.locator("td").all()][:5] for r in participant.locator("#results tbody tr").all()]
    assert rows == [["locomo", "overall", "62.5", "54.6–69.7", "41.0"], ["locomo", "multi-hop", "70.0", "60.0–79.0", "50.0"],
                    ["locomo", "single-hop", "50.0", "34.4–65.6", "30.0"], ["locomo", "temporal", "60.0", "46.0–74.0", "36.0"]]
    assert participant.locator("#review").inner_text().strip() == "pending"
    spread = "judge panel: spread 50.0 pts (suite 75.0 · longmemeval-upstream 50.0 · strict 25.0)"
    assert " ".join(participant.locator("#panel").inner_text().split()) == spread
    participant.screenshot(path=str(shots / "evaluate-results.png"), full_page=True)

    # 6: the review queue shows system, version, scores and gate checks; approve publishes
    admin.goto(f"{base}/admin/reviews")
    review = admin.locator("article[data-review]")
    expect(review).to_have_count(1)
    assert review.locator(".system").inner_text() == "EngineMem (Engine Lab, Open-source)"
    assert review.locator(".version").inner_text().startswith("v1.2")
    assert review.locator(".overall").inner_text() == "62.5"
    assert [c.get_attribute("data-check") for c in review.locator("tr[data-check]").all()] == list(GATE["checks"])
    admin.screenshot(path=str(shots / "admin-reviews.png"), full_page=True)
    review.get_by_role("button", name="Approve and publish").click()
    expect(admin.locator("#notice")).to_contain_text("published on the textual board")
    admin.goto(f"{base}/leaderboard/textual")
    expect(admin.locator('#board tr[data-system="EngineMem"]')).to_have_count(1)
    board_spread = admin.locator('#board tr[data-system="EngineMem"] .panel-spread')
    assert " ".join(board_spread.inner_text().split()) == spread and board_spread.get_attribute("data-spread") == "0.5000"
    panel = admin.request.get(f"{base}/api/leaderboard/textual").json()["rows"][0]["panel"]
    assert panel["overall"] == {"protocols": {"suite": 0.75, "longmemeval-upstream": 0.5, "strict": 0.25}, "spread": 0.5}

    for page in (participant, admin):
        assert MSK not in page.content() and key not in page.content()
        page.context.close()
    assert errors == [], errors


def test_docs_and_redoc_render_with_every_non_local_request_aborted(site, browser):
    base, _ = site
    context = browser.new_context()
    aborted: list[str] = []

    def only_loopback(route):
        url = route.request.url
        if url.startswith(("http://", "https://")) and urlparse(url).hostname != "127.0.0.1":
            aborted.append(url)
            return route.abort()
        return route.continue_()

    context.route("**/*", only_loopback)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{base}/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("aml-ray")
    expect(page.locator(".opblock-summary-path", has_text="/api/jobs/{job_id}").first).to_be_visible()
    page.goto(f"{base}/redoc")
    expect(page.get_by_role("heading", name=re.compile("aml-ray")).first).to_be_visible()
    expect(page.get_by_text("/api/access-requests/status").first).to_be_attached()
    for path in ("/guide", "/guide/api", "/benchmarks/propose"):
        page.goto(f"{base}{path}")
        expect(page.locator("h1")).to_have_count(1)
    context.close()
    assert aborted == [] and errors == []
