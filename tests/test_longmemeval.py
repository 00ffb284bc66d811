"""LongMemEval adapter on the real files in ../shared/datasets/longmemeval (oracle 500, S sample 7), its
prompts and the category-aware judge."""

from __future__ import annotations

import doctest
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from aml_ray.config import model_endpoint_from_env
from aml_ray.datasets import longmemeval
from aml_ray.datasets.fetch import DatasetHashMismatch
from aml_ray.datasets.longmemeval import (
    QUESTION_TYPES,
    is_abstention,
    load_longmemeval,
    parse_instance,
    parse_longmemeval_date,
)
from aml_ray.datasets.registry import get_dataset
from aml_ray.datasets.validate import DatasetFormatError
from aml_ray.prompts import load_prompt
from aml_ray.stages import category_judge as category_judge_module
from aml_ray.stages.scorers import get_scorer
from aml_ray.suite import DatasetCountMismatch, load_suite, resolve_bundle_path, verify_loaded_bundle
from tests.conftest import SHARED_DATASETS

LME = SHARED_DATASETS / "longmemeval"
ORACLE = LME / "longmemeval_oracle_reassembled.json"
S_SAMPLE = LME / "s_sample"
# MANIFEST.md 3.3: per question_type, abstention questions included; 30 of them end in _abs
MANIFEST_TYPES = {"single-session-user": 70, "single-session-assistant": 56, "single-session-preference": 30,
                  "multi-session": 133, "temporal-reasoning": 133, "knowledge-update": 78}
MANIFEST_ABS = {"multi-session": 12, "single-session-user": 6, "knowledge-update": 6, "temporal-reasoning": 6}


@pytest.fixture(scope="module")
def oracle():
    assert ORACLE.is_file(), f"{ORACLE} is missing: tests read the benchmarks from ../shared/datasets"
    return load_longmemeval(ORACLE)


@pytest.fixture(scope="module")
def raw_oracle():
    return json.loads(ORACLE.read_text(encoding="utf-8"))


def test_oracle_counts_match_manifest_and_suite(oracle, raw_oracle):
    assert len(oracle) == 500
    assert all(len(s.questions) == 1 for s in oracle)
    by_cat = Counter(s.questions[0].category for s in oracle)
    # each type holds its abstention questions, as upstream's print_qa_metrics.py groups them
    assert Counter(x["question_type"] for x in raw_oracle) == MANIFEST_TYPES == by_cat
    assert Counter(s.questions[0].category for s in oracle if is_abstention(s.sample_id)) == MANIFEST_ABS
    assert dict(by_cat) == load_suite().bundle("longmemeval_oracle").expected.by_category
    assert sum(len(ss) for s in oracle for ss in [s.sessions]) == 948  # evidence sessions
    assert sum(len(ss.messages) for s in oracle for ss in s.sessions) == 10_960


def test_sample_is_one_user_per_question_with_its_sessions_in_time_order(oracle, raw_oracle):
    raw = {x["question_id"]: x for x in raw_oracle}
    unsorted = 0
    for s in oracle:
        q = s.questions[0]
        assert s.sample_id == q.question_id == q.sample_id
        starts = [ss.started_at_ms for ss in s.sessions]
        assert starts == sorted(starts)
        assert [ss.index for ss in s.sessions] == list(range(1, len(s.sessions) + 1))
        item = raw[s.sample_id]
        assert sorted(ss.key for ss in s.sessions) == sorted(item["haystack_session_ids"])
        unsorted += item["haystack_dates"] != sorted(item["haystack_dates"])
        assert q.question_date == item["question_date"]
        assert set(q.evidence) == set(item["answer_session_ids"])
    assert unsorted == 34  # MANIFEST: the oracle is not sorted by time


def test_turns_keep_role_and_content_and_get_session_time_plus_index(oracle, raw_oracle):
    raw = {x["question_id"]: x for x in raw_oracle}
    s = next(s for s in oracle if s.sample_id == "001be529")
    item = raw["001be529"]
    session = s.sessions[0]
    assert session.key == "answer_530960c1"
    assert session.started_at_ms == parse_longmemeval_date("2023/05/21 (Sun) 19:50", question_id="x", field="f")
    first = item["haystack_sessions"][0]
    assert [(m.role, m.content) for m in session.messages] == [(t["role"], t["content"]) for t in first]
    assert [m.timestamp - session.started_at_ms for m in session.messages] == list(range(len(first)))
    assert s.questions[0].answer == "over a year" and s.questions[0].category == "single-session-user"


