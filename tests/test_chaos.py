"""The chaos participant: injected faults are survived by the client's retries, and idempotent Adds
never store a message twice."""

from __future__ import annotations

from collections import Counter

import pytest

from aml_ray.actors.participant import ParticipantClient, ParticipantSpec
from aml_ray.contract import AddRequest, ContractError, Message, SearchRequest
from aml_ray.reference.chaos import FaultPlan
from aml_ray.reference.server import ReferenceServer
from aml_ray.retry import RetryPolicy

RETRY = RetryPolicy(max_attempts=10, backoff_base_s=0.02, backoff_max_s=0.2)
FAULTS = "429=0.1,503=0.1,500=0.05,drop=0.1,slow=0.05,commit_timeout=0.1,seed=3,slow_s=1.2,retry_after_s=0.1"


def test_fault_plan_parsing():
    plan = FaultPlan.parse("429=0.1,drop=0.05,seed=4,slow_s=2")
    assert plan.rates == {"429": 0.1, "drop": 0.05} and plan.seed == 4 and plan.slow_s == 2.0
    with pytest.raises(ValueError, match="unknown fault kinds"):
        FaultPlan.parse("teapot=0.1")
    with pytest.raises(ValueError, match="sum to at most 1"):
        FaultPlan.parse("429=0.7,503=0.6")
    with pytest.raises(ValueError, match="KIND=NUMBER"):
        FaultPlan.parse("429")


async def test_client_survives_faults_without_duplicates(tmp_path):
    with ReferenceServer(tmp_path / "chaos", faults=FAULTS) as srv:
        client = ParticipantClient(ParticipantSpec(add_url=srv.add_url, search_url=srv.search_url,
                                                   timeout_s=0.8, retry=RETRY))
        adds = [await client.add(AddRequest(
            request_id=f"eval:r:d:s:chunk-{i}", user_id="eval:r:d:s", session_id="eval:r:d:s:session_1",
            messages=[Message(role="user", content=f"Caroline: fact {i} about painting", timestamp=1000 + i)]))
            for i in range(50)]
        searches = await client.search_many(
            [(SearchRequest(query="painting", user_id="eval:r:d:s", top_k=5), f"q{i}") for i in range(30)])
        await client.aclose()
        stats = srv.stats()
    assert [a["status"] for a in adds] == ["ok"] * 50 and [s["status"] for s in searches] == ["ok"] * 30
    injected = stats["faults_injected"]
    assert sum(injected.values()) > 15  # the drill really injected faults
    # every injected fault was retried: each HTTP fault as its status, exactly; each cut or held reply as a
    # transport error (status 0). A reply the loaded machine delayed past the timeout is retried as well,
    # so the transport errors are at least the faults that make them.
    retried = Counter(status for o in (*adds, *searches) for status in o["retried_statuses"])
    assert {k: retried[int(k)] for k in ("429", "500", "503")} == {k: injected.get(k, 0) for k in ("429", "500", "503")}
    assert retried[0] >= sum(injected.get(k, 0) for k in ("drop", "slow", "commit_timeout"))
    assert set(retried) <= {0, 429, 500, 503}
    assert stats["memories"] == 50 and stats["requests_applied"] == 50 and stats["duplicate_messages"] == 0
    # every write that committed and then timed out was re-sent with its request_id and de-duplicated
    assert stats["duplicate_adds_acknowledged"] >= injected.get("commit_timeout", 0) > 0


async def test_malformed_body_is_a_contract_error(tmp_path):
    with ReferenceServer(tmp_path / "chaos", faults="malformed=1.0") as srv:
        client = ParticipantClient(ParticipantSpec(add_url=srv.add_url, search_url=srv.search_url, retry=RETRY))
        with pytest.raises(ContractError) as info:
            await client.search(SearchRequest(query="q", user_id="u", top_k=5), "q1")
        await client.aclose()
    assert info.value.field == "body"
