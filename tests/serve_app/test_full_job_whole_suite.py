"""Full service jobs over every Textual bundle whose files ../shared/datasets holds (each bundle runs a sample:
AML_FULL_SAMPLES=1), on one Serve deployment:

- against the reference system, the job ends ``completed`` and reaches the review queue; once published, the
  public board has no horizontal overflow at 1280 and 390 px in Chromium;
- against a participant that refuses every Search of one bundle, walked in Chromium: the job page names the
  failing bundle and its cause, shows the other bundles' results, and its overall progress, sampled while the
  job runs, never decreases. ``$AML_SCREENSHOT_DIR`` (the README's docs/img/) receives the page's screenshot.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from playwright.sync_api import expect

from aml_ray.reference.server import ReferenceServer
from aml_ray.suite import SUITES_DIR
from tests.conftest import SHARED_DATASETS
from tests.dying_participants import FailingParticipant
from tests.serve_harness import ADMIN, served
from tests.service_suites import waive_sample_limit
from tests.test_service_flow import MSK, Api, _onboard

pytestmark = pytest.mark.ray

#: The Textual bundles whose files ../shared/datasets holds (LongMemEval oracle stands in for the absent -S file).
PRESENT = ["locomo", "longmemeval_oracle", "beam"]
#: The bundle whose Searches the failing participant refuses (the middle one: bundles run before and after it).
REFUSED = "longmemeval_oracle"


def present_bundles_suite() -> str:
    """A copy of the shipped Textual suite (same name and version) holding the present bundles, and LongMemEval-S
    whose absent file the oracle bundle stands in for."""
    suite = json.loads((SUITES_DIR / "textual.json").read_text())
    suite["bundles"] = [b for b in suite["bundles"] if b["name"] in PRESENT + ["longmemeval_s"]]  # its stand-in
    path = Path(tempfile.mkdtemp(prefix="aml-suite-")) / "textual-present.json"
    path.write_text(json.dumps(suite))
    return str(path)


def judge_reply(prompt: str) -> str:
    """The locked models' stand-in: a rubric verdict for BEAM's rubric judge, a label for the others (about
    half correct, by prompt length); the answers are the same text, which the judges never see as a verdict."""
    if '{"score": 0.5' in prompt:
        return '{"score": %s, "reason": "one sentence"}' % ("1.0" if len(prompt) % 2 else "0.5")
    return '{"label": "%s"}' % ("CORRECT" if len(prompt) % 2 else "WRONG")


@pytest.fixture(scope="module")
def service(ray_session, tmp_path_factory):
    """(base URL, its SQLite database URL, a work folder) of the one Serve deployment of this module."""
    tmp = tmp_path_factory.mktemp("whole-suite")
    with served(tmp, judge_reply, datasets_dir=SHARED_DATASETS, suites={"textual": present_bundles_suite()},
                smoke_limit_samples=1, full_limit_samples=1) as base:
        yield base, f"sqlite:///{tmp / 'aml.sqlite3'}", tmp


def overflow(page) -> int:
    """Pixels the page is wider than its viewport (0: no horizontal scroll bar)."""
    return page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")


def passed_smoke(database_url: str, job_id: str) -> None:
    """Mark the smoke ``job_id`` completed in the store, so that its version may run a full job."""
    from aml_ray.store import make_engine, session_factory
    from aml_ray.store.jobs import get_job, mark_completed

    engine = make_engine(database_url)
    with session_factory(engine).begin() as s:
        mark_completed(s, get_job(s, job_id))
    engine.dispose()


def test_a_full_job_over_every_present_bundle_completes_and_reaches_review(service, browser):
    base, database_url, tmp = service
    api = Api(base)
    with ReferenceServer(tmp / "reference", auth="Bearer", secret=MSK) as ref:
        key, version_id = _onboard(api, ref, "BM25 reference")
        smoke = api.post_job(key, version_id, "smoke", "smoke-1")
        assert api.wait_job(smoke, key, timeout=600)["status"] == "completed"
        job = api.wait_job(api.post_job(key, version_id, "full", "full-1"), key, timeout=900)
    assert job["status"] == "completed", job["error_summary"]
    assert [(b["name"], b["status"], b["progress"]) for b in job["bundles"]] == [(n, "ran", 1.0) for n in PRESENT]
    res = api.call("GET", f"/api/results/{job['id']}", key=key).json()
    assert sorted(res["facts"]["datasets"]) == sorted(PRESENT)
    assert res["review"]["status"] == "pending"
    queue = api.call("GET", "/api/admin/reviews", key=ADMIN).json()
    assert [r["job_id"] for r in queue] == [job["id"]]

    # published (its gate fails: a sample of a suite copy that lacks bundles; waived here), the board fits
    # 1280 and 390 px
    assert not queue[0]["gate"]["passed"]
    waive_sample_limit(database_url, job["id"])
    assert api.call("POST", f"/api/admin/reviews/{queue[0]['id']}/approve", key=ADMIN).status_code == 200
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{base}/leaderboard/textual")
    expect(page.locator('#board tr[data-system="BM25 reference"]')).to_have_count(1)
    measured = page.locator('#board tr[data-system="BM25 reference"] .measured').inner_text()
    assert measured.startswith("answer: gpt-4o-mini · textual@"), measured  # the answer model and suite per row
    widths = {}
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 900})
        widths[width] = overflow(page)
    assert widths == {1280: 0, 390: 0}


def _live_state(page) -> list[str]:
    """``[status, progress, current bundle or ""]`` as the job page shows them at one moment: its live part is
    replaced as a whole at every poll, so an element found by one read can be gone at the next (the
    ``#current-bundle`` of a bundle that has just ended)."""
    return page.evaluate("""() => ['#status', '#progress', '#current-bundle'].map(
        (id) => { const e = document.querySelector(id); return e ? e.innerText : ''; })""")


def test_a_full_job_that_fails_on_one_bundle_shows_the_others_and_names_it(service, browser):
    base, database_url, tmp = service
    api = Api(base)
    shots = Path(os.environ.get("AML_SCREENSHOT_DIR") or tmp)
    with FailingParticipant(refuse_search_of=REFUSED) as participant:
        endpoints = SimpleNamespace(add_url=f"{participant.base_url}/add", search_url=f"{participant.base_url}/search",
                                    health_url=f"{participant.base_url}/health")
        key, version_id = _onboard(api, endpoints, "WordMem")
        smoke = api.wait_job(api.post_job(key, version_id, "smoke", "smoke-1"), key, timeout=600)
        assert smoke["error_summary"].startswith("conformance checks failed: auth [Authorization]")

        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{base}/evaluate")
        page.get_by_label("Leaderboard API key", exact=True).fill(key)
        page.click("#verify-button")
        expect(page.locator("#verified")).to_contain_text(key[:8])
        page.goto(f"{base}/evaluate/jobs/{smoke['id']}")  # the smoke's page shows its conformance report
        assert page.locator('#conformance tr[data-check="auth"]').get_attribute("data-outcome") == "fail"
        assert page.locator("#conformance tbody tr").count() == len(smoke["conformance"]["checks"])
        passed_smoke(database_url, smoke["id"])  # this stand-in checks no key and stores a repeated Add twice
        job_id = api.post_job(key, version_id, "full", "full-1")
        page.goto(f"{base}/evaluate/jobs/{job_id}")
        seen: list[tuple[float, str]] = []  # (overall progress shown, current bundle shown)
        deadline = time.monotonic() + 900
        while (state := _live_state(page))[0] in ("queued", "running"):
            assert time.monotonic() < deadline, "the job did not end within 900 s"
            seen.append((float(state[1].rstrip("%")), state[2]))
            page.wait_for_timeout(250)
    shown = [p for p, _ in seen]
    assert shown == sorted(shown), shown  # never drops, also when the next bundle starts
    current = {c for _, c in seen if c}
    assert {f"bundle {i} of 3: {n}" for i, n in enumerate(PRESENT, 1)} >= current and len(current) >= 2, current

    expect(page.locator("#status")).to_have_text("partial")
    rows = {r.get_attribute("data-bundle"): r for r in page.locator("#bundles tbody tr").all()}
    assert list(rows) == PRESENT
    assert {n: r.get_attribute("data-status") for n, r in rows.items()} == {
        "locomo": "ran", REFUSED: "failed", "beam": "ran"}
    reason = rows[REFUSED].locator("td.reason").inner_text()
    assert reason.startswith("stopped: ParticipantError: search ") and "HTTP 400 is not retried" in reason, reason
    assert page.locator("#error-text").inner_text().startswith(f"bundle {REFUSED} failed: stopped: ")
    final = float(page.locator("#progress").inner_text().rstrip("%"))
    assert shown[-1] <= final < 100.0
    results = {r.get_attribute("data-dataset") for r in page.locator("#results tbody tr").all()}
    assert results == {"locomo", "beam"}  # the bundles that ran keep their results
    assert page.locator('#results tr[data-dataset="locomo"][data-category="1"] td').nth(1).inner_text() == \
        "multi-hop (1)"  # LoCoMo's categories by name
    judge = page.locator('#stages tr[data-stage="judge"] td').nth(1).inner_text()
    done, total = (int(x) for x in judge.split(" / "))
    assert done < total  # the refused bundle's questions were never judged
    page.screenshot(path=str(shots / "evaluate-job-bundles.png"), full_page=True)

    page.goto(f"{base}/evaluate")  # the job list does not read 100 % for it
    listed = page.locator(f'#jobs tr[data-job="{job_id}"] td.num').first.inner_text()
    assert listed == f"{final:.1f}%", listed


def test_the_access_request_limit_under_serve_counts_each_client_address(service):
    """Serve's proxy hands the replica the client address it saw: ``X-Forwarded-For`` from a loopback peer
    (uvicorn's default ``forwarded_allow_ips``, a reverse proxy on the same host), else the TCP peer."""
    from tests.test_service_api import request_body

    base, _, _ = service
    with FailingParticipant() as participant, httpx.Client(base_url=base, timeout=60) as client:
        def submit(address: str, i: int) -> int:
            body = request_body(participant.base_url, system_name=f"Limited {address} {i}")
            return client.post("/api/access-requests", json=body, headers={"X-Forwarded-For": address}).status_code

        first = [submit("203.0.113.7", i) for i in range(11)]
        other = submit("203.0.113.8", 0)
    assert (first, other) == ([201] * 10 + [429], 201)