def test_int_answers_become_text_and_abstention_is_the_abs_suffix(oracle, raw_oracle):
    ints = {x["question_id"] for x in raw_oracle if isinstance(x["answer"], int)}
    assert len(ints) == 32
    by_id = {s.sample_id: s.questions[0] for s in oracle}
    assert all(isinstance(by_id[q].answer, str) and by_id[q].answer.isdigit() for q in ints)
    assert {q for q in by_id if is_abstention(q)} == {
        x["question_id"] for x in raw_oracle if x["question_id"].endswith("_abs")}
    assert all(by_id[x["question_id"]].category == x["question_type"] for x in raw_oracle)


def test_s_sample_has_one_instance_per_type_plus_abstention():
    samples = load_longmemeval(S_SAMPLE)
    assert len(samples) == 7
    assert sorted(s.questions[0].category for s in samples) == sorted(QUESTION_TYPES + ("knowledge-update",))
    assert {s.sample_id for s in samples if is_abstention(s.sample_id)} == {"f685340e_abs"}
    for s in samples:  # MANIFEST: 38 to 43 sessions and 396 to 485 turns each
        assert 38 <= len(s.sessions) <= 43
        assert [ss.started_at_ms for ss in s.sessions] == sorted(ss.started_at_ms for ss in s.sessions)
        assert 396 <= sum(len(ss.messages) for ss in s.sessions) <= 485


def _instance(**kw):
    base = {"question_id": "q1", "question_type": "temporal-reasoning", "question": "When?", "answer": 3,
            "question_date": "2023/05/30 (Tue) 23:40",
            "haystack_dates": ["2023/05/21 (Sun) 19:50", "2023/05/20 (Sat) 08:00"],
            "haystack_session_ids": ["s_a", "s_b"],
            "haystack_sessions": [[{"role": "user", "content": "later"}],
                                  [{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "ok"}]],
            "answer_session_ids": ["s_a"]}
    base.update(kw)
    return base


def test_parse_instance_sorts_sessions_and_renders_answer_as_text():
    s = parse_instance(_instance())
    assert [ss.key for ss in s.sessions] == ["s_b", "s_a"]
    assert s.questions[0].answer == "3" and s.questions[0].question_date == "2023/05/30 (Tue) 23:40"


@pytest.mark.parametrize(("field", "patch", "needle"), [
    ("haystack_dates[1]", {"haystack_dates": ["2023/05/21 (Sun) 19:50", "2023-05-20 08:00"]}, "haystack_dates[1]"),
    ("haystack_dates[0]", {"haystack_dates": ["2023/05/21 (Mon) 19:50", "2023/05/20 (Sat) 08:00"]}, "is a Sun"),
    ("question_date", {"question_date": "yesterday"}, "question_date"),
    ("haystack_dates[0]", {"haystack_dates": ["2023/02/30 (Thu) 10:00", "2023/05/20 (Sat) 08:00"]}, "day is out"),
])
def test_malformed_date_raises_naming_the_field(field, patch, needle):
    with pytest.raises(ValueError) as exc:
        parse_instance(_instance(**patch))
    msg = str(exc.value)
    assert "'q1'" in msg and field in msg and needle in msg


def test_layout_errors_name_the_instance():
    with pytest.raises(ValueError, match="differ in length"):
        parse_instance(_instance(haystack_session_ids=["only"]))
    with pytest.raises(ValueError, match="unknown question_type"):
        parse_instance(_instance(question_type="trivia"))
    with pytest.raises(ValueError, match="role 'system'"):
        parse_instance(_instance(haystack_sessions=[[{"role": "system", "content": "x"}], [{"role": "user",
                                                                                        "content": "y"}]]))


