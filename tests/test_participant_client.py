"""ParticipantClient against a real loopback server that scripts its replies (no Ray needed)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import SecretStr

from aml_ray.actors.participant import ParticipantClient, ParticipantError, ParticipantSpec, request_hash
from aml_ray.contract import AddRequest, ContractError, Message, SearchRequest
from aml_ray.retry import RetryPolicy, parse_retry_after
from tests.servers import ThreadServer

FAST_RETRY = RetryPolicy(max_attempts=4, backoff_base_s=0.01, backoff_max_s=0.05)


class Script:
    """Replies to POST /add and /search from a queue of (status, headers) and records what arrived."""

    def __init__(self) -> None:
        self.replies: deque[tuple[int, dict[str, str]]] = deque()
        self.bodies: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.delay_s = 0.0
        self.gate: threading.Event | None = None  # when set: each request is held until the test opens it
        self.broken_queries: set[str] = set()  # Searches answered with a body that breaks the contract
        self.app = FastAPI()

        async def handle(request: Request, kind: str):
            raw = await request.body()
            self.bodies.append(raw)
            self.headers.append(dict(request.headers))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                if self.gate is not None:
                    await asyncio.to_thread(self.gate.wait, 120)
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
            finally:
                self.in_flight -= 1
            status, headers = self.replies.popleft() if self.replies else (200, {})
            body = await request.json()
            if status != 200:
                return JSONResponse({"detail": {"reason": f"scripted {status}"}}, status_code=status,
                                    headers=headers)
            if kind == "add":
                return {"success": True, "request_id": body["request_id"], "user_id": body["user_id"],
                        "session_id": body["session_id"]}
            if body["query"] in self.broken_queries:
                return {"data": "not a list"}
            return {"data": [{"id": "m1", "content": f"echo {body['query']}", "score": 1.0}]}

        @self.app.post("/add")
        async def add(request: Request):
            return await handle(request, "add")

        @self.app.post("/search")
        async def search(request: Request):
            return await handle(request, "search")


@pytest.fixture
def scripted():
    script = Script()
    with ThreadServer(script.app) as server:
        yield script, server


def spec_for(server, **kw) -> ParticipantSpec:
    kw.setdefault("retry", FAST_RETRY)
    return ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search", **kw)


def add_req(n: int = 0) -> AddRequest:
    return AddRequest(request_id=f"eval:r:locomo:conv-1:chunk-{n}", user_id="eval:r:locomo:conv-1",
                      session_id="eval:r:locomo:conv-1:session_1",
                      messages=[Message(role="user", content=f"Caroline: fact {n} é", timestamp=1683554160000)])


async def test_add_retry_honours_retry_after_and_resends_same_request(scripted):
    script, server = scripted
    script.replies.extend([(429, {"Retry-After": "1"}), (200, {})])
    client = ParticipantClient(spec_for(server))
    t0 = time.perf_counter()
    out = await client.add(add_req())
    waited = time.perf_counter() - t0
    await client.aclose()
    assert out["status"] == "ok" and out["http_status"] == 200
    assert out["attempts"] == 2 and out["retried_statuses"] == [429]
    assert len(script.bodies) == 2 and script.bodies[0] == script.bodies[1]  # same request_id, same bytes
    assert b'"request_id":"eval:r:locomo:conv-1:chunk-0"' in script.bodies[1]
    assert waited >= 0.95, f"Retry-After: 1 was not honoured (waited {waited:.2f} s)"


async def test_add_400_is_not_retried(scripted):
    script, server = scripted
    script.replies.extend([(400, {}), (200, {})])
    client = ParticipantClient(spec_for(server))
    with pytest.raises(ParticipantError) as info:
        await client.add(add_req())
    await client.aclose()
    assert info.value.status == 400 and info.value.stage == "add"
    assert len(script.bodies) == 1


async def test_search_409_is_not_retried_but_add_409_is(scripted):
    script, server = scripted
    client = ParticipantClient(spec_for(server))
    script.replies.extend([(409, {}), (200, {})])
    out = await client.add(add_req())
    assert out["attempts"] == 2 and out["status"] == "ok"
    script.replies.extend([(409, {})])
    with pytest.raises(ParticipantError) as info:
        await client.search(SearchRequest(query="q", user_id="u", top_k=5), "ref-1")
    await client.aclose()
    assert info.value.status == 409 and len(script.bodies) == 3


async def test_transient_errors_exhaust_into_an_error_outcome(scripted):
    script, server = scripted
    script.replies.extend([(503, {})] * 4)
    client = ParticipantClient(spec_for(server))
    out = await client.search(SearchRequest(query="q", user_id="u", top_k=5), "ref-1")
    await client.aclose()
    assert out["status"] == "error" and out["attempts"] == 4
    assert out["retried_statuses"] == [503, 503, 503, 503]
    assert "gave up after 4 attempts: HTTP 503" == out["error"]
    assert out["memories"] == []


async def test_search_table_holds_each_outcome_as_its_question_columns(scripted):
    """search_table: the outcomes of search_batch, one Arrow row each in order (the Ingest stage's columns)."""
    from aml_ray.run.evidence import SEARCH_SCHEMA

    script, server = scripted
    script.replies.extend([(200, {}), (503, {}), (503, {}), (503, {}), (503, {})])
    client = ParticipantClient(spec_for(server, max_in_flight=1))  # one at a time: the scripted order holds
    items = [{"ref": f"ref-{i}", "request": {"query": f"q{i}", "user_id": "u", "top_k": 5}} for i in range(2)]
    table = await client.search_table(items)
    await client.aclose()
    assert table.schema.equals(SEARCH_SCHEMA) and table.num_rows == 2
    ok, failed = table.to_pylist()
    assert ok["search_status"] == "ok" and ok["contract"] == "ok" and ok["search_http_status"] == 200
    assert ok["n_memories"] == 1 and ok["memories"] == [{"id": "m1", "content": "echo q0", "score": 1.0,
                                                         "created_at": None, "parts": None}]
    assert ok["search_latency_ms"] > 0 and len(ok["search_request_sha256"]) == 64 and ok["search_error"] is None
    assert failed["search_status"] == "error" and failed["contract"] is None and failed["n_memories"] == 0
    assert failed["search_attempts"] == 4 and failed["search_retried_statuses"] == [503] * 4
    assert failed["search_error"] == "gave up after 4 attempts: HTTP 503"


async def test_timeout_is_transient_and_retried(scripted):
    script, server = scripted
    script.delay_s = 0.5
    client = ParticipantClient(spec_for(server, timeout_s=0.1, retry=RetryPolicy(max_attempts=2, backoff_base_s=0.01)))
    out = await client.add(add_req())
    await client.aclose()
    assert out["status"] == "error" and out["attempts"] == 2 and out["retried_statuses"] == [0, 0]
    assert "Timeout" in out["error"]


async def test_auth_header_sent_and_secret_never_in_errors(scripted):
    script, server = scripted
    secret = "s3cr3t-memory-key"
    script.replies.extend([(403, {})])
    client = ParticipantClient(spec_for(server, auth="Bearer", secret=SecretStr(secret)))
    with pytest.raises(ParticipantError) as info:
        await client.add(add_req())
    await client.aclose()
    assert script.headers[0]["authorization"] == f"Bearer {secret}"
    assert secret not in str(info.value) and secret not in repr(client.spec)


async def test_x_api_key_and_token_schemes():
    assert ParticipantSpec(add_url="http://h/a", search_url="http://h/s", auth="X-Api-Key",
                           secret=SecretStr("k")).auth_headers() == {"X-Api-Key": "k"}
    assert ParticipantSpec(add_url="http://h/a", search_url="http://h/s", auth="Token",
                           secret=SecretStr("k")).auth_headers() == {"Authorization": "Token k"}
    with pytest.raises(ValueError, match="needs a secret"):
        ParticipantSpec(add_url="http://h/a", search_url="http://h/s", auth="Bearer")


async def test_contract_error_on_wrong_echo_is_raised_not_retried():
    app = FastAPI()
    calls = []

    @app.post("/add")
    async def add(request: Request):
        body = await request.json()
        calls.append(body["request_id"])
        return {"success": True, "request_id": body["request_id"] + "x", "user_id": body["user_id"],
                "session_id": body["session_id"]}

    with ThreadServer(app) as server:
        client = ParticipantClient(spec_for(server))
        with pytest.raises(ContractError) as info:
            await client.add(add_req())
        await client.aclose()
    assert info.value.field == "request_id" and len(calls) == 1


async def test_max_in_flight_and_rate_limit_hold(scripted):
    script, server = scripted
    script.delay_s = 0.05
    # the declared limit alone: the adaptive limit (tested apart) may hold fewer on a loaded machine
    client = ParticipantClient(spec_for(server, max_in_flight=4, adaptive_concurrency=False))
    reqs = [(SearchRequest(query=f"q{i}", user_id="u", top_k=5), f"ref-{i}") for i in range(24)]
    outs = await client.search_many(reqs)
    assert [o["memories"][0]["content"] for o in outs] == [f"echo q{i}" for i in range(24)]  # input order
    assert script.max_in_flight == 4
    await client.aclose()

    limited = ParticipantClient(spec_for(server, requests_per_s=20))
    script.delay_s = 0.0
    t0 = time.perf_counter()
    await limited.search_many(reqs)
    elapsed = time.perf_counter() - t0
    await limited.aclose()
    assert elapsed >= 0.9, f"24 requests at 20/s took {elapsed:.2f} s"


async def queued_behind_one_slot(script: Script, server, n: int = 6) -> tuple[ParticipantClient, asyncio.Task]:
    """A one-slot client with a batch of ``n`` Searches started: ``q0`` in flight (it reached the server, which
    holds it until the test calls ``script.gate.set()``), the rest queued. It waits for ``q0``'s arrival, and the
    server holds q0 for as long as the test needs: with a fixed hold (200 ms), a loaded machine let q0's reply
    come back before the test had queued its next request."""
    script.gate = threading.Event()
    client = ParticipantClient(spec_for(server, max_in_flight=1))
    reqs = [(SearchRequest(query=f"q{i}", user_id="u", top_k=5), f"ref-{i}") for i in range(n)]
    batch = asyncio.create_task(client.search_many(reqs))
    deadline = time.monotonic() + 120  # only a guard
    while not script.bodies and time.monotonic() < deadline:
        await asyncio.sleep(0.002)
    assert script.bodies, "q0 did not reach the server in 120 s"
    return client, batch


async def test_an_add_is_sent_before_searches_already_queued(scripted):
    """A sample's Adds gate its Searches: behind one slot and 6 queued Searches, a later Add goes next."""
    script, server = scripted
    client, searches = await queued_behind_one_slot(script, server)
    add = asyncio.create_task(client.add(add_req(7)))
    await asyncio.sleep(0)  # the Add's first step runs: it is queued behind q0 with q1..q5
    script.gate.set()
    out = await add
    await searches
    await client.aclose()
    sent = [b.decode() for b in script.bodies]
    assert out["status"] == "ok" and script.max_in_flight == 1
    assert '"q0"' in sent[0] and "chunk-7" in sent[1]
    assert ['"q1"' in b for b in sent[2:]] == [True, False, False, False, False]


async def test_aclose_stops_the_senders_and_a_new_call_starts_them_again(scripted):
    script, server = scripted
    client = ParticipantClient(spec_for(server, max_in_flight=3))
    first = await client.search(SearchRequest(query="a", user_id="u", top_k=5), "ref-a")
    senders = list(client._senders)
    await client.aclose()
    assert len(senders) == 3 and all(t.done() for t in senders) and client._senders == []
    again = await client.search(SearchRequest(query="b", user_id="u", top_k=5), "ref-b")
    await client.aclose()
    assert (first["status"], again["status"]) == ("ok", "ok")
    assert again["memories"][0]["content"] == "echo b"


async def test_a_search_retried_in_a_batch_keeps_its_place_and_its_evidence(scripted):
    """A Search whose first reply is a 503 is retried (same bytes) while the batch's others go on."""
    script, server = scripted
    script.replies.extend([(200, {}), (503, {"Retry-After": "0"})])
    client = ParticipantClient(spec_for(server, max_in_flight=1))
    reqs = [(SearchRequest(query=f"q{i}", user_id="u", top_k=5), f"ref-{i}") for i in range(3)]
    outs = await client.search_many(reqs)
    await client.aclose()
    assert [o["memories"][0]["content"] for o in outs] == ["echo q0", "echo q1", "echo q2"]
    assert [(o["attempts"], o["retried_statuses"], o["http_status"]) for o in outs] == [
        (1, [], 200), (2, [503], 200), (1, [], 200)]
    sent = [b.decode() for b in script.bodies]
    assert ['"q1"' in b for b in sent] == [False, True, False, True]  # the retry went after q2, byte for byte
    assert sent[1] == sent[3] and outs[1]["request_sha256"] == request_hash(script.bodies[3])
    assert all(o["request_id"] == f"ref-{i}" and o["elapsed_ms"] >= o["latency_ms"] > 0 for i, o in enumerate(outs))


async def test_a_contract_error_stops_the_batch_before_its_queued_searches_are_sent(scripted):
    script, server = scripted
    script.delay_s = 0.02
    script.broken_queries.add("bad")
    client = ParticipantClient(spec_for(server, max_in_flight=1))
    reqs = [(SearchRequest(query=q, user_id="u", top_k=5), f"ref-{q}") for q in ["a", "bad", "c", "d", "e"]]
    with pytest.raises(ContractError) as info:
        await client.search_many(reqs)
    await asyncio.sleep(0.1)
    after = await client.search(SearchRequest(query="z", user_id="u", top_k=5), "ref-z")  # the client still works
    await client.aclose()
    queries = [json.loads(b)["query"] for b in script.bodies]
    assert info.value.request_id == "ref-bad" and info.value.field.startswith("data")
    # the sender sends its next attempt ("c") before the reply is checked; nothing after that is sent
    assert queries == ["a", "bad", "c", "z"] and after["memories"][0]["content"] == "echo z"


async def test_a_cancelled_batch_never_sends_its_queued_searches(scripted):
    script, server = scripted
    client, batch = await queued_behind_one_slot(script, server)
    batch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await batch
    script.gate.set()  # q0's reply comes: a queued Search would be sent next
    await asyncio.sleep(0.3)
    assert len(script.bodies) == 1
    later = await client.search(SearchRequest(query="later", user_id="u", top_k=5), "ref-later")
    await client.aclose()
    assert later["memories"][0]["content"] == "echo later" and len(script.bodies) == 2


def test_parse_retry_after():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert parse_retry_after("-1") is None
    assert abs(parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) - 10.0) < 1e-6


