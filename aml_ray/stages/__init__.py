"""The pipeline's stages as Ray Data callable classes: Ingest -> Search -> Answer -> Judge.

Each stage receives a pyarrow batch of rows and returns one; rows are question rows of
:data:`aml_ray.evidence.QUESTION_SCHEMA` (the Ingest stage turns one sample row into that sample's
question rows). Stages never talk HTTP themselves: they send one actor call per batch to the
``ParticipantClient`` / ``ModelClient`` actors that own the connections and limits.

Errors: a :class:`~aml_ray.contract.ContractError` or a non-retryable participant status raised by an
actor is recorded on the progress tracker and stops the pipeline (seed: "Contract errors stop
immediately"). Transient failures that exhausted their retries are recorded in the row
(``search_error``, ``answer_error``, ``judge_error``) and the question stays in the denominator.
"""

from aml_ray.stages.answer import AnswerStage
from aml_ray.stages.ingest import IngestStage
from aml_ray.stages.judge import JudgeStage
from aml_ray.stages.search import SearchStage

__all__ = ["AnswerStage", "IngestStage", "JudgeStage", "SearchStage"]
