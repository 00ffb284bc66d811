"""ModelClient: the one owner of traffic to an OpenAI-compatible model endpoint (answer or judge).

A plain class (tested directly) that runs as a Ray actor, one per model endpoint identity on the
cluster (:func:`aml_ray.actors.shared.acquire_model_client`), so that endpoint's limits hold across
stages and across every job running at once, in any process. Every call carries its job key (the run id);
admission to the endpoint's in-flight slots is round-robin across jobs with waiting requests
(:class:`aml_ray.actors.fair.FairSlots`), so a job with 10,000 questions queued cannot starve one with
100.
Uses the openai SDK with its aiohttp transport (``DefaultAioHttpClient``), temperature 0, and the
platform's bounded retry policy on 408/409/429/5xx and transport errors, honouring Retry-After. The call
goes through the SDK's documented ``client.post`` with the body as JSON and the reply read as bytes, not
``chat.completions.create``: the SDK's own errors, auth and base URL, without its per-call transform of
the typed parameters and construction of the response models, which nearly doubled the client's CPU
per call; on 2 cores that CPU held the answer and judge rates below the endpoints' limits (measured:
docs/benchmarks.md).
Limits: max in-flight requests (fair slots), requests/minute and tokens/minute
(:class:`aml_ray.models.rate_limits.RequestBudget`: aiolimiter buckets holding ``rate_window_s`` of budget,
drained at the limits less ``rate_headroom``; the token cost of a call is counted before sending as a
hosted API charges it, prompt tokens with the per-message overhead + ``max_tokens``). A 429 is retried
after its Retry-After, and widens the budget's margin (:meth:`RequestBudget.refused
<aml_ray.models.rate_limits.RequestBudget.refused>`). Replies are cached
by (model, prompt hash, input hash) when the endpoint has a ``cache_path``; usage and a cost estimate
(:mod:`aml_ray.models.pricing`) are recorded per call.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aml_ray.actors.fair import FairSlots
from aml_ray.models.answer_cache import AnswerCache, cache_key
from aml_ray.config import ModelEndpoint
from aml_ray.models.pricing import estimate_cost_usd
from aml_ray.models.rate_limits import RequestBudget, request_tokens
from aml_ray.run.ray_runtime import tune_actor_process
from aml_ray.retry import MODEL_RETRY_STATUSES, RetryPolicy, TransientError, parse_retry_after
from aml_ray.warming import warm_in_background

if TYPE_CHECKING:
    import openai


#: The job key of a call that names none (a local client in ``aml-ray rejudge``, a bare actor handle).
DEFAULT_JOB = "default"


class ModelError(Exception):
    """A model call failed permanently (non-retryable status such as 400/401/404)."""


def _reply(raw: bytes) -> tuple[str, dict[str, int]]:
    """A chat-completions reply body -> ``(text of the first choice, {prompt_tokens, completion_tokens})``.

    No choice, a null content or no usage read as empty text and 0 tokens.

    Raises:
        TransientError: the body is not a JSON object of that shape (a proxy's page, a cut reply): the
            call is retried like a 5xx.
    """
    try:
        data = json.loads(raw)
        choices = data.get("choices") or []
        text = (choices[0]["message"].get("content") or "") if choices else ""
        usage = data.get("usage") or {}
        counts = {"prompt_tokens": int(usage.get("prompt_tokens") or 0),
                  "completion_tokens": int(usage.get("completion_tokens") or 0)}
    except (ValueError, TypeError, KeyError, AttributeError, IndexError):
        raise TransientError("malformed reply (not a chat completion)") from None
    if not isinstance(text, str):
        raise TransientError("malformed reply (content is not text)")
    return text, counts


class ModelClient:
    """Async chat-completions client for one endpoint.

    Args:
        endpoint: base_url, model, api key, max in-flight and timeout (seconds).
        retry: bounded backoff for transient failures.
        in_actor: tune this process as a hot-path Ray actor (:func:`aml_ray.run.ray_runtime.tune_actor_process`);
            set by :func:`spawn_model_client` for the Ray actor, never for a local client.

    Raises:
        ValueError: if the endpoint is the offline one (it has no HTTP endpoint to call).
    """

    def __init__(self, endpoint: ModelEndpoint, retry: RetryPolicy = RetryPolicy(), *, in_actor: bool = False):
        if in_actor:  # the Ray actor (spawn_model_client): it times the model's calls
            tune_actor_process()
        if endpoint.offline:
            raise ValueError(f"{endpoint.role} endpoint is offline: set {endpoint.role.upper()}_API_BASE")
        importlib.import_module("openai")  # loaded while the actor starts, not on its first call
        self.endpoint = endpoint
        self.retry = retry
        self._client: openai.AsyncOpenAI | None = None
        self._slots: FairSlots | None = None
        self._budget = RequestBudget(endpoint.rpm, endpoint.tpm, endpoint.rate_window_s, endpoint.rate_headroom)
        self._cache = AnswerCache(Path(endpoint.cache_path)) if endpoint.cache_path else None
        if in_actor:  # the actor starts with the pipeline's stages and waits seconds for its first request
            warm_in_background(self.warm, "model-client-warm-up")

    def warm(self) -> None:
        """Do the first request's one-time work now: with a tokens/minute limit, every request's tokens are
        counted before it is sent (:func:`~aml_ray.models.rate_limits.request_tokens`), and the first count
        builds the model's tokenizer (:func:`aml_ray.models.tokens.encoding_for`, about 0.5 s of CPU: seconds
        of the first request's wait on 2 busy cores; docs/benchmarks.md)."""
        if self._budget.counts_tokens:
            request_tokens([{"role": "user", "content": "warm"}], 0, self.endpoint.model)

    def _ensure(self) -> openai.AsyncOpenAI:
        if self._client is None:
            import openai  # here, not at the top: the stage actors import this module for ActorModel only,
            # and the SDK costs about 1 s of CPU to import (each actor start on 2 cores)

            key = self.endpoint.api_key.get_secret_value() if self.endpoint.api_key else "not-needed"
            self._client = openai.AsyncOpenAI(
                base_url=self.endpoint.base_url, api_key=key, max_retries=0,
                timeout=self.endpoint.timeout_s, http_client=openai.DefaultAioHttpClient(),
            )
            self._slots = FairSlots(self.endpoint.max_in_flight)
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP pool and the reply cache."""
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._cache is not None:
            self._cache.close()
            self._cache = None

    def load(self) -> dict[str, Any]:
        """``{"in_use": slots held, "waiting": {job: requests waiting}, "count_factor": what each request counts
        against the rpm/tpm budgets, as a multiple of its cost (:attr:`RequestBudget.factor
        <aml_ray.models.rate_limits.RequestBudget.factor>`: above 1.0 after the endpoint's refusals)}`` (for drills
        and tests)."""
        factor = self._budget.factor
        if self._slots is None:
            return {"in_use": 0, "waiting": {}, "count_factor": factor}
        return {"in_use": self._slots.in_use, "waiting": self._slots.waiting(), "count_factor": factor}

    async def _attempt(self, messages: list[dict[str, Any]], max_tokens: int,
                       job: str) -> tuple[str, dict[str, int], float]:
        import openai

        client = self._ensure()
        assert self._slots is not None
        # the RPM/TPM buckets are taken inside the slot: slots are granted fairly, so rate is shared too
        async with self._slots.slot(job):
            await self._budget.acquire(request_tokens(messages, max_tokens, self.endpoint.model)
                                       if self._budget.counts_tokens else 0)
            t0 = time.perf_counter()
            try:
                raw = await client.post("/chat/completions", cast_to=bytes, body={
                    "model": self.endpoint.model, "messages": messages, "temperature": 0, "max_tokens": max_tokens})
            except openai.APIStatusError as exc:
                if exc.status_code == 429:  # over the endpoint's limits by its own count: the margin widens
                    self._budget.refused()
                if exc.status_code in MODEL_RETRY_STATUSES:
                    raise TransientError(f"HTTP {exc.status_code}", exc.status_code,
                                         parse_retry_after(exc.response.headers.get("retry-after"))) from None
                raise ModelError(f"{self.endpoint.role} model: HTTP {exc.status_code} is not retried") from None
            except (openai.APIConnectionError, openai.APITimeoutError) as exc:
                raise TransientError(type(exc).__name__) from None
            latency_ms = (time.perf_counter() - t0) * 1000
        return (*_reply(raw), latency_ms)

    async def complete(self, messages: list[dict[str, Any]], *, max_tokens: int = 512,
                       prompt_sha256: str = "", use_cache: bool = True, job: str = DEFAULT_JOB) -> dict[str, Any]:
        """One chat completion at temperature 0.

        Args:
            messages: OpenAI chat messages.
            max_tokens: completion limit.
            prompt_sha256: hash of the template the messages were rendered from (part of the cache key).
            use_cache: read the reply cache (a repeated judge run passes False); good replies are
                always written.
            job: the calling job's key (its run id): every attempt waits for an in-flight slot in this
                job's turn (:class:`aml_ray.actors.fair.FairSlots`). Never a secret.

        Returns:
            ``{status: "ok"|"error", text, attempts, latency_ms, prompt_tokens, completion_tokens,
            cost_usd, cached, error}``; an empty reply is ``status="error"`` with ``error="empty reply"``.
        """
        out: dict[str, Any] = {"status": "error", "text": "", "attempts": 0, "latency_ms": None,
                               "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": None, "cached": False,
                               "error": None}
        key = cache_key(self.endpoint.model, prompt_sha256, messages) if self._cache else None
        if key and use_cache and (hit := self._cache.get(key)) is not None:
            out.update(status="ok", text=hit["text"], cached=True, latency_ms=0.0, cost_usd=0.0,
                       prompt_tokens=hit["prompt_tokens"], completion_tokens=hit["completion_tokens"])
            return out
        try:
            async for attempt in self.retry.retrying():
                with attempt:
                    out["attempts"] += 1
                    text, usage, latency = await self._attempt(messages, max_tokens, job)
            out.update(text=text, latency_ms=latency, **usage)
            out["cost_usd"] = estimate_cost_usd(self.endpoint.model, usage["prompt_tokens"],
                                                usage["completion_tokens"])
            out["status"] = "ok" if text.strip() else "error"
            out["error"] = None if text.strip() else "empty reply"
            if key and text.strip():
                self._cache.put(key, text, usage["prompt_tokens"], usage["completion_tokens"])
        except TransientError as exc:
            out["error"] = f"gave up after {out['attempts']} attempts: {exc.reason}"
        except ModelError as exc:
            out["error"] = str(exc)
        return out

    async def complete_batch(self, batch: list[list[dict[str, Any]]], *, max_tokens: int = 512,
                             prompt_sha256: str = "", use_cache: bool = True,
                             job: str = DEFAULT_JOB) -> list[dict[str, Any]]:
        """Many completions concurrently (bounded by the limits, in ``job``'s turns); results in input order."""
        return list(await asyncio.gather(*(
            self.complete(m, max_tokens=max_tokens, prompt_sha256=prompt_sha256, use_cache=use_cache, job=job)
            for m in batch)))


@dataclass(frozen=True)
class JobModel:
    """A shared ``ModelClient`` actor handle bound to one job's key: what a pipeline hands its stages.

    Picklable (an actor handle and a string), so it travels to Ray Data's stage actors in place of the
    bare handle; :class:`ActorModel` unwraps it and sends ``job`` with every call.

    Attributes:
        actor: the ``ModelClient`` actor handle (shared by every job using the endpoint).
        job: the job's key (its run id; never a secret).
    """

    actor: Any
    job: str


class ActorModel:
    """Adapter giving a ``ModelClient`` actor handle the plain ``await complete_batch(...)`` interface.

    Stages and ``aml-ray rejudge`` share one judging/answering code path: the stage wraps the actor
    handle, the re-judge passes a local :class:`ModelClient`.

    Args:
        handle: a :class:`JobModel` (calls carry its job key) or a bare actor handle (calls carry
            :data:`DEFAULT_JOB`).
    """

    def __init__(self, handle):
        if isinstance(handle, JobModel):
            self.handle, self.job = handle.actor, handle.job
        else:
            self.handle, self.job = handle, DEFAULT_JOB

    async def complete_batch(self, batch, **kw):
        return await self.handle.complete_batch.remote(batch, job=self.job, **kw)


def spawn_model_client(endpoint: ModelEndpoint, *, name: str | None = None, namespace: str | None = None):
    """Start the ``ModelClient`` Ray actor for one endpoint (named ``name`` in ``namespace`` when given).

    Pipelines get theirs through :func:`aml_ray.actors.shared.acquire_model_client`: the cluster's client
    registry starts one per endpoint identity, shared by every job on the cluster, and closes it when the
    last job is done.
    """
    import ray

    from aml_ray.run.ray_runtime import on_this_node

    # on the driver's node, like the ParticipantClient: losing a worker node must not fail a stage's call
    options: dict[str, Any] = {"num_cpus": 0, "max_restarts": 3, "max_concurrency": 10_000,
                               "scheduling_strategy": on_this_node()}
    if name:
        options.update(name=name, namespace=namespace, get_if_exists=True)
    return ray.remote(ModelClient).options(**options).remote(endpoint, in_actor=True)