@pytest.mark.parametrize(("patch", "expected"), [
    ({"question": None}, "field 'question': expected a non-empty string, got null"),
    ({"haystack_sessions": [[{"role": "user", "content": "later"}], "earlier"]},
     "field 'haystack_sessions[1]': expected a list of turns {role, content}, got a string 'earlier'"),
    ({"haystack_sessions": [[{"role": "user", "content": "later"}], [["user", "earlier"]]]},
     "field 'haystack_sessions[1][0]': expected a turn {role, content}, got a list"),
    ({"haystack_dates": "2023/05/21 (Sun) 19:50"}, "field 'haystack_dates': expected a list, got a string "
                                                   "'2023/05/21 (Sun) 19:50'"),
    ({"answer": ["3"]}, "field 'answer': expected the gold answer as text or a number, got a list"),
    ({"haystack_session_ids": [["s_a"], "s_b"]}, "field 'haystack_session_ids[0]': expected a session id, got a list"),
])
def test_a_malformed_instance_names_the_file_item_and_field(tmp_path, patch, expected):
    """Before issue 24 several of these were raw TypeError / AttributeError tracebacks."""
    f = tmp_path / "longmemeval_s_cleaned.json"
    f.write_text(json.dumps([_instance(question_id="q0"), _instance(**patch)]))
    with pytest.raises(DatasetFormatError) as exc:
        load_longmemeval(f)
    assert str(exc.value) == f"{f}: item 1 (question_id 'q1'): {expected}"


def test_a_directory_of_instances_names_the_instance_file(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(_instance(question_id="q0")))
    bad = _instance()
    del bad["question_date"]
    (tmp_path / "b.json").write_text(json.dumps(bad))
    with pytest.raises(DatasetFormatError) as exc:
        load_longmemeval(tmp_path)
    assert str(exc.value).startswith(f"{tmp_path / 'b.json'}: item 0 (question_id 'q1'): field 'question_date': "
                                     "missing; an instance needs [")
    (tmp_path / "b.json").write_text("")
    with pytest.raises(DatasetFormatError, match=r"b.json: empty file; expected a JSON object \(one instance\)"):
        load_longmemeval(tmp_path)
    (tmp_path / "b.json").write_text(json.dumps(_instance(question_id="q0")))
    with pytest.raises(DatasetFormatError, match=r": item 1: field 'question_id': question_id 'q0' occurs twice"):
        load_longmemeval(tmp_path)


def test_resolve_verifies_the_pin_and_refuses_another_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("AML_DATASETS_DIR", str(SHARED_DATASETS))
    assert resolve_bundle_path("longmemeval_oracle", None) == ORACLE
    bad = tmp_path / "longmemeval" / ORACLE.name
    bad.parent.mkdir()
    bad.write_bytes(ORACLE.read_bytes()[:-2] + b" ]")
    with pytest.raises(DatasetHashMismatch, match="--allow-hash-mismatch"):
        resolve_bundle_path("longmemeval_oracle", bad)
    assert resolve_bundle_path("longmemeval_oracle", bad, allow_hash_mismatch=True) == bad
    with pytest.raises(FileNotFoundError, match="aml-ray datasets fetch longmemeval_oracle"):
        resolve_bundle_path("longmemeval_oracle", tmp_path / "nope.json")


def test_count_check_refuses_a_pinned_file_whose_questions_differ(oracle):
    info = verify_loaded_bundle("longmemeval_oracle", ORACLE, oracle)
    assert info["counts_checked"] and info["files_match"] and info["counts"]["total"] == 500
    with pytest.raises(DatasetCountMismatch) as exc:
        verify_loaded_bundle("longmemeval_oracle", ORACLE, oracle[:-1])
    assert "total 499 != 500" in str(exc.value) and "longmemeval_oracle" in str(exc.value)
    allowed = verify_loaded_bundle("longmemeval_oracle", ORACLE, oracle[:-1], allow_hash_mismatch=True)
    assert allowed["counts_checked"] is False


def test_s_sample_is_refused_as_the_s_bundle_unless_allowed():
    samples = load_longmemeval(S_SAMPLE)
    with pytest.raises(DatasetCountMismatch, match="total 7 != 500"):
        verify_loaded_bundle("longmemeval_s", S_SAMPLE, samples)
    assert verify_loaded_bundle("longmemeval_s", S_SAMPLE, samples, allow_hash_mismatch=True)["bundle"] == "longmemeval_s"


