"""The reference BM25 memory system, over real HTTP on loopback (plus a unit test of the index)."""

from __future__ import annotations

import uuid

import httpx
import pytest

from aml_ray.contract import (AddRequest, SearchRequest, validate_add_response,
                              validate_search_response)
from aml_ray.reference import ReferenceServer
from aml_ray.reference.server import ReferenceStartError
from aml_ray.reference.bm25_index import BM25Index, tokenize
from aml_ray.reference.store import Memory

SECRET = "s3cret-value-for-tests"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> ReferenceServer:
    with ReferenceServer(tmp_path_factory.mktemp("reference")) as srv:
        yield srv


@pytest.fixture(scope="module")
def client() -> httpx.Client:
    with httpx.Client(timeout=10.0) as c:
        yield c


def _uid(tag: str = "") -> str:
    return f"eval:test:{tag}:{uuid.uuid4().hex[:8]}"


def add_body(user_id: str, *contents: str, request_id: str | None = None,
             session_id: str = "eval:test:sample:0", timestamp: int | None = 1704067200000) -> dict:
    return {
        "request_id": request_id or f"{user_id}:chunk-{uuid.uuid4().hex[:6]}",
        "messages": [{"role": "user", "content": c, "timestamp": timestamp} for c in contents],
        "user_id": user_id,
        "session_id": session_id,
    }


def do_add(client: httpx.Client, srv: ReferenceServer, body: dict, **kw) -> httpx.Response:
    return client.post(srv.add_url, json=body, headers=srv.auth_headers(), **kw)


def do_search(client: httpx.Client, srv: ReferenceServer, user_id: str, query: str,
              top_k: int = 10) -> list[dict]:
    r = client.post(srv.search_url, json={"query": query, "user_id": user_id, "top_k": top_k},
                    headers=srv.auth_headers())
    assert r.status_code == 200, r.text
    body = r.json()
    validate_search_response(SearchRequest(query=query, user_id=user_id, top_k=top_k), 200, body)
    return body["data"]


def test_health(server, client):
    assert client.get(server.health_url).status_code == 200


