"""Schemathesis against the app's own OpenAPI: no request, valid or not, gets a 5xx.

Every operation of ``/openapi.json`` is called through the ASGI app (no socket) with cases that
schemathesis generates from the schema, positive and negative, under three kinds of credentials: what
schemathesis generates for the ``Authorization`` header, a valid participant key with real ids in the
path, and the admin token with real ids. Bounded: a few examples per operation and kind, no shrinking,
no example database, so the whole run stays well under a minute.

Nothing leaves the process: the health check and the job worker are off and host names resolve through
a stub (to a public address that is never contacted), so generated URLs are validated but never called.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import hypothesis
import pytest
import schemathesis
from schemathesis.core.failures import FailureGroup
from cryptography.fernet import Fernet
from hypothesis import HealthCheck, Phase, settings
from pydantic import SecretStr

from aml_ray.serve_app.app import create_app
from aml_ray.serve_app.settings import ServiceSettings
from aml_ray.store.access import create_access_request
from aml_ray.store.jobs import create_job, mark_completed
from aml_ray.store.results import open_review, save_result
from aml_ray.store.synthetic import FULL_CHECKLIST, SyntheticEntry, access_request_fields, approved_key, \
    job_in_progress, publish

ADMIN = "admin-token-schemathesis-5f4e3d2c1b"
#: Examples per operation, credential kind and generation mode.
MAX_EXAMPLES = 6
MODES = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)


@dataclass
class Seeded:
    """Real ids the cases can aim at."""

    key: str
    job_id: str
    request_id: str
    review_id: str


def _public_stub_resolver(host: str, port: int) -> list[str]:
    """Every name resolves to one public address, never contacted (health check and worker are off)."""
    return ["93.184.215.14"]


@pytest.fixture(scope="module")
def app_and_ids(tmp_path_factory) -> Iterator[tuple[object, Seeded]]:
    tmp = tmp_path_factory.mktemp("schemathesis")
    settings_ = ServiceSettings(database_url=f"sqlite:///{tmp / 'aml.sqlite3'}",
                                master_keys=[SecretStr(Fernet.generate_key().decode())],
                                admin_token=SecretStr(ADMIN), run_worker=False, health_check=False,
                                allow_loopback=False, runs_dir=tmp / "runs")
    app = create_app(settings_)
    service = app.state.service
    with service.sessions.begin() as s:
        publish(s, SyntheticEntry("Board Row", "Lab", "open_source", {"locomo": 0.5}))
        key, job = job_in_progress(s)
        _k, key_id, version = approved_key(s, system="Under Review")
        smoke = create_job(s, key_id=key_id, version=version, mode="smoke", run_label="s", edition="e")
        mark_completed(s, smoke)
        full = create_job(s, key_id=key_id, version=version, mode="full", run_label="f", edition="e",
                          checklist=FULL_CHECKLIST)
        mark_completed(s, full)
        save_result(s, full, [{"dataset": "locomo", "category": "overall", "accuracy": 0.4, "coverage": 1.0,
                               "f1": 0.2, "n_total": 10, "n_scored": 10}], {"synthetic": True})
        review = open_review(s, full, {"passed": False, "checks": {"pipeline_code_hash": {"ok": False}}})
        request = create_access_request(s, access_request_fields("Pending"))
        ids = Seeded(key=key, job_id=job.id, request_id=request.id, review_id=review.id)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("aml_ray.security.system_resolver", _public_stub_resolver)
        yield app, ids
    service.engine.dispose()


def _credential_kinds(operation, ids: Seeded) -> list[tuple[str, dict, dict]]:
    """(name, headers, path parameters) for each kind of caller the operation is tried with."""
    names = {p.name for p in operation.path_parameters}
    real = {"job_id": ids.job_id, "request_id": ids.request_id, "review_id": ids.review_id}
    path = {k: v for k, v in real.items() if k in names}
    kinds = [("generated", {}, {})]
    if operation.path.startswith("/api/admin"):
        kinds.append(("admin", {"Authorization": f"Bearer {ADMIN}"}, path))
    else:
        kinds.append(("participant", {"Authorization": f"Bearer {ids.key}"}, path))
    return kinds


#: What ``conformance`` checks: the status code is documented, the body follows the documented schema, and the
#: content type is the documented one.
CONFORMANCE = [schemathesis.checks.status_code_conformance, schemathesis.checks.response_schema_conformance,
               schemathesis.checks.content_type_conformance]


def _explore(strategy, label: str, failures: list[str], calls: dict[int, int], conformance: bool = False) -> None:
    """Call the app with ``MAX_EXAMPLES`` cases from ``strategy``; record 5xx and unhandled errors, and with
    ``conformance`` every answer that the OpenAPI description does not describe."""

    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @hypothesis.given(case=strategy)
    def call(case) -> None:
        try:
            response = case.call()
        except Exception as exc:  # the ASGI test client re-raises what the app did not handle
            failures.append(f"{label}: unhandled {type(exc).__name__}: {exc}\n  {case.as_curl_command()}")
            return
        calls[response.status_code] = calls.get(response.status_code, 0) + 1
        if conformance:
            try:
                case.validate_response(response, checks=CONFORMANCE)
            except FailureGroup as exc:  # one sub-exception per failed check
                problems = "; ".join(getattr(e, "title", type(e).__name__) for e in exc.exceptions)
                failures.append(f"{label}: HTTP {response.status_code}: {problems}")
        if response.status_code >= 500:
            failures.append(f"{label}: HTTP {response.status_code}\n  {case.as_curl_command()}\n  "
                            f"{response.text[:300]}")

    try:
        call()
    except hypothesis.errors.Unsatisfiable:
        pass  # negative mode with nothing left to make invalid (every parameter was fixed above)


def test_no_operation_answers_5xx(app_and_ids):
    app, ids = app_and_ids
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    failures: list[str] = []
    calls: dict[int, int] = {}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 17, [op.label for op in operations]
    t0 = time.monotonic()
    for operation in operations:
        for kind, headers, path in _credential_kinds(operation, ids):
            for mode in MODES:
                strategy = operation.as_strategy(generation_mode=mode, headers=headers or None,
                                                 path_parameters=path or None)
                label = f"{operation.label} [{kind}, {mode.value}]"
                _explore(strategy, label, failures, calls)
    elapsed = time.monotonic() - t0
    print(f"schemathesis: {sum(calls.values())} calls over {len(operations)} operations in {elapsed:.1f} s, "
          f"status counts {dict(sorted(calls.items()))}")
    assert not failures, "5xx or unhandled errors:\n" + "\n".join(failures[:20])
    assert sum(calls.values()) >= len(operations) * 2 * MAX_EXAMPLES  # the generation did run
    assert any(200 <= s < 300 for s in calls) and 401 in calls and 422 in calls


def test_every_answer_matches_the_openapi_description(app_and_ids):
    app, ids = app_and_ids
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    failures: list[str] = []
    calls: dict[int, int] = {}
    for operation in [result.ok() for result in schema.get_all_operations()]:
        for kind, headers, path in _credential_kinds(operation, ids):
            for mode in MODES:
                strategy = operation.as_strategy(generation_mode=mode, headers=headers or None,
                                                 path_parameters=path or None)
                _explore(strategy, f"{operation.label} [{kind}, {mode.value}]", failures, calls, conformance=True)
    assert not failures, f"{len(failures)} answers differ from the OpenAPI description:\n" + "\n".join(sorted(set(failures))[:40])
    assert {401, 404, 422} <= set(calls)


def test_405_names_every_method_of_the_path(app_and_ids):
    from fastapi.testclient import TestClient

    app, _ids = app_and_ids
    with TestClient(app) as client:
        r = client.delete("/api/jobs")
        assert r.status_code == 405
        assert set(r.headers["Allow"].replace(" ", "").split(",")) == {"GET", "POST"}
        assert r.json() == {"detail": {"reason": "method DELETE not allowed; allowed: GET, POST"}}
        r = client.put("/api/access-requests")
        assert r.status_code == 405 and r.headers["Allow"] == "POST"