def test_answer_prompt_carries_the_question_date():
    text = load_prompt("longmemeval_answer").render(
        question="How many days ago did I buy the bike?", question_date="2023/05/30 (Tue) 23:40", speakers=[],
        options=[], memory_blocks=[{"speaker": None, "memories": [{"content": "I bought a bike", "created_at": None}]}])
    assert text.count("2023/05/30 (Tue) 23:40") == 2 and "I bought a bike" in text


class _RecordingJudge:
    """A judge model stand-in: records prompts, answers CORRECT for all."""

    def __init__(self):
        self.prompts: list[str] = []

    async def complete_batch(self, batch, **kw):
        self.prompts += [m[0]["content"] for m in batch]
        return [{"status": "ok", "text": '{"label": "CORRECT"}', "error": None, "attempts": 1} for _ in batch]


def _row(category, qid):
    return {"question_id": qid, "question": f"question {qid}", "gold": json.dumps("gold"), "answer": "an answer",
            "answer_status": "ok", "search_status": "ok", "category": category}


async def test_category_judge_renders_each_type_with_its_own_instruction():
    judge = _RecordingJudge()
    endpoint = model_endpoint_from_env("judge", {"JUDGE_API_BASE": "http://judge.invalid/v1", "JUDGE_MODEL": "m"})
    rows = [_row(c, q) for c, q in (("temporal-reasoning", "temporal-reasoning"), ("knowledge-update",
            "knowledge-update"), ("multi-session", "x_abs"), ("single-session-preference", "single-session-preference"),
            ("multi-session", "multi-session"))]
    await get_scorer("category_judge")(rows, endpoint=endpoint, model=judge, prompt=load_prompt("longmemeval_judge"))
    by_q = {p.split("Question: question ")[1].split("\n")[0]: p for p in judge.prompts}
    assert "off-by-one" in by_q["temporal-reasoning"] and "off-by-one" not in by_q["multi-session"]
    assert "updated one" in by_q["knowledge-update"]
    # an abstention question (id holding "_abs") gets the abstention wording whatever its type
    assert "cannot be answered" in by_q["x_abs"] and "Correct answer" not in by_q["x_abs"]
    assert "personalised" in by_q["single-session-preference"]
    assert [r["status"] for r in rows] == ["scored"] * 5 and all(r["verdict"] == "CORRECT" for r in rows)


def test_registry_declares_longmemeval_with_its_prompts_and_scorer():
    for name in ("longmemeval_s", "longmemeval_oracle"):
        spec = get_dataset(name)
        assert (spec.answer_prompt, spec.judge_prompt, spec.scorer) == ("longmemeval_answer", "longmemeval_judge",
                                                                         "category_judge")


@pytest.mark.parametrize("module", [longmemeval, category_judge_module])
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


def test_directory_load_reads_every_instance_file(tmp_path):
    for f in sorted(S_SAMPLE.glob("*.json"))[:2]:
        shutil.copy(f, tmp_path / f.name)
    assert len(load_longmemeval(tmp_path)) == 2


# ---------------------------------------------------------------- the whole S file in the s_sample/ layout

#: Instances of the built layout that carry an oddity of the public S file: an empty turn (even n) or a
#: repeated session id (odd n); 20 in all, as in the public file.
ODD_INSTANCES = 20


