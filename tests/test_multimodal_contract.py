"""Content parts in the contract: strict checks naming the part, Textual refusing parts, media by hash."""

from __future__ import annotations

import base64

import pytest
from pydantic import ValidationError

from aml_ray.models.context import fit_context
from aml_ray.contract import AddRequest, ContractError, Message, SearchRequest, validate_search_response
from aml_ray.media import MediaLimits, MediaStore, media_context, openai_image_tokens, render_parts
from tests.mm_fixtures import png, png_url

LIMITS = MediaLimits(max_image_bytes=2000, max_request_bytes=3000)
CTX = media_context(LIMITS)
REQ = SearchRequest(query="q", user_id="u", top_k=5)


def search_body(content) -> dict:
    return {"data": [{"id": "m0", "content": "plain"}, {"id": "m1", "content": content}]}


@pytest.mark.parametrize("content,field,reason", [
    ([{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}],
     "data[1].content[1].image_url.url", "not valid base64"),
    ([{"type": "audio", "audio": "x"}], "data[1].content[0].type", "unknown part type"),
    ([], "data[1].content", "non-empty"),
    ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                         + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"0" * 3000).decode()}}],
     "data[1].content[0].image_url.url", "per-image limit"),
    ([{"type": "text", "text": "  "}], "data[1].content[0].text", "non-empty"),
    ([{"type": "image_url", "image_url": {"url": "data:image/bmp;base64,AAAA"}}],
     "data[1].content[0].image_url.url", "not allowed"),
    ([{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + base64.b64encode(png()).decode()}}],
     "data[1].content[0].image_url.url", "not a jpeg"),
    ([{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}],
     "data[1].content[0].image_url.url", "data URL"),
])
def test_bad_parts_in_search_response_name_the_part(content, field, reason):
    with pytest.raises(ContractError) as exc:
        validate_search_response(REQ, 200, search_body(content), request_id="r", media=LIMITS)
    assert exc.value.field == field and reason in exc.value.reason


def test_search_response_images_over_the_request_limit():
    big = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                              + base64.b64encode(png() + b"\0" * 1800).decode()}}]
    body = {"data": [{"id": "a", "content": big}, {"id": "b", "content": big}]}
    with pytest.raises(ContractError, match="per-request limit") as exc:
        validate_search_response(REQ, 200, body, media=LIMITS)
    assert exc.value.field == "data[1].content"


def test_textual_refuses_parts_in_requests_and_responses():
    parts = [{"type": "text", "text": "hi"}]
    with pytest.raises(ContractError, match="only in the Multimodal track") as exc:
        validate_search_response(REQ, 200, search_body(parts))
    assert exc.value.field == "data[1].content"
    with pytest.raises(ValidationError, match="content: content parts"):
        Message(role="user", content=parts)
    with pytest.raises(ValidationError, match="query: content parts"):
        SearchRequest(query=parts, user_id="u", top_k=1)
    with pytest.raises(ValidationError, match="Multimodal"):
        AddRequest.model_validate({"request_id": "r", "user_id": "u", "session_id": "s",
                                   "messages": [{"role": "user", "content": parts}]})


def test_multimodal_add_request_accepts_parts_and_names_bad_ones():
    good = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": png_url()}}]
    body = {"request_id": "r", "user_id": "u", "session_id": "s", "messages": [{"role": "user", "content": good}]}
    req = AddRequest.model_validate(body, context=CTX)
    assert req.model_dump(exclude_none=True)["messages"][0]["content"] == good  # order and bytes kept
    bad = {**body, "messages": [{"role": "user", "content": [good[0], {"type": "video", "url": "x"}]}]}
    with pytest.raises(ValidationError, match=r"content\[1\]\.type: unknown part type"):
        AddRequest.model_validate(bad, context=CTX)
    extra = {**body, "messages": [{"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}]}
    with pytest.raises(ValidationError, match=r"content\[0\]: undeclared keys"):
        AddRequest.model_validate(extra, context=CTX)
    q = SearchRequest.model_validate({"query": good, "user_id": "u", "top_k": 3}, context=CTX)
    assert q.to_body()["query"] == good


def test_media_store_keeps_one_file_per_image(tmp_path):
    store = MediaStore(tmp_path / "media")
    parts = [{"type": "image_url", "image_url": {"url": png_url()}}, {"type": "text", "text": "x"},
             {"type": "image_url", "image_url": {"url": png_url()}}]
    ev = store.externalize(parts)
    assert ev[0]["media"] == ev[2]["media"] and ev[0]["media"].startswith("media:")
    assert len(list((tmp_path / "media").iterdir())) == 1
    assert store.to_contract(ev) == parts
    assert render_parts(ev).startswith("<image media:")


def test_image_tokens_count_against_the_budget(tmp_path):
    store = MediaStore(tmp_path)
    ref = store.put("png", png())
    mem = {"id": "a", "content": f"text <image {ref}>", "parts": [{"type": "image", "media": ref}]}
    ctx = fit_context([mem, mem], 300, "gpt-4o-mini", image_tokens=lambda r: 255)
    assert ctx.cut == 1 and ctx.tokens > 255
    assert openai_image_tokens(2048, 4096) == 85 + 170 * 6
