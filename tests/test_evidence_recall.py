"""Evidence recall (issue 25): the rules on planted memories, LoCoMo's dia_ids as turn ids, and runs against
loopback participants that return the gold turns at rank 1 (recall@1 = 1) or never (0)."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI, Request

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import model_endpoint_from_env
from aml_ray.datasets.base import turn_ids
from aml_ray.datasets.registry import get_dataset
from aml_ray.run.evaluation import EvaluationConfig, evaluate
from aml_ray.run.evidence import RunDir, read_adds
from aml_ray.scoring.evidence_recall import KS, Turn, content_words, question_recall, recall_table, resolve_units
from tests.servers import ThreadServer

OFFLINE = {"answer": model_endpoint_from_env("answer", {}), "judge": model_endpoint_from_env("judge", {})}


def turn(text: str) -> Turn:
    return Turn(" ".join(text.lower().split()), content_words(text))


def test_exact_and_fuzzy_rules_rank_by_rank():
    units = [[turn("Caroline: I went to the LGBTQ support group yesterday")],
             [turn("Melanie: We painted a lake sunrise last year")]]
    memories = [{"content": "unrelated memory about cooking"},
                {"content": "Caroline went to an LGBTQ support group yesterday"},  # rewritten: fuzzy only
                {"content": "...\nmelanie:  we painted a lake sunrise last year\n..."}]  # verbatim: exact
    r = question_recall(units, memories, ks=(1, 2, 3))
    assert (r["first_rank"], r["first_rank_exact"]) == (2, 3)
    assert [r[f"recall@{k}"] for k in (1, 2, 3)] == [0.0, 0.5, 1.0]
    assert [r[f"recall_exact@{k}"] for k in (1, 2, 3)] == [0.0, 0.0, 0.5]
    assert question_recall([], memories)["recall@10"] is None
    short = [[turn("ok!")]]  # under 3 content words: exact rule only
    assert question_recall(short, [{"content": "ok then"}], ks=(1,))["recall@1"] == 0.0
    assert question_recall(short, [{"content": "she said ok! and left"}], ks=(1,))["recall@1"] == 1.0


def test_table_means_over_questions_with_evidence():
    rows = [{"category": "1", "n_evidence": 2, "n_unresolved": 0, "first_rank": 1, "recall@1": 0.5, "recall_exact@1": 0.5},
            {"category": "1", "n_evidence": 1, "n_unresolved": 1, "first_rank": None, "recall@1": 0.0,
             "recall_exact@1": 0.0},
            {"category": "2", "n_evidence": 0, "n_unresolved": 0, "first_rank": None, "recall@1": None,
             "recall_exact@1": None}]
    table = {r["category"]: r for r in recall_table(rows, ks=(1,))}
    # the interval of two questions' recall (0.5 and 0.0): resamples' means are 0, 0.25 or 0.5
    assert table["1"] == {"category": "1", "n": 2, "n_unresolved": 1, "recall@1": 0.25, "recall_exact@1": 0.25,
                          "recall@1_ci_low": 0.0, "recall@1_ci_high": 0.5, "hit_share": 0.5, "median_first_rank": 1.0}
    assert table["2"]["n"] == 0 and table["2"]["recall@1"] is None and table["overall"]["n"] == 2
    assert (table["2"]["recall@1_ci_low"], table["2"]["recall@1_ci_high"]) == (None, None)


def test_locomo_turn_ids_are_its_dia_ids(locomo_file):
    raw = json.loads(locomo_file.read_text())
    samples = get_dataset("locomo").load(locomo_file)
    for conv, sample in zip(raw, samples):
        for session in sample.sessions:
            turns = conv["conversation"][session.key]
            assert turn_ids(session) == [t["dia_id"] for t in turns]
    units, unresolved = resolve_units(samples[0])[samples[0].questions[0].question_id]
    assert samples[0].questions[0].evidence == ("D1:3",) and unresolved == 0
    assert units[0][0].text.startswith("caroline: i went to a lgbtq support group yesterday")


def _planted_app(gold: dict[str, str], *, hit: bool) -> FastAPI:
    """Search returns the question's evidence turns as one memory at rank 1 (``hit``), or a stranger's text."""
    app = FastAPI()

    @app.post("/add")
    async def add(request: Request):
        b = await request.json()
        return {"success": True, "request_id": b["request_id"], "user_id": b["user_id"], "session_id": b["session_id"]}

    @app.post("/search")
    async def search(request: Request):
        b = await request.json()
        text = gold.get(b["query"], "") if hit else "a note about the weather on an unrelated planet"
        return {"data": [{"id": "m1", "content": text or "nothing"}, {"id": "m2", "content": "filler memory"}]}

    return app


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("hit,expected", [(True, 1.0), (False, 0.0)])
def test_a_participant_returning_the_gold_turns_first_has_recall_at_1_of_one(tmp_path, locomo_file, hit, expected):
    sample = get_dataset("locomo").load(locomo_file)[0]
    contents = {tid: m.content for s in sample.sessions for tid, m in zip(turn_ids(s), s.messages)}
    gold = {q.question: "\n".join(contents[e] for e in q.evidence if e in contents) for q in sample.questions}
    with ThreadServer(_planted_app(gold, hit=hit)) as server:
        spec = ParticipantSpec(add_url=f"{server.base_url}/add", search_url=f"{server.base_url}/search")
        result = evaluate(EvaluationConfig(dataset="locomo", participant=spec, out_dir=tmp_path / "run",
                                           data_path=locomo_file, limit_samples=1, retrieval_only=True, **OFFLINE))
    overall = result.run_info["evidence_recall"]["table"][-1]
    assert overall["category"] == "overall" and overall["n"] > 100
    assert overall["recall@1"] == overall["recall_exact@1"] == overall["recall@100"] == expected
    assert overall["hit_share"] == expected
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["evidence_recall"] == result.run_info["evidence_recall"]["table"]
    assert RunDir(tmp_path / "run").recall.is_file()
    adds = read_adds(result.run_dir).sort("chunk_index")
    assert adds["turn_ids"][0].to_list()[:2] == ["D1:1", "D1:2"]


def test_console_table_keeps_the_intervals_whole_at_120_columns():
    from rich.console import Console

    from aml_ray.cli_tables import render_recall_table

    row = {"category": "1", "n": 43, "n_unresolved": 0, "hit_share": 0.698, "median_first_rank": 8.5,
           **{f"recall@{k}": 0.5 for k in KS}, **{f"recall_exact@{k}": 0.4 for k in KS},
           **{f"recall@{k}_ci_low": 0.12 for k in KS}, **{f"recall@{k}_ci_high": 0.28 for k in KS}}
    console = Console(width=120, record=True)
    console.print(render_recall_table([row, {**row, "category": "overall"}], category_names={"1": "multi-hop"}))
    text = console.export_text()
    assert text.count("0.500 [0.12, 0.28]") == 4  # R@10 and R@100 of both rows, each on one line
    assert "[low, high] = 95 % bootstrap interval" in " ".join(text.split())  # not eaten as rich markup