def _s_layout(root: Path) -> Path:
    """The 500 instances of the public S file in the ``s_sample/`` layout (one instance per file), built from
    the 7 shared sample instances: the 7 as they are (links, never copies) and 493 derived from them with
    their first three sessions, typed so that the 500 match MANIFEST's counts. Derived instance ``n`` <
    :data:`ODD_INSTANCES` holds an empty turn (even ``n``) or its first session id twice (odd ``n``)."""
    root.mkdir()
    real = sorted(S_SAMPLE.glob("*.json"))
    sources = [json.loads(f.read_text(encoding="utf-8")) for f in real]
    for f in real:
        (root / f.name).symlink_to(f)
    left = Counter(MANIFEST_TYPES) - Counter(x["question_type"] for x in sources)
    types = [t for t, n in sorted(left.items()) for _ in range(n)]
    for n, qtype in enumerate(types):
        src = sources[n % len(sources)]
        item = {**src, "question_id": f"{src['question_id']}_c{n:03d}", "question_type": qtype,
                **{k: list(src[k][:3]) for k in ("haystack_dates", "haystack_session_ids", "haystack_sessions")}}
        if n < ODD_INSTANCES and n % 2 == 0:
            item["haystack_sessions"][0] = [{**item["haystack_sessions"][0][0], "content": ""},
                                            *item["haystack_sessions"][0][1:]]
        elif n < ODD_INSTANCES:
            item["haystack_session_ids"][2] = item["haystack_session_ids"][0]
        (root / f"0_{n:03d}_{item['question_id']}.json").write_text(json.dumps(item), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def s_layout(tmp_path_factory) -> Path:
    return _s_layout(tmp_path_factory.mktemp("lme") / "s_whole")


def test_the_whole_s_file_loads_with_every_oddity_recorded(s_layout):
    from aml_ray.datasets.base import load_notes

    assert resolve_bundle_path("longmemeval_s", s_layout) == s_layout  # the folder layout is a bundle path
    samples = get_dataset("longmemeval_s").load(s_layout)
    assert len(samples) == 500 and len({s.sample_id for s in samples}) == 500
    assert sum(len(s.questions) for s in samples) == 500  # no question dropped
    assert Counter(s.questions[0].category for s in samples) == MANIFEST_TYPES
    info = verify_loaded_bundle("longmemeval_s", s_layout, samples)
    assert info["counts_checked"] and info["counts"]["total"] == 500
    notes = load_notes(samples)
    assert len(notes) == ODD_INSTANCES == len({n["sample_id"] for n in notes})
    by_sample = {s.sample_id: s for s in samples}
    for note in notes:
        sample = by_sample[note["sample_id"]]
        keys = [ss.key for ss in sample.sessions]
        assert len(keys) == len(set(keys)) == 3
        if "empty" in note["note"]:
            assert note["note"].startswith("haystack_sessions[0][0] (session ") and "turn skipped" in note["note"]
            first = next(ss for ss in sample.sessions if ss.key == keys_of_file(s_layout, sample.sample_id)[0])
            assert len(first.messages) == 11  # 12 turns, the empty one skipped
        else:
            sid = keys_of_file(s_layout, sample.sample_id)[0]
            assert note["note"] == f"haystack_session_ids[2]: session id {sid!r} repeats; loaded as '{sid}-2'"
            assert {sid, f"{sid}-2"} <= set(keys)


def keys_of_file(root: Path, question_id: str) -> list[str]:
    """The session ids of one instance file of the built layout, as the file holds them."""
    path = next(root.glob(f"*_{question_id}.json"))
    return json.loads(path.read_text(encoding="utf-8"))["haystack_session_ids"]


@pytest.mark.usefixtures("ray_session")
def test_a_run_of_the_s_layout_records_the_oddities_in_run_json(s_layout, tmp_path):
    from aml_ray.actors.participant import ParticipantSpec
    from aml_ray.reference.server import ReferenceServer
    from aml_ray.run.evaluation import EvaluationConfig, evaluate
    from aml_ray.run.evidence import read_adds, read_questions

    offline = {"answer": model_endpoint_from_env("answer", {}), "judge": model_endpoint_from_env("judge", {})}
    with ReferenceServer(tmp_path / "ref") as ref:
        result = evaluate(EvaluationConfig(
            dataset="longmemeval_s", participant=ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url),
            out_dir=tmp_path / "run", data_path=s_layout, limit_samples=2, **offline))
    info = json.loads(result.run_dir.run_json.read_text())
    notes = info["dataset"]["load_notes"]
    assert [n["note"].split(":")[0] for n in notes] == ["haystack_sessions[0][0] (session '"
                                                        + keys_of_file(s_layout, notes[0]["sample_id"])[0] + "')",
                                                        "haystack_session_ids[2]"]
    assert info["status"] == "completed" and info["bundle"]["counts_checked"] is True
    assert read_questions(result.run_dir)["status"].to_list() == ["scored", "scored"]
    dup = keys_of_file(s_layout, notes[1]["sample_id"])[0]
    sessions = set(read_adds(result.run_dir)["session_id"].to_list())
    assert {s.rsplit(":", 1)[1] for s in sessions if notes[1]["sample_id"] in s} >= {dup, f"{dup}-2"}
