"""A job's stages in the seed's words (ingestion, retrieval, answering, scoring, aggregation), in the API and
on the participant's job page."""

from __future__ import annotations

from fastapi.testclient import TestClient

from aml_ray.serve_app.app import create_app
from aml_ray.store.synthetic import job_in_progress
from tests.service_db import settings_on
from tests.test_service_api import ADMIN, bearer


def test_stages_read_in_the_seeds_words(tmp_path):
    with settings_on("sqlite", tmp_path, ADMIN) as settings:
        app = create_app(settings)
        with app.state.service.sessions.begin() as s:
            key, job = job_in_progress(s, done={"add": 28, "search": 61, "answer": 40, "judge": 12})
            job_id = job.id
        with TestClient(app) as client:
            api = client.get(f"/api/jobs/{job_id}", headers=bearer(key)).json()
            client.post("/evaluate/key", data={"key": key})
            page = client.get(f"/evaluate/jobs/{job_id}").text
        app.state.service.engine.dispose()
    assert [(s["stage"], s["label"]) for s in api["stages"]] == [
        ("add", "ingestion"), ("search", "retrieval"), ("answer", "answering"), ("judge", "scoring")]
    assert (api["stage"], api["stage_label"]) == ("search", "retrieval")
    assert "stage: retrieval" in page
    for word in ("ingestion", "retrieval", "answering", "scoring"):
        assert f"<td>{word}</td>" in page
    assert '<tr data-stage="aggregate"><td>aggregation</td><td class="num">0 / 1</td>' in page