async def test_an_acknowledged_add_is_not_sent_twice(scripted):
    script, server = scripted
    client = ParticipantClient(spec_for(server))
    first = await client.add(add_req(3))
    again = await client.add(add_req(3))  # e.g. a stage re-executed after its worker node died
    changed = AddRequest(request_id=add_req(3).request_id, user_id="eval:r:locomo:conv-1",
                         session_id="eval:r:locomo:conv-1:session_1",
                         messages=[Message(role="user", content="other text")])
    third = await client.add(changed)  # same id, other body: sent (the participant decides: 409)
    await client.aclose()
    assert again == first and len(script.bodies) == 2
    assert third["request_sha256"] != first["request_sha256"]


# Issue 24, item 9: the request that stops a run carries its outcome, so the stage can write its evidence row.
KEY = "sk-memory-key-0123456789abcdef"


async def _two_adds(client: ParticipantClient) -> None:
    """Send the first two Adds of user conv-1: the first is answered correctly, the second raises."""
    first = await client.add(add_req(0))
    assert first["status"] == "ok"
    await client.add(add_req(1))


@pytest.mark.parametrize("mode,field", [("wrong_echo_second_add", "request_id"),
                                        ("success_false_second_add", "success")])
async def test_an_add_contract_error_carries_its_outcome_without_the_key(mode, field):
    import pickle

    from tests.bad_participants import BadParticipant

    with BadParticipant(mode, auth="Bearer", secret=KEY) as bad:
        client = ParticipantClient(bad.spec(retry=FAST_RETRY))
        with pytest.raises(ContractError) as info:
            await _two_adds(client)
        await client.aclose()
        sent = bad._server.app.state.add_bodies[add_req(1).request_id]
    err = info.value
    rid = add_req(1).request_id
    assert (err.field, err.request_id) == (field, rid)
    outcome = err.outcome
    assert {k: outcome[k] for k in ("request_id", "status", "http_status", "attempts", "retried_statuses")} == {
        "request_id": rid, "status": "contract_error", "http_status": 200, "attempts": 1, "retried_statuses": []}
    assert outcome["request_sha256"] == request_hash(sent)
    assert outcome["elapsed_ms"] >= outcome["latency_ms"] > 0
    assert outcome["contract"] == f"{field}: {err.reason}" and outcome["error"] == str(err)
    assert KEY not in str(err) and KEY not in json.dumps(outcome)
    if field == "request_id":  # the participant echoed the key: redacted before it left the client
        assert f"got '{rid}-***'" in err.reason
    back = pickle.loads(pickle.dumps(err))  # crosses Ray's actor boundary as a pickle
    assert (back.field, back.request_id, back.outcome) == (field, rid, outcome)