def test_add_echoes_ids_byte_for_byte(server, client):
    body = {
        "request_id": "eval:run_ü:locomo:conv-0:chunk-0 — 東京",
        "messages": [{"role": "user", "content": "Caroline went to the pottery class."}],
        "user_id": "eval:run_ü:locomo:conv-0:Ωmega",
        "session_id": "eval:run_ü:locomo:conv-0:session_1:☃",
    }
    r = do_add(client, server, body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got == {"success": True, "request_id": body["request_id"], "user_id": body["user_id"],
                   "session_id": body["session_id"]}
    assert validate_add_response(AddRequest.model_validate(body), 200, got) is None


def test_read_your_write(server, client):
    user = _uid("ryw")
    assert do_add(client, server, add_body(user, "Melanie adopted a golden retriever named Biscuit.",
                                           "We talked about the weather.")).status_code == 200
    data = do_search(client, server, user, "What is the name of Melanie's dog retriever?")
    assert data and "Biscuit" in data[0]["content"]
    assert data[0]["created_at"] == "2024-01-01T00:00:00.000Z"
    assert isinstance(data[0]["score"], float) and data[0]["score"] > 0
    scores = [d["score"] for d in data]
    assert scores == sorted(scores, reverse=True)
    # A later write is searchable at once (index rebuilt after new writes).
    assert do_add(client, server, add_body(user, "Melanie bought a kayak in June.")).status_code == 200
    assert "kayak" in do_search(client, server, user, "kayak purchase")[0]["content"]


def test_isolation_exact_user_id(server, client):
    user = _uid("iso")
    fact = "The secret launch code is zanzibar-quokka."
    assert do_add(client, server, add_body(user, fact)).status_code == 200
    assert do_search(client, server, user, "zanzibar quokka launch code")
    for other in (_uid("iso-other"), user + "x", user + ":1", user.upper(), user[:-1],
                  user.replace("eval", "Eval")):
        for item in do_search(client, server, other, "zanzibar quokka launch code", top_k=100):
            assert "zanzibar" not in item["content"]


def test_top_k_respected(server, client):
    user = _uid("topk")
    facts = [f"apple note number {i}" for i in range(5)]
    assert do_add(client, server, add_body(user, *facts)).status_code == 200
    assert len(do_search(client, server, user, "apple note", top_k=1)) == 1
    assert len(do_search(client, server, user, "apple note", top_k=3)) == 3
    assert len(do_search(client, server, user, "apple note", top_k=100)) == 5


def test_unknown_user_returns_empty_data(server, client):
    r = client.post(server.search_url, json={"query": "anything", "user_id": _uid("never"), "top_k": 5})
    assert r.status_code == 200
    assert r.json() == {"data": []}


def test_idempotent_add_and_conflict(server, client):
    user = _uid("idem")
    body = add_body(user, "Jon opened a dance studio in Boston.", request_id=f"{user}:chunk-0")
    first, second = do_add(client, server, body), do_add(client, server, body)
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json()
    data = do_search(client, server, user, "dance studio Boston", top_k=100)
    assert [d["id"] for d in data] == [f"{user}:chunk-0#0"]
    changed = add_body(user, "Jon opened a bakery instead.", request_id=f"{user}:chunk-0")
    r = do_add(client, server, changed)
    assert r.status_code == 409
    assert "reason" in r.json()["detail"]
    assert not do_search(client, server, user, "bakery")


def test_validation_errors_are_422(server, client):
    body = add_body(_uid("v"), "x")
    body["messages"] = []
    assert do_add(client, server, body).status_code == 422
    r = client.post(server.search_url, json={"query": "q", "user_id": "u", "top_k": 0})
    assert r.status_code == 422


@pytest.mark.parametrize("scheme", ["Bearer", "Token", "X-Api-Key"])
def test_auth(tmp_path, scheme):
    user = _uid("auth")
    with ReferenceServer(tmp_path, auth=scheme, secret=SECRET) as srv, httpx.Client(timeout=10) as c:
        assert c.get(srv.health_url).status_code == 200  # health stays unauthenticated
        body = add_body(user, "Authenticated fact about marmalade.")
        wrong = ({"X-Api-Key": "nope"} if scheme == "X-Api-Key"
                 else {"Authorization": f"{scheme} nope"})
        for headers in ({}, wrong, {"Authorization": f"Basic {SECRET}"}):
            r = c.post(srv.add_url, json=body, headers=headers)
            assert r.status_code == 401
            assert "reason" in r.json()["detail"]
            assert SECRET not in r.text
        search = {"query": "marmalade", "user_id": user, "top_k": 5}
        assert c.post(srv.search_url, json=search).status_code == 401
        assert c.post(srv.add_url, json=body, headers=srv.auth_headers()).status_code == 200
        r = c.post(srv.search_url, json=search, headers=srv.auth_headers())
        assert r.status_code == 200 and r.json()["data"]
    assert SECRET not in (tmp_path / "reference.stderr.log").read_text()


def test_persists_across_restart(tmp_path):
    user = _uid("persist")
    body = add_body(user, "Gina's favourite opera is Tosca.", request_id=f"{user}:chunk-0")
    with ReferenceServer(tmp_path) as srv, httpx.Client(timeout=10) as c:
        assert do_add(c, srv, body).status_code == 200
    with ReferenceServer(tmp_path) as srv, httpx.Client(timeout=10) as c:
        data = do_search(c, srv, user, "favourite opera")
        assert [d["id"] for d in data] == [f"{user}:chunk-0#0"]
        assert do_add(c, srv, body).status_code == 200  # idempotency survives the restart
        assert len(do_search(c, srv, user, "favourite opera")) == 1


def test_startup_failure_is_one_line_naming_the_log_and_keeps_its_tail(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(ReferenceStartError) as info:
        ReferenceServer(tmp_path, db_path=blocker / "db.sqlite3").start()  # the process exits: no wait for the limit
    assert "\n" not in str(info.value) and str(tmp_path / "reference.stderr.log") in str(info.value)
    assert "Traceback" in info.value.stderr_tail


def _mem(i: int, user: str, content: str) -> Memory:
    return Memory(f"r#{i}", user, "s", "r", i, "user", content, None, 0)


def test_index_rebuilds_only_when_dirty():
    rows: dict[str, list[Memory]] = {"a": [_mem(0, "a", "red fox jumps")], "A": [_mem(0, "A", "fox")]}
    loads: list[str] = []

    def load(user_id: str) -> list[Memory]:
        loads.append(user_id)
        return list(rows.get(user_id, []))

    index = BM25Index(load)
    assert [h.memory.content for h in index.search("a", "fox", 5)] == ["red fox jumps"]
    assert index.search("a", "fox", 5) and index.builds == 1  # clean: no rebuild
    rows["a"].append(_mem(1, "a", "blue whale"))
    assert not index.search("a", "whale", 5)  # not marked dirty yet: cached index
    index.mark_dirty("a")
    assert [h.memory.content for h in index.search("a", "whale", 5)] == ["blue whale"]
    assert index.builds == 2
    index.mark_dirty("b")  # another user's write does not rebuild "a"
    index.search("a", "fox", 5)
    assert index.builds == 2 and loads == ["a", "a"]
    assert index.search("nobody", "fox", 5) == []
    assert index.search("a", "the and of", 5) == []  # only stopwords
    assert tokenize("The Fox's 2 dens!") == ["fox", "s", "2", "dens"]
