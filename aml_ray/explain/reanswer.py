"""Answer and judge stored question rows again with the run's locked models: what every explanation runs.

:class:`RunModels` reads a finished run (its run.json, dataset, prompts and the models it recorded) and
checks that the models configured now (``ANSWER_*`` / ``JUDGE_*`` variables, or the offline ones) are the
ones that run used: an explanation made with another model would explain that model, not the run.
:meth:`RunModels.reanswer` fills the answer and judge columns of copies of question rows (with memories and
a context budget of the caller's choosing) and returns each row's credit as the score table gives it
(:func:`aml_ray.scoring.judge_runs.table_credit`).

Results are cached per run under ``RUN_DIR/explain/`` by :meth:`RunModels.cached`, keyed by
:attr:`RunModels.fingerprint` (the models, prompts and the analysis' own settings), so a second call with the
same settings reads the file and calls no model.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aml_ray.config import ModelEndpoint, model_endpoint_from_env
from aml_ray.run.evidence import RunDir, read_questions, write_json_atomic
from aml_ray.scoring.judge_runs import table_credit

#: Columns an answer or judge fills; cleared on a row before it is answered again.
ANSWER_JUDGE_COLUMNS = ("context_tokens", "memories_in_context", "memories_cut", "answer", "answer_status",
                        "answer_error", "answer_latency_ms", "answer_attempts", "prompt_tokens", "completion_tokens",
                        "answer_cached", "cost_usd", "answer_tokens", "answer_capped", "answer_full", "verdict",
                        "judge_raw", "judge_status", "judge_error", "judge_attempts", "judge_verdicts", "judge_raw_all",
                        "score", "score_detail", "f1", "bleu1", "status")


def credit_of(row: dict[str, Any]) -> float:
    """A non-excluded row's credit as the score table gives it (1.0 = correct)."""
    return table_credit(row.get("status"), row.get("score"), row.get("verdict"))


class RunModels:
    """A finished run's dataset, prompts and locked models, ready to answer its rows again.

    Args:
        run_root: the run directory (made by ``aml-ray run``).
        answer / judge: the endpoints to use (default: from the environment, as ``aml-ray rejudge``).

    Raises:
        FileNotFoundError: no run.json in ``run_root``.
        ValueError: the run is retrieval-only or still running, a prompt changed since the run, or a configured
            model differs from the one the run recorded (the message names the variable to set).
    """

    def __init__(self, run_root: Path, *, answer: ModelEndpoint | None = None, judge: ModelEndpoint | None = None):
        from aml_ray.datasets.registry import get_dataset
        from aml_ray.prompts import load_prompt

        self.run_dir = RunDir(Path(run_root))
        if not self.run_dir.run_json.is_file():
            raise FileNotFoundError(f"{self.run_dir.run_json} not found: pass a run directory made by 'aml-ray run'")
        self.info = json.loads(self.run_dir.run_json.read_text())
        if self.info.get("retrieval_only"):
            raise ValueError(f"run {self.info.get('run_id')} is retrieval-only: it has no answers to explain")
        if self.info.get("status") not in ("completed", "partial"):
            raise ValueError(f"run {self.info.get('run_id')} has status {self.info.get('status')!r}; explain a "
                             "completed or partial run")
        self.spec = get_dataset(self.info["dataset"]["name"])
        self.answer = answer or model_endpoint_from_env("answer")
        self.judge = judge or model_endpoint_from_env("judge")
        for role, endpoint in (("answer", self.answer), ("judge", self.judge)):
            recorded = self.info["models"][role]["model"]
            if endpoint.model != recorded:
                raise ValueError(f"run {self.info['run_id']} was {role}ed by {recorded!r} but {endpoint.model!r} is "
                                 f"configured: set {role.upper()}_MODEL (and {role.upper()}_API_BASE) to the run's model")
        prompts = self.info["prompts"]
        self.answer_prompt = load_prompt(prompts["answer"]["source"], prompts["answer"]["sha256"])
        self.judge_prompt = load_prompt(prompts["judge"]["source"], prompts["judge"]["sha256"])

    def rows(self) -> list[dict[str, Any]]:
        """The run's question rows (every column)."""
        return read_questions(self.run_dir).to_dicts()

    def samples(self) -> list:
        """The run's samples, read from the dataset file run.json names.

        Raises:
            FileNotFoundError: the dataset file is gone.
        """
        path = Path(self.info["dataset"]["file"])
        if not path.exists():
            raise FileNotFoundError(f"{path}: the run's dataset file is gone; the gold evidence is read from it")
        return self.spec.read(path)

    def fingerprint(self, **settings: Any) -> str:
        """A short hash of the models, prompts and ``settings``: what makes a cached analysis valid."""
        key = json.dumps({"answer": self.answer.describe(), "judge": self.judge.describe(),
                          "prompts": [self.answer_prompt.sha256, self.judge_prompt.sha256],
                          "run": self.info["run_id"], **settings}, sort_keys=True, default=str)
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def cached(self, name: str, settings: dict[str, Any], compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``RUN_DIR/explain/<name>.json`` when it was made with these models, prompts and ``settings``; else
        ``compute()`` written there (atomically) and returned. The result says ``"cached": True`` when read."""
        path = self.run_dir.root / "explain" / f"{name}.json"
        fingerprint = self.fingerprint(**settings)
        if path.is_file():
            try:
                found = json.loads(path.read_text())
            except ValueError:
                found = None
            if found and found.get("fingerprint") == fingerprint:
                return {**found, "cached": True}
        result = {**compute(), "fingerprint": fingerprint, "settings": settings,
                  "models": {"answer": self.answer.describe(), "judge": self.judge.describe()}}
        write_json_atomic(result, path)
        return {**result, "cached": False}

    def reanswer(self, rows: list[dict[str, Any]], *, budget_tokens: int | None = None,
                 batch_size: int = 64) -> list[dict[str, Any]]:
        """Copies of ``rows`` (each with the ``memories`` to answer from) answered and judged again.

        Args:
            rows: non-excluded question rows; their ``memories`` are what the answer model sees (cut to
                ``budget_tokens``), their ``search_status`` must be ``"ok"``.
            budget_tokens: the context budget (default: the run's).
            batch_size: questions per model batch.

        Returns:
            The copies, answer and judge columns filled (``status`` ``"scored"`` or an error).
        """
        from aml_ray.actors.model import ModelClient
        from aml_ray.stages.answer import answer_rows
        from aml_ray.stages.scorers import get_scorer

        budget = budget_tokens or self.info["context_budget_tokens"]
        copies = [{**r, **{c: None for c in ANSWER_JUDGE_COLUMNS}} for r in rows]
        scorer = get_scorer(self.spec.scorer)

        async def run() -> None:
            answer = None if self.answer.offline else ModelClient(self.answer)
            judge = None if self.judge.offline else ModelClient(self.judge)
            try:
                for i in range(0, len(copies), batch_size):
                    batch = copies[i:i + batch_size]
                    await answer_rows(batch, endpoint=self.answer, model=answer, prompt=self.answer_prompt,
                                      budget_tokens=budget, cap_tokens=self.info.get("answer_cap_tokens"))
                    await scorer(batch, endpoint=self.judge, model=judge, prompt=self.judge_prompt,
                                 f1_rule=self.spec.f1_rule, max_parse_retries=2, judge_runs=1)
            finally:
                for client in (answer, judge):
                    if client is not None:
                        await client.aclose()

        asyncio.run(run())
        return copies
