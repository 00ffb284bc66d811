"""A local OpenAI-compatible chat-completions server for tests (the hosted-API edge we cannot reach).

The real openai SDK talks to it over loopback HTTP. A test sets ``server.script``: a function from
``(prompt_text, times_seen_before)`` to a :class:`Reply`, so behaviour can depend on the prompt (answer
vs judge) and on whether the same prompt was sent before (fail first, then succeed); ``hold``, when given,
is awaited with each prompt before its reply (a gate that holds one request until something else happened).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse


@dataclass
class Reply:
    """One scripted reply: an HTTP status, the assistant text, headers, a delay in seconds, or a raw body."""

    text: str = "ok"
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    body: str | None = None  # a 200 whose body is this text instead of a chat completion


class FakeOpenAI:
    """The app plus what it saw: ``calls`` (prompt texts in arrival order) and ``models``."""

    def __init__(self, script: Callable[[str, int], Reply] | None = None,
                 hold: Callable[[str], Awaitable[None]] | None = None) -> None:
        self.script = script or (lambda prompt, n: Reply())
        self.hold = hold  # awaited with each prompt as it arrives, before the reply (a test's gate)
        self.calls: list[str] = []
        self.contents: list = []  # the last message's content as received (a string or multimodal parts)
        self.models: list[str] = []
        self.temperatures: list[float] = []
        self.auth: list[str | None] = []
        self._seen: Counter[str] = Counter()
        self.app = FastAPI()

        @self.app.post("/v1/chat/completions")
        async def completions(request: Request):
            body = await request.json()
            content = body["messages"][-1]["content"]
            self.contents.append(content)
            # multimodal content: the script sees the text parts joined (images as "<image>")
            prompt = content if isinstance(content, str) else "".join(
                p.get("text", "") if p.get("type") == "text" else "<image>" for p in content)
            self.calls.append(prompt)
            self.models.append(body["model"])
            self.temperatures.append(body.get("temperature"))
            self.auth.append(request.headers.get("authorization"))
            if self.hold is not None:
                await self.hold(prompt)
            reply = self.script(prompt, self._seen[prompt])
            self._seen[prompt] += 1
            if reply.delay_s:
                await asyncio.sleep(reply.delay_s)
            if reply.body is not None:
                return PlainTextResponse(reply.body)
            if reply.status != 200:
                return JSONResponse({"error": {"message": "scripted", "type": "test"}}, status_code=reply.status,
                                    headers=reply.headers)
            return {
                "id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()),
                "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": reply.text}}],
                "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": len(reply.text.split()),
                          "total_tokens": len(prompt.split()) + len(reply.text.split())},
            }
