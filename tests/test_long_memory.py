"""A memory far longer than the context budget (issue 24, item 5): cut and recorded, never fatal.

The tokenizer (``bpe-openai``) refuses a text of 1,000,000 characters or more, and one of more than
200,000 tokens; a participant may return such a memory. Units: characters and tokens (o200k_base).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import bpe_openai
import polars as pl
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

import aml_ray.models.tokens as tokens
from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import model_endpoint_from_env
from aml_ray.models.context import fit_context
from aml_ray.prompts import load_prompt
from aml_ray.stages.answer import DEFAULT_CONTEXT_BUDGET, answer_rows
from aml_ray.models.tokens import count_tokens
from tests.dying_participants import FAST_RETRY
from tests.servers import ThreadServer

MODEL = "gpt-4o-mini"
#: 1,200,000 characters of words (the issue's case is 1,000,000+).
HUGE = "lorem ipsum " * 100_000
OFFLINE = {"answer": model_endpoint_from_env("answer", {}), "judge": model_endpoint_from_env("judge", {})}


def plain_count(text: str) -> int:
    """The library's own whole-text count (only for texts it accepts)."""
    return len(bpe_openai.get_encoding("o200k_base").encode(text, disallowed_special=()))


def test_huge_memory_is_cut_with_the_ones_after_it_and_recorded():
    first = {"content": "Caroline: I went to the LGBTQ support group yesterday.", "created_at": "2023-05-08"}
    after = {"content": "Melanie: that sounds great"}
    ctx = fit_context([first, {"content": HUGE}, after], DEFAULT_CONTEXT_BUDGET, MODEL)
    assert len(HUGE) == 1_200_000
    assert ctx.memories == [first]
    assert ctx.cut == 2
    assert ctx.tokens == plain_count("[2023-05-08] " + first["content"])


def test_huge_memory_alone_cuts_to_an_empty_context():
    ctx = fit_context([{"content": HUGE}], DEFAULT_CONTEXT_BUDGET, MODEL)
    assert (ctx.memories, ctx.tokens, ctx.cut) == ([], 0, 1)


def test_a_memory_that_cannot_fit_by_its_length_is_never_tokenised(monkeypatch):
    """Over ``budget * MAX_CHARS_PER_TOKEN`` characters it is cut on its length alone."""
    seen: list[int] = []
    import aml_ray.models.context as context

    monkeypatch.setattr(context, "count_tokens", lambda text, model: seen.append(len(text)) or 1)
    long = {"content": "x" * (100 * tokens.MAX_CHARS_PER_TOKEN + 1)}
    ctx = fit_context([{"content": "short"}, long], 101, MODEL)
    # 100 tokens were left after "short" (1 token here): 12,801 characters need at least 101 of them
    assert (len(ctx.memories), ctx.tokens, ctx.cut) == (1, 1, 1)
    assert seen == [5]


def test_every_token_is_at_most_max_chars_per_token_characters():
    """The rule behind the length cut: no token of the encodings we use is longer (in UTF-8 bytes, hence
    in characters)."""
    for name in ("o200k_base", "cl100k_base"):
        enc = bpe_openai.get_encoding(name)
        longest = 0
        for t in range(enc.n_vocab):
            try:
                longest = max(longest, len(enc.decode_single_token_bytes(t)))
            except KeyError:  # ids with no token (gaps before and among the special tokens)
                continue
        assert longest == tokens.MAX_CHARS_PER_TOKEN == 128


def test_count_tokens_of_a_text_over_the_tokenizer_limit():
    # the pre-tokenizer splits HUGE into "lorem", then " ipsum" / " lorem" alternately, then the final " ";
    # each is encoded on its own, so the whole count follows from theirs
    expected = plain_count("lorem") + 99_999 * plain_count(" lorem") + 100_000 * plain_count(" ipsum") + 1
    assert expected > 200_000  # over the library's token limit for one call, too
    assert count_tokens(HUGE, MODEL) == expected


def test_counting_in_pieces_equals_the_whole_text_count(monkeypatch, locomo_file):
    """With small pieces, real conversation text (LoCoMo turns, with newlines, digits, punctuation)
    counts exactly as one encode of the whole text."""
    import json

    turns = [t["text"] for c in json.loads(locomo_file.read_text())[:2]
             for k, v in c["conversation"].items() if k.startswith("session_") and isinstance(v, list)
             for t in v]
    text = "\n".join(f"{i}: {t}" for i, t in enumerate(turns))
    assert 100_000 < len(text) < 1_000_000
    # the shipped piece size keeps one encode under both library limits: 4 tokens per character at most
    # (a character is at most 4 UTF-8 bytes, a token at least 1 byte)
    assert tokens.PIECE_CHARS < 1_000_000 and tokens.PIECE_CHARS * 4 <= 200_000
    monkeypatch.setattr(tokens, "PIECE_CHARS", 997)  # the text is over CACHED_CHARS: never from the cache
    assert count_tokens(text, MODEL) == plain_count(text)