async def test_a_status_that_is_not_retried_carries_its_outcome_without_the_key():
    import pickle

    from tests.bad_participants import BadParticipant

    with BadParticipant("forbid_second_add", auth="Bearer", secret=KEY) as bad:
        client = ParticipantClient(bad.spec(retry=FAST_RETRY))
        with pytest.raises(ParticipantError) as info:
            await _two_adds(client)
        await client.aclose()
        sent = bad._server.app.state.add_bodies[add_req(1).request_id]
    err, rid = info.value, add_req(1).request_id
    outcome = err.outcome
    assert (err.status, err.request_id) == (403, rid)
    assert {k: outcome[k] for k in ("request_id", "status", "http_status", "attempts", "contract")} == {
        "request_id": rid, "status": "error", "http_status": 403, "attempts": 1, "contract": None}
    assert outcome["request_sha256"] == request_hash(sent) and outcome["latency_ms"] > 0
    assert "HTTP 403 is not retried" in outcome["error"] and "forbidden for key ***" in outcome["error"]
    assert KEY not in json.dumps(outcome)
    assert pickle.loads(pickle.dumps(err)).outcome == outcome


async def test_a_status_that_is_not_retried_after_a_retry_counts_both_attempts(scripted):
    script, server = scripted
    script.replies.extend([(503, {"Retry-After": "0"}), (404, {})])
    client = ParticipantClient(spec_for(server))
    with pytest.raises(ParticipantError) as info:
        await client.add(add_req())
    await client.aclose()
    outcome = info.value.outcome
    assert (outcome["attempts"], outcome["retried_statuses"], outcome["http_status"], outcome["status"]) == (
        2, [503], 404, "error")
    assert outcome["request_sha256"] == request_hash(script.bodies[1])


