"""Reference baselines (aml_ray.reference.baselines): their Searches, and runs of each through the reference
server on LoCoMo conv-26 (Ray, offline answerer and judge)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.cli import app
from aml_ray.config import model_endpoint_from_env
from aml_ray.contract import AddRequest, Message, SearchRequest
from aml_ray.datasets.registry import get_dataset
from aml_ray.models.tokens import count_tokens
from aml_ray.reference.baselines import FullContext, Oracle, baseline_options, gold_memories, no_memories, searcher
from aml_ray.reference.server import ReferenceServer
from aml_ray.reference.store import MemoryStore
from aml_ray.run.evaluation import EvaluationConfig, evaluate
from aml_ray.run.evidence import read_questions

OFFLINE = {"answer": model_endpoint_from_env("answer", {}), "judge": model_endpoint_from_env("judge", {})}
OFFLINE_ENV = {"ANSWER_API_BASE": "", "JUDGE_API_BASE": "", "AML_DATASETS_DIR": ""}


@pytest.fixture(scope="module")
def conv26(locomo_file):
    return get_dataset("locomo").read(locomo_file)[0]


def test_gold_memories_are_the_evidence_turns_in_source_order(conv26, locomo_file):
    raw = json.loads(locomo_file.read_text())[0]
    turns = {t["dia_id"]: t for k, v in raw["conversation"].items() if isinstance(v, list) for t in v}
    gold = gold_memories(conv26)
    q = next(q for q in conv26.questions if len(q.evidence) > 1)
    got = gold[q.question_id]
    assert [m["id"] for m in got] == [f"gold:{e}" for e in sorted(q.evidence, key=lambda e: tuple(
        int(x) for x in e[1:].split(":")))]
    first = turns[got[0]["id"].removeprefix("gold:")]
    assert got[0]["content"] == f"{first['speaker']}: {first['text']}"
    assert got[0]["created_at"].endswith("Z")
    # conv-26's 199 questions: each with evidence in the file gets its turns
    assert sum(1 for m in gold.values() if m) == sum(1 for q in conv26.questions if q.evidence)


def test_the_oracle_finds_the_question_by_user_and_text(conv26):
    oracle = Oracle([conv26])
    q = conv26.questions[0]
    body = SearchRequest(query=q.question, user_id=f"eval:run_x:locomo:{conv26.sample_id}", top_k=100)
    assert oracle(None, body) == gold_memories(conv26)[q.question_id]
    assert oracle(None, body.model_copy(update={"user_id": "eval:run_x:locomo:conv-99"})) == []
    assert oracle(None, body.model_copy(update={"query": "something never asked"})) == []
    assert oracle(None, body.model_copy(update={"top_k": 1})) == gold_memories(conv26)[q.question_id][:1]


def _store_with(tmp_path, sessions: list[list[str]]) -> MemoryStore:
    store = MemoryStore(tmp_path / "m.sqlite3")
    for n, texts in enumerate(sessions):
        store.add(AddRequest(request_id=f"r{n}", user_id="u", session_id=f"s{n}", messages=[
            Message(role="user", content=t, timestamp=1_683_554_160_000 + 1000 * i) for i, t in enumerate(texts)]))
    return store


def test_full_context_keeps_the_newest_messages_that_fit_in_order(tmp_path):
    sessions = [[f"message {n}-{i} about the lake and the boat" for i in range(5)] for n in range(4)]
    store = _store_with(tmp_path, sessions)
    line = FullContext.line(store.memories("u")[0])
    assert line.startswith("[2023-05-08T13:56:00.000Z] message 0-0")
    budget = 7 * (count_tokens(line, "gpt-4o-mini") + 1)  # seven messages' lines and newlines
    got = FullContext(budget, "gpt-4o-mini")(store, SearchRequest(query="q", user_id="u", top_k=100))
    texts = [ln.split("] ", 1)[1] for m in got for ln in m["content"].split("\n")]
    assert texts == [f"message {n}-{i} about the lake and the boat" for n, i in
                     [(2, 3), (2, 4), (3, 0), (3, 1), (3, 2), (3, 3), (3, 4)]]
    assert len(got) == 2  # one memory per Add request
    assert sum(count_tokens(m["content"], "gpt-4o-mini") for m in got) <= budget
    assert all("created_at" not in m for m in got)


def test_full_context_merges_requests_into_top_k_memories(tmp_path):
    store = _store_with(tmp_path, [[f"turn {n}"] for n in range(7)])
    got = FullContext(10_000, "gpt-4o-mini")(store, SearchRequest(query="q", user_id="u", top_k=3))
    assert len(got) == 3
    assert [ln.split("] ", 1)[1] for m in got for ln in m["content"].split("\n")] == [f"turn {n}" for n in range(7)]
    assert FullContext(10_000, "gpt-4o-mini")(store, SearchRequest(query="q", user_id="nobody", top_k=3)) == []


def test_a_baseline_without_what_it_needs_is_refused_naming_it():
    assert searcher("none") is no_memories
    with pytest.raises(ValueError, match="--dataset"):
        searcher("oracle")
    with pytest.raises(ValueError, match="--context-budget"):
        searcher("full-context")
    with pytest.raises(ValueError, match="none, full-context, oracle"):
        searcher("bm26")
    with pytest.raises(ValueError, match="budget"):
        FullContext(0, "gpt-4o-mini")


def test_an_unknown_reference_system_is_a_usage_error_naming_them_all(tmp_path, locomo_file):
    res = CliRunner().invoke(app, ["run", "--dataset", "locomo", "--data", str(locomo_file), "--participant",
                                   "reference:bm26", "--out", str(tmp_path / "r")], env=OFFLINE_ENV)
    assert res.exit_code == 2
    flat = " ".join(res.output.split())
    assert "reference:bm25, reference:none, reference:full-context, reference:oracle" in flat
    assert not (tmp_path / "r").exists()


def test_the_oracle_in_a_suite_is_a_usage_error(tmp_path):
    res = CliRunner().invoke(app, ["run", "--suite", "textual", "--participant", "reference:oracle", "--out",
                                   str(tmp_path / "r")], env=OFFLINE_ENV)
    assert res.exit_code == 2
    assert "--dataset" in res.output and not (tmp_path / "r").exists()


def _run(tmp, locomo_file, name: str, budget: int = 16_000):
    declared = get_dataset("locomo")
    options = baseline_options(f"reference:{name}", declared, locomo_file, budget, OFFLINE["answer"].model)
    with ReferenceServer(tmp / f"ref-{name}", baseline=options and {**options, "baseline": name}) as ref:
        spec = ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url)
        result = evaluate(EvaluationConfig(dataset="locomo", participant=spec, out_dir=tmp / name, data_path=locomo_file,
                                           limit_samples=1, participant_label=f"reference:{name}",
                                           context_budget_tokens=budget, **OFFLINE))
    return result


@pytest.fixture(scope="module")
def baseline_runs(tmp_path_factory, locomo_file, ray_session):
    tmp = tmp_path_factory.mktemp("baselines")
    return {name: _run(tmp, locomo_file, name) for name in ("none", "bm25", "oracle")}


def _overall(result):
    return next(r for r in result.table.to_dicts() if r["category"] == "overall")


def test_none_below_bm25_below_oracle_with_separate_intervals(baseline_runs):
    none, bm25, oracle = (_overall(baseline_runs[n]) for n in ("none", "bm25", "oracle"))
    assert none["n_total"] == bm25["n_total"] == oracle["n_total"] == 152
    assert none["accuracy"] == 0.0
    assert none["accuracy_ci_high"] < bm25["accuracy_ci_low"]
    assert bm25["accuracy_ci_high"] < oracle["accuracy_ci_low"]
    recall = {r["category"]: r for r in baseline_runs["oracle"].run_info["evidence_recall"]["table"]}
    assert recall["overall"]["recall@100"] == 1.0  # the oracle returns every resolvable gold turn
    for name in ("none", "oracle"):
        assert baseline_runs[name].run_info["participant"]["label"] == f"reference:{name}"


def test_run_json_records_context_tokens_per_question(baseline_runs):
    rows = read_questions(baseline_runs["oracle"].run_dir, columns=("excluded", "context_tokens")).to_dicts()
    tokens = sorted(r["context_tokens"] for r in rows if not r["excluded"])
    got = baseline_runs["oracle"].run_info["context_tokens"]
    assert got["mean"] == pytest.approx(sum(tokens) / len(tokens))
    assert tokens[int(0.95 * (len(tokens) - 1))] <= got["p95"] <= tokens[-1] == got["max"]
    assert baseline_runs["none"].run_info["context_tokens"]["p95"] == 0


def test_full_context_fills_the_budget_with_the_conversations_end(tmp_path, locomo_file, conv26, ray_session):
    result = _run(tmp_path, locomo_file, "full-context", budget=2_000)
    rows = [r for r in read_questions(result.run_dir).to_dicts() if not r["excluded"]]
    last = conv26.sessions[-1].messages[-1].content
    assert all(r["memories"][-1]["content"].endswith(last) for r in rows)
    assert all(1_500 < r["context_tokens"] <= 2_000 and r["memories_cut"] == 0 for r in rows)