def test_count_tokens_of_text_that_looks_like_a_special_token():
    text = "the memory says <|endoftext|> and <|im_start|>"
    assert count_tokens(text, MODEL) == plain_count(text) > 10


def test_offline_answer_stage_records_the_cut():
    row = {"question_id": "q1", "question": "What did Caroline go to?", "question_date": None,
           "speakers": [], "options": [], "question_parts": None, "search_status": "ok",
           "memories": [{"id": "m1", "content": HUGE, "score": 1.0},
                        {"id": "m2", "content": "Caroline went to the support group", "score": 0.5}]}
    asyncio.run(answer_rows([row], endpoint=OFFLINE["answer"], model=None, prompt=load_prompt("locomo_answer")))
    assert row["answer_status"] == "ok"
    assert (row["memories_in_context"], row["memories_cut"], row["context_tokens"]) == (0, 2, 0)
    assert row["answer"] == "Not mentioned."


class HugeMemoryParticipant:
    """A contract-following loopback participant that answers a Search for ``query`` with one
    1,200,000-character memory first; every Search also gets one short memory.

    Attributes:
        huge_searches: how many Searches got the huge memory.
    """

    def __init__(self, query: str) -> None:
        self.query, self.huge_searches = query, 0
        self._lock = threading.Lock()
        self._server = ThreadServer(self._app())
        self.base_url = self._server.base_url

    def _app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        async def health() -> JSONResponse:
            return JSONResponse({"status": "ok"})

        @app.post("/add")
        async def add(request: Request) -> JSONResponse:
            body = await request.json()
            return JSONResponse({"success": True, "request_id": body["request_id"], "user_id": body["user_id"],
                                 "session_id": body["session_id"]})

        @app.post("/search")
        async def search(request: Request) -> JSONResponse:
            body = await request.json()
            data: list[dict[str, Any]] = []
            if body["query"] == self.query:
                with self._lock:
                    self.huge_searches += 1
                data.append({"id": "huge", "content": HUGE, "score": 2.0})
            data.append({"id": "short", "content": "a short memory", "score": 1.0})
            return JSONResponse({"data": data[: body["top_k"]]})

        return app

    def spec(self) -> ParticipantSpec:
        return ParticipantSpec(add_url=f"{self.base_url}/add", search_url=f"{self.base_url}/search",
                               health_url=f"{self.base_url}/health", retry=FAST_RETRY)

    def __enter__(self) -> HugeMemoryParticipant:
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(*exc)


@pytest.mark.usefixtures("ray_session")
def test_a_run_whose_participant_returns_a_huge_memory_completes_with_the_cut(tmp_path, locomo_file):
    """One LoCoMo sample, the offline answerer: the answered question that got the huge memory has both of
    its memories cut (the huge one, and the short one after it), every other has its short memory."""
    import json

    from aml_ray.run.evaluation import EvaluationConfig, evaluate

    first = json.loads(locomo_file.read_text())[0]
    query = next(q["question"] for q in first["qa"] if q["category"] != 5)  # category 5 is not answered
    with HugeMemoryParticipant(query) as participant:
        result = evaluate(EvaluationConfig(dataset="locomo", participant=participant.spec(), out_dir=tmp_path / "run",
                                           data_path=locomo_file, limit_samples=1, **OFFLINE))
    assert participant.huge_searches == 1
    assert result.run_info["status"] == "completed"
    answered = result.questions.filter(pl.col("answer_status").is_not_null()).select(
        "question", "answer_status", "memories_in_context", "memories_cut", "context_tokens").to_dicts()
    huge = [r for r in answered if r["question"] == query]
    assert huge == [{"question": query, "answer_status": "ok", "memories_in_context": 0, "memories_cut": 2,
                     "context_tokens": 0}]
    others = [r for r in answered if r["question"] != query]
    assert len(others) > 100
    assert {(r["answer_status"], r["memories_in_context"], r["memories_cut"]) for r in others} == {("ok", 1, 0)}
