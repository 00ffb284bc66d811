"""Answer stage: the locked answer model (or the offline answerer) over the retrieved memories.

The context is the participant's memories in their order, cut to the token budget
(:mod:`aml_ray.models.context`); the cut and the token count go to evidence.

Answer-length cap (the suite's ``answer_cap_tokens``, :func:`cap_answers`): an answer longer than the cap, in
the answer model's tokens, is cut to its first ``cap`` tokens before it is judged. The evidence keeps the
whole answer (``answer_full``), the flag ``answer_capped`` and its length (``answer_tokens``); ``answer`` is
the text the judge reads. A verbose answer (a chain of thought, or a list of guesses) cannot pass a judge on
what it says after the cap.

Multimodal: the prompt is rendered as text with ``<image media:<sha256>>`` where a memory (or the
question) holds an image, then split there into an OpenAI-style content array, so text and image parts
reach the answer model interleaved in the participant's order (:func:`multimodal_content`). A prompt
without images stays a plain string. Only a vision-capable answer model may answer a multimodal suite
(:func:`require_vision`).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from aml_ray.actors.model import ActorModel
from aml_ray.config import ModelEndpoint
from aml_ray.models.context import fit_context, speaker_blocks
from aml_ray.media import IMAGE_MARKER, MEDIA_PREFIX, MediaStore, image_token_counter, render_parts
from aml_ray.models.offline import extractive_answer
from aml_ray.models.tokens import count_tokens, head_tokens
from aml_ray.prompts import Prompt, load_prompt
from aml_ray.run.ray_runtime import tune_actor_process, use_arrow_ipc_serialization
from aml_ray.stages._common import report, table_with
from aml_ray.warming import warm_in_background

#: Default context budget of the answer prompt's memories, in tokens.
DEFAULT_CONTEXT_BUDGET = 16_000
ANSWER_MAX_TOKENS = 256


def require_vision(endpoint: ModelEndpoint, track: str) -> None:
    """Refuse, before anything runs, a text-only answer model for the Multimodal track.

    Args:
        endpoint: the answer endpoint (``vision`` from ``ANSWER_VISION=1``); the offline answerer is
            allowed (it reads the text parts and is labelled offline in every output).
        track: the dataset's track.

    Raises:
        ValueError: ``track`` is multimodal and the online answer model is not marked vision-capable.
    """
    if track == "multimodal" and not endpoint.offline and not endpoint.vision:
        raise ValueError(f"answer model {endpoint.model!r} is text-only, but the multimodal track sends images "
                         "to the answer model: configure a vision-capable model and set ANSWER_VISION=1")


def multimodal_content(text: str, media: MediaStore | None) -> str | list[dict[str, Any]]:
    """A rendered prompt -> the message content: the text itself, or text/image parts split at the markers.

    Args:
        text: the rendered prompt; ``<image media:<sha256>>`` marks an image.
        media: the run's media store (None: no images possible, ``text`` is returned).

    Returns:
        ``text`` when it holds no image marker; else ``[{"type": "text", ...}, {"type": "image_url",
        "image_url": {"url": "data:image/...;base64,..."}}, ...]`` in the text's order.
    """
    if media is None or not IMAGE_MARKER.search(text):
        return text
    parts: list[dict[str, Any]] = []
    pos = 0
    for m in IMAGE_MARKER.finditer(text):
        if text[pos:m.start()].strip():
            parts.append({"type": "text", "text": text[pos:m.start()]})
        parts.append({"type": "image_url", "image_url": {"url": media.data_url(MEDIA_PREFIX + m.group(1))}})
        pos = m.end()
    if text[pos:].strip():
        parts.append({"type": "text", "text": text[pos:]})
    return parts


def cap_answers(rows: list[dict[str, Any]], cap_tokens: int | None, model: str) -> None:
    """Count each answered row's answer and cut one over the cap (the module's rule), in place.

    Args:
        rows: question rows after Answer; a row whose ``answer`` is None (not answered) is left as it is.
        cap_tokens: the suite's ``answer_cap_tokens``; None: no cap (answers are counted, never cut).
        model: the answer model, whose encoding counts (:func:`aml_ray.models.tokens.count_tokens`).

    Sets ``answer_tokens`` (the whole answer's tokens) and ``answer_capped``; for a capped answer,
    ``answer_full`` (the whole answer) and ``answer`` (its first ``cap_tokens`` tokens).
    """
    for r in rows:
        if r.get("answer") is None:
            continue
        n = count_tokens(r["answer"], model)
        capped = cap_tokens is not None and n > cap_tokens
        r.update(answer_tokens=n, answer_capped=capped)
        if capped:
            r.update(answer_full=r["answer"], answer=head_tokens(r["answer"], cap_tokens, model))


async def answer_rows(rows: list[dict[str, Any]], *, endpoint: ModelEndpoint, model, prompt: Prompt,
                      budget_tokens: int = DEFAULT_CONTEXT_BUDGET, media_root: str | None = None,
                      image_tokens: int | str = "openai_tiles", cap_tokens: int | None = None) -> None:
    """Fill the answer columns of question rows in place.

    Args:
        rows: question rows after Search (see ``QUESTION_SCHEMA``).
        endpoint: the answer endpoint; offline uses :func:`aml_ray.models.offline.extractive_answer`.
        model: an object with ``async complete_batch(batch, **kw)`` (a ``ModelClient`` or ``ActorModel``);
            None when offline.
        prompt: the answer prompt template.
        budget_tokens: the context budget for the memories.
        media_root: the run's media folder (Multimodal); None for text-only tracks.
        image_tokens: the context cost of one image (:func:`aml_ray.media.image_token_counter`).
        cap_tokens: the answer-length cap in tokens (:func:`cap_answers`); None: no cap.
    """
    media = MediaStore(media_root) if media_root is not None else None
    count_images = image_token_counter(media, image_tokens) if media is not None else None
    todo = []
    for r in rows:
        if r["search_status"] != "ok":
            r.update(answer_status="skipped", answer_error="search failed")
            continue
        ctx = fit_context(r["memories"] or [], budget_tokens, endpoint.model, count_images)
        r.update(context_tokens=ctx.tokens, memories_in_context=len(ctx.memories), memories_cut=ctx.cut)
        todo.append((r, ctx))
    if endpoint.offline:
        for r, ctx in todo:
            r.update(answer=extractive_answer(r["question"], ctx.memories), answer_status="ok",
                     answer_attempts=1, answer_latency_ms=0.0, answer_cached=False)
        cap_answers([r for r, _ in todo], cap_tokens, endpoint.model)
        return
    if not todo:
        return
    batch = [[{"role": "user", "content": multimodal_content(prompt.render(
        question=render_parts(r["question_parts"]) if r.get("question_parts") else r["question"],
        speakers=r["speakers"] or [], question_date=r["question_date"],
        options=r["options"] or [],
        memory_blocks=speaker_blocks(ctx.memories, r["speakers"] or [])), media)}] for r, ctx in todo]
    outcomes = await model.complete_batch(batch, max_tokens=ANSWER_MAX_TOKENS, prompt_sha256=prompt.sha256)
    for (r, _), o in zip(todo, outcomes):
        r.update(answer=o["text"] if o["status"] == "ok" else None, answer_status=o["status"],
                 answer_error=o["error"], answer_latency_ms=o["latency_ms"], answer_attempts=o["attempts"],
                 prompt_tokens=o["prompt_tokens"], completion_tokens=o["completion_tokens"],
                 answer_cached=o["cached"], cost_usd=o["cost_usd"])
    cap_answers([r for r, _ in todo], cap_tokens, endpoint.model)


class AnswerStage:
    """Ray Data stage around :func:`answer_rows`.

    Args:
        endpoint: the answer model endpoint (offline when it has no base_url).
        client: the answer ``ModelClient`` actor handle, or None when offline.
        prompt: the answer prompt (a loaded :class:`Prompt`, or a shipped name or path).
        budget_tokens: the context budget for the memories, in tokens.
        cap_tokens: the answer-length cap, in tokens (:func:`cap_answers`); None: no cap.
        tracker: optional ``ProgressTracker`` actor handle.
        media_root / image_tokens: Multimodal, see :func:`answer_rows`.
        warm_up: True: :meth:`warm` runs in a thread of its own, started here (a Ray Data pool's actor,
            which waits for its first batch while the participant is searched).
    """

    def __init__(self, endpoint: ModelEndpoint, client, prompt: Prompt | str, budget_tokens: int = DEFAULT_CONTEXT_BUDGET,
                 tracker=None, media_root: str | None = None, image_tokens: int | str = "openai_tiles",
                 warm_up: bool = False, cap_tokens: int | None = None):
        use_arrow_ipc_serialization()
        tune_actor_process()
        self.endpoint, self.tracker, self.budget, self.cap_tokens = endpoint, tracker, budget_tokens, cap_tokens
        self.media_root, self.image_tokens = media_root, image_tokens
        self.model = ActorModel(client) if client is not None else None
        self.prompt = prompt if isinstance(prompt, Prompt) else load_prompt(prompt)
        if warm_up:
            warm_in_background(self.warm, "answer-warm-up")

    def warm(self) -> None:
        """Do the one-time work of the first batch now: the answer model's tokenizer, which
        ``bpe_openai`` builds on the first count (:func:`aml_ray.models.tokens.encoding_for`, about 0.4 s of
        CPU), by fitting one memory into the context."""
        fit_context([{"content": "warm"}], self.budget, self.endpoint.model)

    async def __call__(self, batch: pa.Table) -> pa.Table:
        rows = batch.to_pylist()
        await answer_rows(rows, endpoint=self.endpoint, model=self.model, prompt=self.prompt,
                          budget_tokens=self.budget, media_root=self.media_root, image_tokens=self.image_tokens,
                          cap_tokens=self.cap_tokens)
        report(self.tracker, "answer", len(rows))
        return table_with(rows, batch, ("memories",))