async def test_a_search_over_top_k_names_its_question_and_carries_its_outcome():
    from tests.bad_participants import BadParticipant

    with BadParticipant("overflow_one_search", auth="Bearer", secret=KEY) as bad:
        client = ParticipantClient(bad.spec(retry=FAST_RETRY))
        await client.add(add_req(0))
        await client.add(add_req(1))
        ref = "eval:r:locomo:conv-1:q-7"
        with pytest.raises(ContractError) as info:
            await client.search(SearchRequest(query="Caroline fact", user_id="eval:r:locomo:conv-1", top_k=1), ref)
        await client.aclose()
        sent = bad._server.app.state.overflowed
    err = info.value
    assert (err.field, err.request_id) == ("data", ref)
    assert f"question {ref}" in str(err) and "user_id 'eval:r:locomo:conv-1'" in str(err)
    assert "returned 2 items for top_k=1" in str(err)
    outcome = err.outcome
    assert (outcome["request_id"], outcome["status"], outcome["http_status"], outcome["attempts"]) == (
        ref, "contract_error", 200, 1)
    assert outcome["request_sha256"] == request_hash(sent) and outcome["latency_ms"] > 0
    assert outcome["contract"] == f"data: {err.reason}"


async def test_a_search_contract_error_after_a_retry_carries_both_attempts(scripted):
    script, server = scripted
    script.replies.extend([(503, {"Retry-After": "0"})])
    script.broken_queries.add("bad")
    client = ParticipantClient(spec_for(server))
    with pytest.raises(ContractError) as info:
        await client.search_many([(SearchRequest(query="bad", user_id="u", top_k=5), "ref-bad")])
    await client.aclose()
    outcome = info.value.outcome
    assert (outcome["request_id"], outcome["attempts"], outcome["retried_statuses"], outcome["http_status"]) == (
        "ref-bad", 2, [503], 200)
    assert outcome["status"] == "contract_error" and outcome["contract"].startswith("data: must be an array")
