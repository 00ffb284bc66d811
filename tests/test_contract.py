"""The contract validator, one test per rule of the seed's Add/Search contract."""

from __future__ import annotations

import pickle

import pytest
from pydantic import ValidationError

from aml_ray.contract import (
    AddRequest,
    ContractError,
    Message,
    SearchRequest,
    validate_add_response,
    validate_search_response,
)

RID = "eval:run_1:locomo:conv-26:chunk-0"
UID = "eval:run_1:locomo:conv-26"
SID = "eval:run_1:locomo:conv-26:session_1"


@pytest.fixture
def add_request() -> AddRequest:
    return AddRequest(request_id=RID, user_id=UID, session_id=SID,
                      messages=[Message(role="user", content="Caroline: hi", timestamp=1683554160000)])


def ok_add_body(**override):
    body = {"success": True, "request_id": RID, "user_id": UID, "session_id": SID}
    body.update(override)
    return body


def test_valid_add_response_passes(add_request):
    assert validate_add_response(add_request, 200, ok_add_body()) is None


@pytest.mark.parametrize("value", ["true", 1, None, False])
def test_success_must_be_boolean_true(add_request, value):
    with pytest.raises(ContractError) as info:
        validate_add_response(add_request, 200, ok_add_body(success=value))
    assert info.value.field == "success"


@pytest.mark.parametrize("field", ["request_id", "user_id", "session_id"])
@pytest.mark.parametrize("bad", [lambda v: v + " ", lambda v: v.upper(), lambda v: None, lambda v: v[:-1]])
def test_ids_echoed_byte_for_byte(add_request, field, bad):
    body = ok_add_body()
    body[field] = bad(body[field])
    with pytest.raises(ContractError) as info:
        validate_add_response(add_request, 200, body)
    assert info.value.field == field
    assert info.value.request_id == RID


def test_unicode_ids_compare_exactly():
    rid = "eval:run_1:locomo:conv-é:chunk-0"
    req = AddRequest(request_id=rid, user_id=UID, session_id=SID, messages=[Message(role="user", content="x")])
    assert validate_add_response(req, 200, {"success": True, "request_id": rid, "user_id": UID,
                                            "session_id": SID}) is None
    decomposed = "eval:run_1:locomo:conv-e\u0301:chunk-0"  # same glyph, other bytes
    with pytest.raises(ContractError, match="request_id"):
        validate_add_response(req, 200, {"success": True, "request_id": decomposed, "user_id": UID,
                                         "session_id": SID})


def test_add_body_must_be_object(add_request):
    with pytest.raises(ContractError) as info:
        validate_add_response(add_request, 200, [ok_add_body()])
    assert info.value.field == "body"


def test_202_without_bound_status_url_is_contract_error(add_request):
    with pytest.raises(ContractError) as info:
        validate_add_response(add_request, 202, {"task_id": "t1"})
    assert info.value.field == "status"


def test_202_with_bound_status_url_returns_task_id(add_request):
    assert validate_add_response(add_request, 202, {"task_id": "t1"},
                                 add_status_url="https://m.example/status/{task_id}") == "t1"
    with pytest.raises(ContractError) as info:
        validate_add_response(add_request, 202, {}, add_status_url="https://m.example/status/{task_id}")
    assert info.value.field == "task_id"


def test_add_request_rejects_empty_content_and_messages():
    with pytest.raises(ValidationError, match="content"):
        Message(role="user", content="")
    with pytest.raises(ValidationError, match="messages"):
        AddRequest(request_id=RID, user_id=UID, session_id=SID, messages=[])


SEARCH = SearchRequest(query="Where did Caroline go?", user_id=UID, top_k=3)


def item(i: int, **kw):
    return {"id": f"m{i}", "content": f"memory {i}", **kw}


def test_valid_search_keeps_participant_order_and_declared_fields():
    body = {"data": [item(2, score=0.9, created_at="2023-05-08T13:56:00Z", metadata={"x": 1}), item(1)]}
    items = validate_search_response(SEARCH, 200, body)
    assert [i.id for i in items] == ["m2", "m1"]
    assert items[0].score == 0.9 and items[0].created_at == "2023-05-08T13:56:00Z"
    assert not hasattr(items[0], "metadata")


def test_empty_data_is_valid():
    assert validate_search_response(SEARCH, 200, {"data": []}) == []


def test_more_than_top_k_is_contract_error_not_truncated():
    with pytest.raises(ContractError) as info:
        validate_search_response(SEARCH, 200, {"data": [item(i) for i in range(4)]})
    assert info.value.field == "data"
    assert "4 items for top_k=3" in info.value.reason


def test_more_than_top_k_names_the_question_its_user_id_and_the_counts():
    """Issue 24, item 9: the overflow error says which question, whose memory and how many items."""
    ref = "eval:run_1:locomo:conv-26:q-conv-26_q12"
    with pytest.raises(ContractError) as info:
        validate_search_response(SEARCH, 200, {"data": [item(i) for i in range(5)]}, request_id=ref)
    assert info.value.reason == (f"question {ref} of user_id {UID!r} returned 5 items for top_k=3 (5 > 3); "
                                 "excess items are a contract error and are not truncated")
    assert str(info.value).startswith(f"contract violation in field 'data' (request {ref}): question {ref}")


@pytest.mark.parametrize("body", [{"items": []}, [], {"data": {"0": item(0)}}, {"data": None}])
def test_data_must_be_an_array(body):
    with pytest.raises(ContractError) as info:
        validate_search_response(SEARCH, 200, body)
    assert info.value.field == "data"


@pytest.mark.parametrize("field,value", [("id", ""), ("id", None), ("id", 7), ("content", ""),
                                         ("content", "   "), ("content", None)])
def test_items_need_non_empty_string_id_and_content(field, value):
    bad = item(0)
    bad[field] = value
    with pytest.raises(ContractError) as info:
        validate_search_response(SEARCH, 200, {"data": [item(1), bad]})
    assert info.value.field == f"data[1].{field}"


@pytest.mark.parametrize("score", ["0.5", True, float("nan")])
def test_score_must_be_a_finite_number(score):
    with pytest.raises(ContractError) as info:
        validate_search_response(SEARCH, 200, {"data": [item(0, score=score)]})
    assert info.value.field == "data[0].score"


def test_search_body_omits_options_for_open_questions():
    assert "options" not in SEARCH.to_body()
    mc = SearchRequest(query="q", options=["A. x", "B. y"], user_id=UID, top_k=100)
    assert mc.to_body()["options"] == ["A. x", "B. y"]


def test_contract_error_survives_pickling():
    err = ContractError("data[3].content", "must be a non-empty string", RID)
    back = pickle.loads(pickle.dumps(err))
    assert (back.field, back.reason, back.request_id) == ("data[3].content", "must be a non-empty string", RID)
    assert "data[3].content" in str(back)


def test_contract_error_keeps_its_outcome_through_pickling():
    """The outcome (for the evidence row of the request that stopped the run) crosses Ray's actor boundary."""
    outcome = {"request_id": RID, "status": "contract_error", "http_status": 200, "attempts": 1,
               "contract": "success: must be the boolean true, got False"}
    err = ContractError("success", "must be the boolean true, got False", RID, outcome=outcome)
    back = pickle.loads(pickle.dumps(err))
    assert (back.field, back.request_id, back.outcome) == ("success", RID, outcome)
    assert ContractError("data", "x").outcome is None
