"""Asking a judge model until its reply parses: the one re-ask loop every LLM scorer shares.

Rule (DESIGN.md "Scoring contracts"): a reply that cannot be parsed, or an empty one, is asked again
(bypassing the reply cache) at most ``max_parse_retries`` times; after that the question is recorded as
a judge error and stays in the denominator. Other failed calls (retries exhausted, non-retryable
status) are not re-asked here: the model client already retried them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aml_ray.scoring.judge_parse import ReplyParseError


async def ask_until_parsed(model, prompts: list[str], parse: Callable[[str, int], Any], *, prompt_sha256: str,
                           max_tokens: int, max_parse_retries: int = 2,
                           first_uses_cache: bool = True) -> list[dict[str, Any]]:
    """Ask every prompt (one user message each) and parse the replies, re-asking the unusable ones.

    Args:
        model: an object with ``async complete_batch(batch, **kw)`` (``ModelClient`` or ``ActorModel``).
        prompts: rendered prompt texts.
        parse: ``(reply_text, prompt_index) -> value``; raises a :class:`ReplyParseError` when unusable.
        prompt_sha256: the template's hash (part of the reply-cache key).
        max_tokens: completion limit per reply.
        max_parse_retries: extra asks after an unparsable or empty reply.
        first_uses_cache: whether the first ask may read the reply cache (repeated judge runs pass False).

    Returns:
        Per prompt, in order: ``{"value", "raw", "error", "attempts", "replies"}``; ``value`` is None when
        every ask failed, and ``error`` then says why (the last parse error or the call's error);
        ``replies`` lists the text of every reply that came back, in the order asked, an empty reply as
        ``""`` (a call that failed without a reply adds nothing).
    """
    results = [{"value": None, "raw": None, "error": "not judged", "attempts": 0, "replies": []} for _ in prompts]
    pending = list(range(len(prompts)))
    for round_ in range(1 + max_parse_retries):
        if not pending:
            break
        outcomes = await model.complete_batch([[{"role": "user", "content": prompts[i]}] for i in pending],
                                              max_tokens=max_tokens, prompt_sha256=prompt_sha256,
                                              use_cache=first_uses_cache and round_ == 0)
        still = []
        for i, o in zip(pending, outcomes):
            res = results[i]
            res["attempts"] += o["attempts"]
            res["raw"] = o["text"] or res["raw"]
            if o["status"] == "ok" or o["error"] == "empty reply":
                res["replies"].append(o["text"] or "")
            if o["status"] != "ok":
                res["error"] = o["error"]
                if o["error"] == "empty reply":
                    still.append(i)
                continue
            try:
                res["value"], res["error"] = parse(o["text"], i), None
            except ReplyParseError as exc:
                res["error"] = str(exc)
                still.append(i)
        pending = still
    return results
