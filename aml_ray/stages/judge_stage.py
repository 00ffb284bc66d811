"""The Judge stage: a Ray Data callable class running the dataset's scoring contract on each batch.

The scoring contract is looked up in :mod:`aml_ray.stages.scorers` (default ``binary_judge``,
:func:`aml_ray.stages.judge.judge_rows`); this module sits above both, so neither imports the other
back (the judge <-> scorers import circle).
"""

from __future__ import annotations

import pyarrow as pa

from aml_ray.actors.model import ActorModel
from aml_ray.config import ModelEndpoint
from aml_ray.prompts import Prompt, load_prompt
from aml_ray.run.ray_runtime import tune_actor_process, use_arrow_ipc_serialization
from aml_ray.scoring import bleu1, token_f1
from aml_ray.stages._common import report, table_with
from aml_ray.warming import warm_in_background
from aml_ray.stages.judge import F1_RULES
from aml_ray.stages.scorers import get_scorer


class JudgeStage:
    """Ray Data stage running the dataset's scoring contract (default :func:`judge_rows`).

    Args:
        endpoint: the judge model endpoint (offline when it has no base_url).
        client: the judge ``ModelClient`` actor handle, or None when offline.
        prompt: the judge prompt (a loaded :class:`Prompt`, or a shipped name or path).
        max_parse_retries: extra asks after an unparsable reply.
        f1_rule: the dataset's lexical F1 definition.
        judge_runs: how many times each answer is judged.
        scorer: the registered scoring contract (:mod:`aml_ray.stages.scorers`), default ``binary_judge``.
        tracker: optional ``ProgressTracker`` actor handle.
        warm_up: True: :meth:`warm` runs in a thread of its own, started here (a Ray Data pool's actor,
            which waits for its first batch while the participant is searched).
    """

    def __init__(self, endpoint: ModelEndpoint, client, prompt: Prompt | str, max_parse_retries: int = 2,
                 f1_rule: str = "token", judge_runs: int = 1, scorer: str = "binary_judge", tracker=None,
                 warm_up: bool = False):
        use_arrow_ipc_serialization()
        tune_actor_process()
        self.scorer = get_scorer(scorer)
        if f1_rule not in F1_RULES:
            raise ValueError(f"f1_rule must be one of {F1_RULES}, got {f1_rule!r}")
        self.endpoint, self.tracker, self.f1_rule = endpoint, tracker, f1_rule
        self.model = ActorModel(client) if client is not None else None
        self.prompt = prompt if isinstance(prompt, Prompt) else load_prompt(prompt)
        self.max_parse_retries, self.judge_runs = max_parse_retries, judge_runs
        if warm_up:
            warm_in_background(self.warm, "judge-warm-up")

    def warm(self) -> None:
        """Do the one-time work of the first batch now: the lexical metrics' nltk imports (the Porter
        stemmer of token F1 and the offline judge, BLEU-1's scorer; about 0.3 s of CPU together, made on
        first use so that a driver importing the scoring modules never pays them)."""
        token_f1("warming up", "warm")
        bleu1("warming up", "warm")

    async def __call__(self, batch: pa.Table) -> pa.Table:
        rows = batch.drop_columns(["memories"]).to_pylist()  # no scoring contract reads the memories
        await self.scorer(rows, endpoint=self.endpoint, model=self.model, prompt=self.prompt, f1_rule=self.f1_rule,
                          max_parse_retries=self.max_parse_retries, judge_runs=self.judge_runs)
        report(self.tracker, "judge", len(rows))
        return table_with(rows, batch, ("memories",))
