"""The pipeline's stages as Ray Data callable classes: Ingest (Adds, then Searches) -> Answer -> Judge
(Answer and Judge run as one operator, :mod:`aml_ray.stages.answer_judge`).

Each stage receives a pyarrow batch of rows and returns one; rows are question rows of
:data:`aml_ray.run.evidence.QUESTION_SCHEMA` (the Ingest stage turns one sample row into that sample's
question rows, searched right after the sample's Adds: :mod:`aml_ray.stages.ingest`). Stages never talk HTTP themselves: they send one actor call per batch to the
``ParticipantClient`` / ``ModelClient`` actors that own the connections and limits.

Errors: a :class:`~aml_ray.contract.ContractError` or a non-retryable participant status raised by an
actor is recorded on the progress tracker and stops the pipeline (seed: "Contract errors stop
immediately"). Transient failures that exhausted their retries are recorded in the row
(``search_error``, ``answer_error``, ``judge_error``) and the question stays in the denominator.

The stage classes are imported lazily (module ``__getattr__``): a Ray worker that runs the Ingest
stage then never imports the answer/judge dependencies (openai SDK, tokenizer tables, nltk), which
cost about 1.2 s of CPU per worker start on a 2-core machine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aml_ray.stages.answer import AnswerStage
    from aml_ray.stages.answer_judge import AnswerJudgeStage
    from aml_ray.stages.ingest import IngestFromFiles, IngestStage
    from aml_ray.stages.judge_stage import JudgeStage

_MODULES = {"AnswerStage": "aml_ray.stages.answer", "AnswerJudgeStage": "aml_ray.stages.answer_judge",
            "IngestStage": "aml_ray.stages.ingest", "IngestFromFiles": "aml_ray.stages.ingest",
            "JudgeStage": "aml_ray.stages.judge_stage"}

__all__ = ["AnswerJudgeStage", "AnswerStage", "IngestFromFiles", "IngestStage", "JudgeStage"]


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return getattr(importlib.import_module(_MODULES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
