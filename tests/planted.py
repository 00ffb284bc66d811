"""A tiny LoCoMo-format dataset whose every answer is in one gold turn, and participants planted against it.

Answered from its gold turn alone, each question is correct with the offline answerer and lexical judge
(the turn holds the gold answer word for word), so a wrong answer is the participant's doing:

- ``gold_first_app``: Search returns the question's gold turn at rank 1, then the question itself echoed
  back, which shares more words with the question and so is what the offline answerer picks (a wrong answer
  with the gold retrieved: a synthesis miss);
- ``never_gold_app``: Search returns one memory that covers no gold turn (a retrieval miss);
- ``gold_only_app``: Search returns the gold turn alone (every answer correct).
- ``empty_app``: Search never returns a memory (every Add acknowledged).
"""

from __future__ import annotations

import json
from pathlib import Path

from fastapi import FastAPI, Request

SPEAKERS = ("Alice", "Bob")
TURNS = [("Alice", "My favourite colour is teal."), ("Bob", "My dog is called Rufus."),
         ("Alice", "I work as a carpenter in Oslo."), ("Bob", "Nice weather today.")]
QUESTIONS = [("What is Alice's favourite colour?", "teal", "D1:1"), ("What is the name of Bob's dog?", "Rufus", "D1:2"),
             ("What is Alice's job?", "carpenter", "D1:3")]


def write_dataset(folder: Path) -> Path:
    """The dataset as ``folder/locomo10.json`` (one sample ``planted``, one session, 3 questions)."""
    conversation = {"speaker_a": SPEAKERS[0], "speaker_b": SPEAKERS[1], "session_1_date_time": "1:56 pm on 8 May, 2023",
                    "session_1": [{"speaker": who, "dia_id": f"D1:{i}", "text": text}
                                  for i, (who, text) in enumerate(TURNS, start=1)]}
    qa = [{"question": q, "answer": a, "evidence": [e], "category": 4} for q, a, e in QUESTIONS]
    path = folder / "locomo10.json"
    path.write_text(json.dumps([{"sample_id": "planted", "conversation": conversation, "qa": qa}]))
    return path


def _gold_turn(question: str) -> str:
    evidence = {q: e for q, _, e in QUESTIONS}[question]
    who, text = TURNS[int(evidence.split(":")[1]) - 1]
    return f"{who}: {text}"


def _app(memories) -> FastAPI:
    api = FastAPI()

    @api.post("/add")
    async def add(request: Request):
        b = await request.json()
        return {"success": True, "request_id": b["request_id"], "user_id": b["user_id"], "session_id": b["session_id"]}

    @api.post("/search")
    async def search(request: Request):
        b = await request.json()
        found = memories(b["query"]) if b["query"] in {q for q, _, _ in QUESTIONS} else []
        return {"data": [{"id": f"m{i}", "content": c} for i, c in enumerate(found)][:b["top_k"]]}

    return api


def gold_first_app() -> FastAPI:
    """Gold turn at rank 1, then the question echoed (see the module docstring)."""
    return _app(lambda q: [_gold_turn(q), f"{q} {q}"])


def never_gold_app() -> FastAPI:
    """One memory that covers no gold turn."""
    return _app(lambda q: ["Nothing relevant is stored here."])


def empty_app() -> FastAPI:
    """A participant that acknowledges every Add and never returns a memory."""
    return _app(lambda q: [])


def gold_only_app() -> FastAPI:
    """The gold turn alone: every question answered correctly."""
    return _app(lambda q: [_gold_turn(q)])


def evaluate_planted(out: Path, data: Path, add_url: str, search_url: str, label: str) -> Path:
    """One run of the planted dataset ``data`` against the participant at these URLs, offline answerer and
    judge, into ``out`` (needs Ray: the ``ray_session`` fixture)."""
    from aml_ray.actors.participant import ParticipantSpec
    from aml_ray.config import model_endpoint_from_env
    from aml_ray.run.evaluation import EvaluationConfig, evaluate

    evaluate(EvaluationConfig(dataset="locomo", participant=ParticipantSpec(add_url=add_url, search_url=search_url),
                              out_dir=out, data_path=data, allow_hash_mismatch=True, participant_label=label,
                              answer=model_endpoint_from_env("answer", {}), judge=model_endpoint_from_env("judge", {})))
    return out


def planted_run(tmp: Path, data: Path, api: FastAPI, label: str) -> Path:
    """:func:`evaluate_planted` against ``api`` served on loopback, into ``tmp / label``."""
    from tests.servers import ThreadServer

    with ThreadServer(api) as server:
        return evaluate_planted(tmp / label, data, f"{server.base_url}/add", f"{server.base_url}/search", label)
