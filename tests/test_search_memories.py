"""``search_memories``: the one-pass hot path gives exactly what the full Search checks give.

Every body is decoded twice: by :func:`search_memories` (fast path first) and by ``json.loads`` plus
:func:`validate_search_response` (the statement of the rules). Results, or the error's field, must match.
"""

from __future__ import annotations

import json

import pytest

import aml_ray.contract as contract
from aml_ray.contract import ContractError, SearchRequest, search_memories, validate_search_response

REQUEST = SearchRequest(query="When did Caroline go to the lake?", user_id="u1", top_k=3)

BODIES = [
    b'{"data": []}',
    b'{"data": [{"id": "m1", "content": "Caroline: lake trip", "score": 0.5, "created_at": "2023-05-07"}]}',
    b'{"data": [{"id": "m1", "content": "a", "score": 1}, {"id": "m2", "content": "b", "extra": [1]}]}',
    b'{"data": [{"id": "m1", "content": "a", "created_at": 1683554160000}], "next": null}',
    b'{"data": [{"id": "m1", "content": "a", "created_at": 1.5}]}',
    b'{"data": [{"id": "m1", "content": "a", "created_at": true}]}',  # bool: accepted by the rules as text
    b'{"data": [{"id": "m1", "content": " a ", "score": null}]}',
    b'{"data": [{"id": " ", "content": "a"}]}',
    b'{"data": [{"id": "m1", "content": "\\u001c"}]}',  # blank to Python's str.strip, not to \\s
    b'{"data": [{"id": "m1", "content": "a", "score": true}]}',
    b'{"data": [{"id": "m1", "content": "a", "score": "0.5"}]}',
    b'{"data": [{"id": "m1", "content": "a", "score": NaN}]}',
    b'{"data": [{"id": 7, "content": "a"}]}',
    b'{"data": [{"id": "m1", "content": ["part"]}]}',
    b'{"data": ["m1"]}',
    b'{"data": [{"id": "a", "content": "a"}, {"id": "b", "content": "b"}, {"id": "c", "content": "c"},'
    b' {"id": "d", "content": "d"}]}',
    b'{"items": []}',
    b'[{"id": "m1", "content": "a"}]',
    b'not json',
    b'{"data": [{"id": "m1", "content": "caf\\u00e9 \xe2\x98\x95"}]}',
]


def _full_checks(raw: bytes):
    try:
        body = json.loads(raw)
    except ValueError:
        return ("error", "body")
    try:
        items = validate_search_response(REQUEST, 200, body, request_id="q1")
    except ContractError as exc:
        return ("error", exc.field)
    return ("ok", [{"id": i.id, "content": i.content, "score": i.score, "created_at": i.created_at} for i in items])


@pytest.mark.parametrize("raw", BODIES)
def test_hot_path_matches_the_full_checks(raw: bytes) -> None:
    expected = _full_checks(raw)
    try:
        got = ("ok", search_memories(raw, 200, REQUEST, request_id="q1"))
    except ContractError as exc:
        assert exc.request_id == "q1"
        got = ("error", exc.field)
    assert got == expected


def test_plain_body_never_reaches_the_full_checks(monkeypatch) -> None:
    def refuse(*_a, **_k):
        raise AssertionError("the full checks ran for a plain body")

    monkeypatch.setattr(contract, "validate_search_response", refuse)
    got = search_memories(BODIES[1], 200, REQUEST)
    assert got == [{"id": "m1", "content": "Caroline: lake trip", "score": 0.5, "created_at": "2023-05-07"}]


def test_error_names_field_and_status() -> None:
    with pytest.raises(ContractError) as info:
        search_memories(BODIES[7], 200, REQUEST, request_id="q9")
    assert (info.value.field, info.value.request_id) == ("data[0].id", "q9")
    with pytest.raises(ContractError) as info:
        search_memories(b'{"data": []}', 201, REQUEST)
    assert info.value.field == "status"
    with pytest.raises(ContractError) as info:
        search_memories(BODIES[15], 200, REQUEST)
    assert info.value.field == "data" and "top_k=3" in info.value.reason


def test_not_blank_pattern_is_pythons_isspace_over_every_code_point() -> None:
    """The fast path's blank rule (:data:`aml_ray.contract.NOT_BLANK`, run by pydantic-core's regex engine)
    is the full checks' ``s.strip() != ""`` for every single character, surrogates left out (not valid JSON text)."""
    from pydantic import Field, TypeAdapter
    from typing import Annotated

    one = TypeAdapter(Annotated[str, Field(strict=True, pattern=contract.NOT_BLANK)])
    disagree = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        ch = chr(cp)
        try:
            one.validate_python(ch)
            fast_not_blank = True
        except ValueError:
            fast_not_blank = False
        if fast_not_blank != bool(ch.strip()):
            disagree.append(hex(cp))
    assert disagree == []
    assert sum(chr(cp).isspace() for cp in range(0x110000)) == 29  # the class lists 29 code points


def test_plain_body_defaults_and_numeric_created_at_without_the_full_checks(monkeypatch) -> None:
    monkeypatch.setattr(contract, "validate_search_response", lambda *_a, **_k: pytest.fail("full checks ran"))
    raw = (b'{"data": [{"id": "m1", "content": "a"}, {"id": "m2", "content": " b ", "score": 2, "created_at": 17},'
           b' {"id": "m3", "content": "c", "created_at": 1.5, "extra": {"k": 1}}]}')
    assert search_memories(raw, 200, REQUEST) == [
        {"id": "m1", "content": "a", "score": None, "created_at": None},
        {"id": "m2", "content": " b ", "score": 2.0, "created_at": "17"},
        {"id": "m3", "content": "c", "score": None, "created_at": "1.5"}]
