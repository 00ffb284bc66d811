"""The model stage of a job with an online model: each question is judged as soon as it is answered.

A Ray Data operator hands its rows to the next one only when the task holding them ends. With Answer and
Judge as operators of their own, a task's rows waited for its slowest answer, and with a rate-limited
answer model every answer task took its rows through the same token budget, so tasks ended late and
together: the judge model sat at a third to a half of its budget while the answer model ran at its own,
then judged the last answers alone (docs/benchmarks.md, "Rate-limited models and the suite").

:class:`AnswerJudgeStage` runs both stages' code (:class:`~aml_ray.stages.answer.AnswerStage`,
:class:`~aml_ray.stages.judge_stage.JudgeStage`) inside one task: the batch is cut into slices of
``slice_rows`` rows, and each slice is judged as soon as its answers are back, while the other slices
are still being answered. Both models then work side by side, each within its own client's limits, and
the job starts one stage actor fewer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pyarrow as pa

from aml_ray.run.options import JUDGE_SLICE_ROWS
from aml_ray.stages.answer import AnswerStage
from aml_ray.stages.judge_stage import JudgeStage


class AnswerJudgeStage:
    """Ray Data stage: Answer, then Judge, slice by slice within each batch.

    Args:
        answer: :class:`~aml_ray.stages.answer.AnswerStage`'s constructor arguments.
        judge: :class:`~aml_ray.stages.judge_stage.JudgeStage`'s constructor arguments.
        slice_rows: rows answered and then judged together (>= 1; default
            :data:`~aml_ray.run.options.JUDGE_SLICE_ROWS`).
        warm_up: passed to both stages (their one-time work in threads of their own, started here).

    Raises:
        ValueError: ``slice_rows < 1``, or a stage's own argument errors.
    """

    def __init__(self, answer: dict[str, Any], judge: dict[str, Any], slice_rows: int = JUDGE_SLICE_ROWS,
                 warm_up: bool = False):
        if slice_rows < 1:
            raise ValueError(f"slice_rows must be >= 1, got {slice_rows}")
        self.slice_rows = slice_rows
        self.answer = AnswerStage(**answer, warm_up=warm_up)
        self.judge = JudgeStage(**judge, warm_up=warm_up)

    async def _slice(self, rows: pa.Table) -> pa.Table:
        return await self.judge(await self.answer(rows))

    async def __call__(self, batch: pa.Table) -> pa.Table:
        """Question rows after Search -> the same rows answered and judged (``QUESTION_SCHEMA``, same order)."""
        n = self.slice_rows
        parts = await asyncio.gather(*(self._slice(batch.slice(i, n)) for i in range(0, batch.num_rows, n)))
        return pa.concat_tables(parts) if parts else batch
