"""The models inside the Ingest actor (aml_ray.stages.ingest): answering waits for what the first answer needs,
not for the judge's warm-up."""

from __future__ import annotations

import asyncio
import threading

from aml_ray.config import ModelEndpoint
from aml_ray.run.evidence import QUESTION_SCHEMA, empty_question_row, to_table
from aml_ray.stages.ingest import IngestStage
from aml_ray.stages.judge_stage import JudgeStage

OFFLINE = {"answer": {"endpoint": ModelEndpoint(role="answer", base_url=None, model="offline"), "client": None,
                      "prompt": "locomo_answer"},
           "judge": {"endpoint": ModelEndpoint(role="judge", base_url=None, model="offline"), "client": None,
                     "prompt": "locomo_judge"}}


def _searched_rows(n: int):
    return to_table([empty_question_row() | {
        "dataset": "locomo", "sample_id": "s0", "question_id": f"q{i}", "user_id": "u0", "question": "What colour is the car?",
        "gold": '"red"', "category": "1", "excluded": False, "search_status": "ok", "n_memories": 1,
        "memories": [{"id": "m1", "content": "The car is red."}]} for i in range(n)], QUESTION_SCHEMA)


def test_rows_are_answered_and_judged_while_the_judges_warm_up_still_runs(tmp_path, monkeypatch):
    """The judge's warm-up (nltk's imports, about 0.3 s of CPU) is held until the rows come back: answering
    waits only for the stages and the answer's tokenizer, so the rows are answered and judged meanwhile (the
    judge makes its imports itself), and the warm-up is let go afterwards, not by the timeout."""
    release = threading.Event()
    warm_up: list[str] = []

    def held_warm(self) -> None:
        warm_up.append("held")
        warm_up.append("let go after the rows" if release.wait(60) else "by the timeout")

    monkeypatch.setattr(JudgeStage, "warm", held_warm)
    for slice_rows in (None, 8):  # offline models in the sample's slot; online ones after it, in slices
        warm_up.clear()
        release.clear()
        stage = IngestStage(None, str(tmp_path), models=(OFFLINE["answer"], OFFLINE["judge"]),
                            judge_slice_rows=slice_rows)
        try:
            rows = asyncio.run(asyncio.wait_for(stage._answered_and_judged(_searched_rows(3)), 30))
        finally:
            release.set()
            stage._loading.join(60)
        assert warm_up == ["held", "let go after the rows"], slice_rows
        assert rows.column("answer").to_pylist() == ["The car is red."] * 3
        assert rows.column("status").to_pylist() == ["scored"] * 3
