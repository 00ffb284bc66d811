"""The whole participant flow against the real Ray Serve app, with the reference system on loopback.

access request -> approval -> key -> smoke -> quota refusal on a second smoke -> full with checklist ->
results visible to that key only -> review approve -> the system on the public leaderboard JSON and page;
then a search of the database file, the Ray logs, the run directories and every API response for the
plaintext secrets.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from aml_ray.reference.server import ReferenceServer
from tests.serve_harness import ADMIN, served
from tests.service_suites import SAMPLE_LIMIT_CHECKS, locomo_only_suite, waive_sample_limit

pytestmark = pytest.mark.ray

MSK = "msk-flow-secret-4b1d2c3a9e8f7a6b"


CHECKLIST = {"smoke_passed": True, "contract_followed": True, "run_instructions_complete": True,
             "original_work_disclosed": True, "no_integrity_violation": True}


class Api:
    """An httpx client that keeps every response body for the secret search."""

    def __init__(self, base: str):
        self.client = httpx.Client(base_url=base, timeout=60.0)
        self.bodies: list[str] = []

    def call(self, method: str, path: str, *, key: str | None = None, **kwargs) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        r = self.client.request(method, path, headers=headers, **kwargs)
        self.bodies.append(r.text)
        return r

    def post_job(self, key: str, version_id: str, mode: str, run_label: str) -> str:
        """Submit a Textual job (a full one with the whole checklist ticked); asserts 202, returns its id."""
        body = {"version_id": version_id, "mode": mode, "run_label": run_label, "track": "textual"}
        if mode == "full":
            body["checklist"] = CHECKLIST
        r = self.call("POST", "/api/jobs", key=key, json=body)
        assert r.status_code == 202, r.text
        return r.json()["id"]

    def wait_job(self, job_id: str, key: str, timeout: float = 240.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.call("GET", f"/api/jobs/{job_id}", key=key).json()
            if job["status"] in ("completed", "partial", "failed"):
                return job
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} still {job['status']} after {timeout}s: {job}")


@pytest.fixture
def serve_app(ray_session, locomo_file, tmp_path):
    # the suite's locked models (gpt-4o-mini) behind a local OpenAI-compatible server: the offline answerer and
    # judge are never published; the judge calls about half the answers correct, by prompt length
    with served(tmp_path, lambda prompt: 'Short.\n{"label": "%s"}' % ("CORRECT" if len(prompt) % 2 else "WRONG"),
                ready_s=60, dataset_paths={"locomo": locomo_file}, suites={"textual": locomo_only_suite()},
                smoke_limit_samples=1, full_limit_samples=1) as base:
        yield base, tmp_path


def _onboard(api: Api, ref: ReferenceServer, system: str) -> tuple[str, str]:
    body = {"contact_name": "Ada", "contact_email": "ada@example.org", "organization": "Lab",
            "system_name": system, "version_label": "v1", "track": "textual", "division": "open_source",
            "add_url": ref.add_url, "search_url": ref.search_url, "health_url": ref.health_url,
            "auth_scheme": "Bearer", "memory_system_key": MSK, "max_in_flight": 16,
            "repository_url": "https://github.com/example/bm25-memory", "commit": "0123abc",
            "attribution": "BM25 (Robertson et al.); bm25s"}
    r = api.call("POST", "/api/access-requests", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["health"] == "HTTP 200"
    a = api.call("POST", f"/api/admin/access-requests/{r.json()['id']}/approve", key=ADMIN)
    assert a.status_code == 200, a.text
    return a.json()["leaderboard_key"], a.json()["version_id"]


def _ray_logs_dir() -> Path:
    import ray._private.worker as worker

    return Path(worker._global_node.get_session_dir_path()) / "logs"


def test_full_participant_flow_on_serve(serve_app, tmp_path):
    base, state_dir = serve_app
    api = Api(base)
    assert api.call("GET", "/api/leaderboard/textual").json()["rows"] == []
    with ReferenceServer(tmp_path / "reference", auth="Bearer", secret=MSK) as ref:
        key, version_id = _onboard(api, ref, "BM25 reference")
        other_key, _ = _onboard(api, ref, "Someone else")

        smoke = api.call("POST", "/api/jobs", key=key, json={"version_id": version_id, "mode": "smoke",
                                                             "run_label": "smoke-1", "track": "textual"})
        assert smoke.status_code == 202, smoke.text
        done = api.wait_job(smoke.json()["id"], key)
        assert done["status"] == "completed", done
        assert [(s["stage"], s["done"], s["total"]) for s in done["stages"]] == \
            [("add", 28, 28), ("search", 152, 152), ("answer", 152, 152), ("judge", 152, 152)]
        assert done["progress"] == 1.0 and done["error_summary"] is None

        again = api.call("POST", "/api/jobs", key=key, json={"version_id": version_id, "mode": "smoke",
                                                             "run_label": "smoke-2", "track": "textual"})
        assert again.status_code == 429 and "1 per hour" in again.json()["detail"]["reason"]

        full_job = api.wait_job(api.post_job(key, version_id, "full", "full-1"), key)
        assert full_job["status"] == "completed", full_job

    result = api.call("GET", f"/api/results/{full_job['id']}", key=key)
    assert result.status_code == 200
    res = result.json()
    overall_row = next(r for r in res["table"] if r["category"] == "overall")
    assert overall_row["n_total"] == 152 and overall_row["n_excluded"] == 47 and overall_row["coverage"] == 1.0
    assert res["overall"] == pytest.approx(overall_row["accuracy"]) and 0.0 < res["overall"] < 1.0
    assert res["facts"]["datasets"]["locomo"]["questions"] == 199
    failed = {k: v for k, v in res["review"]["gate"]["checks"].items() if not v["ok"]}
    # one LoCoMo sample is not the pinned release: the gate says so, and nothing else fails
    assert res["review"]["status"] == "pending" and set(failed) == SAMPLE_LIMIT_CHECKS, failed
    assert failed["question_counts"]["detail"] == "questions differ from the suite's: locomo: 199 of 1986"
    waive_sample_limit(f"sqlite:///{state_dir / 'aml.sqlite3'}", full_job["id"])
    assert api.call("GET", f"/api/results/{full_job['id']}", key=other_key).status_code == 404
    assert api.call("GET", f"/api/results/{full_job['id']}").status_code == 401
    assert api.call("GET", "/api/leaderboard/textual").json()["rows"] == []  # not before approval

    queue = api.call("GET", "/api/admin/reviews", key=ADMIN).json()
    assert [r["job_id"] for r in queue] == [full_job["id"]]
    approved = api.call("POST", f"/api/admin/reviews/{queue[0]['id']}/approve", key=ADMIN)
    assert approved.status_code == 200, approved.text

    board = api.call("GET", "/api/leaderboard/textual").json()
    assert [(r["rank"], r["system"], r["version"], r["division"]) for r in board["rows"]] == \
        [(1, "BM25 reference", "v1", "open_source")]
    assert board["rows"][0]["overall"] == pytest.approx(res["overall"])
    assert board["rows"][0]["datasets"]["locomo"]["accuracy"] == pytest.approx(overall_row["accuracy"])
    page = api.call("GET", "/leaderboard/textual")
    assert page.status_code == 200 and "BM25 reference" in page.text
    assert f"{res['overall'] * 100:.1f}" in page.text and '<meter min="0" max="1"' in page.text
    assert api.call("GET", "/leaderboard/textual?division=commercial").text.count("BM25 reference") == 0
    actions = [a["action"] for a in api.call("GET", "/api/admin/actions", key=ADMIN).json()]
    assert actions == ["review.approve", "access_request.approve", "access_request.approve"]

    # No plaintext secret anywhere: database file, our logs and run directories, every API response.
    for secret in (MSK, ADMIN):
        needle = secret.encode()
        assert not any(needle in body.encode() for body in api.bodies), "secret in an API response"
        for path in [*state_dir.glob("aml.sqlite3*"), *(state_dir / "runs").rglob("*"),
                     *_ray_logs_dir().rglob("*")]:
            if path.is_file():
                assert needle not in path.read_bytes(), f"secret found in {path}"
