"""ScriptMem adapter: the real questions in ../shared/datasets, the published placeholder conversation file,
and a small operator conversation file built here in the published layout (the scripts are unpublished)."""

from __future__ import annotations

import json
import os
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import polars as pl
import pytest
from fastapi import FastAPI, Request

from aml_ray.datasets import scriptmem
from aml_ray.datasets.fetch import DatasetHashMismatch
from aml_ray.datasets.registry import get_dataset
from aml_ray.datasets.validate import DatasetFormatError
from aml_ray.datasets.scriptmem import (
    EXPECTED_QA_TYPES,
    EXPECTED_SOURCES,
    QUESTIONS_SHA256,
    ScriptsNotPublished,
    load_scriptmem,
    parse_scriptmem,
    parse_session_date,
    resolve_scriptmem,
    split_question,
)
from aml_ray.ids import IdScheme
from aml_ray.run.inputs import build_inputs
from aml_ray.prompts import load_prompt
from tests.conftest import SHARED_DATASETS

SM_DIR = SHARED_DATASETS / "scriptmem"
QUESTIONS = SM_DIR / "questions.jsonl"
# The benchmark files come from ../shared/datasets (never copied here); a missing file fails, never skips.
needs_files = pytest.mark.usefixtures("_require_needs_files")


@pytest.fixture
def _require_needs_files() -> None:
    assert QUESTIONS.exists(), f"{QUESTIONS} is missing: tests read the benchmarks from ../shared/datasets"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def day(s: str) -> int:
    return int(datetime.strptime(s, "%Y-%m-%d").replace(tzinfo=timezone.utc).timestamp()) * 1000


def turn(dia_id: str, text: str, speaker: str | None = "Juror #8", kind: str = "dialogue") -> dict:
    return {"type": kind, "speaker": speaker, "dia_id": dia_id, "text": text}


def script(source: str, date: str = "Unknown") -> dict:
    """An operator conversation line in the published layout (conversations.jsonl), two sessions."""
    return {"conversation_id": f"{source}:conv-0", "source": source, "sample_id": "conv-0", "conversation": {
        "speakers": ["Juror #8", "Juror #3"],
        "session_1_date_time": date,
        "session_1": [turn("D1:1", "It's possible."),
                      turn("D1:2", "The jurors file into the room.", speaker=None, kind="narration"),
                      turn("D1:3", "Not guilty, I say.", speaker="Juror #3")],
        "session_2_date_time": date,
        "session_2": [turn("D2:1", "Let's vote again.")],
        "session_3_date_time": date,
        "session_3": [],
    }}


@pytest.fixture
def operator_dir(tmp_path) -> Path:
    """questions.jsonl (a symlink to the shared file, never a copy) beside an operator conversation file."""
    os.symlink(QUESTIONS, tmp_path / "questions.jsonl")
    lines = [script("angry"), script("enemy"), script("friends", "September 22, 1994"), script("man_earth")]
    (tmp_path / "conversations.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    return tmp_path


# ---------------------------------------------------------------- real questions


@needs_files
def test_question_counts_equal_the_manifest():
    raw = read_jsonl(QUESTIONS)
    assert len(raw) == 457
    assert Counter(q["qa_type"] for q in raw) == EXPECTED_QA_TYPES == {"single_choice": 298, "multi_select": 123,
                                                                        "ordering": 36}
    assert Counter(q["source"] for q in raw) == EXPECTED_SOURCES == {"friends": 174, "angry": 99, "enemy": 94,
                                                                      "man_earth": 90}


@needs_files
def test_the_published_placeholder_parses_but_is_refused(tmp_path):
    with pytest.raises(ScriptsNotPublished, match="format_example"):
        resolve_scriptmem(SM_DIR, cache_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="not published"):
        load_scriptmem(SM_DIR)
    samples = load_scriptmem(SM_DIR, allow_placeholder=True)
    assert [s.sample_id for s in samples] == ["angry-conv-0", "enemy-conv-0", "friends-conv-0", "man_earth-conv-0"]
    questions = [q for s in samples for q in s.questions]
    assert len(questions) == 457 and Counter(q.category for q in questions) == EXPECTED_QA_TYPES
    assert {s.sample_id: len(s.questions) for s in samples} == {"angry-conv-0": 99, "enemy-conv-0": 94,
                                                                "friends-conv-0": 174, "man_earth-conv-0": 90}
    angry = samples[0].sessions[0].messages
    assert [m.content for m in angry] == [
        "Speaker A: Synthetic example utterance showing the dialogue schema.",
        "[Narration] Synthetic non-dialogue scene description showing the narration schema."]
    assert [m.timestamp for m in angry] == [None, None]  # "Unknown": no timestamp, never "now"
    assert samples[2].sessions[0].messages[0].timestamp == day("1994-09-22")


@needs_files
def test_operator_file_in_the_published_layout(operator_dir, tmp_path):
    conv = resolve_scriptmem(operator_dir, cache_dir=tmp_path)
    assert conv == operator_dir / "conversations.jsonl"
    assert resolve_scriptmem(conv, cache_dir=tmp_path) == conv
    samples = load_scriptmem(conv)
    friends = samples[2]
    assert friends.sample_id == "friends-conv-0" and friends.speakers == ()
    assert [s.key for s in friends.sessions] == ["session_1", "session_2"]  # the empty session_3 is skipped
    assert [m.content for m in friends.sessions[0].messages] == [
        "Juror #8: It's possible.", "[Narration] The jurors file into the room.", "Juror #3: Not guilty, I say."]
    assert {m.role for s in friends.sessions for m in s.messages} == {"user"}
    assert [m.timestamp for m in friends.sessions[0].messages] == [day("1994-09-22") + i for i in range(3)]
    assert sum(len(s.questions) for s in samples) == 457


@needs_files
def test_options_go_to_search_and_the_gold_never_does(operator_dir, tmp_path):
    samples = load_scriptmem(operator_dir)
    q = next(q for s in samples for q in s.questions if q.question_id == "angry:conv-0#q0000")
    assert q.category == "single_choice" and q.answer == ["B"]
    assert q.options[1].startswith("B. That the apartment") and len(q.options) == 6
    assert q.question.startswith("A courtroom demonstration includes someone miming")
    assert q.question.endswith("Please provide the option corresponding to the only correct answer, enclosed in "
                               "parentheses, e.g., (X).")
    assert all(opt not in q.question for opt in q.options)  # the options travel as options, not in the query
    ordering = next(q for s in samples for q in s.questions if q.category == "ordering")
    raw = {r["qa_id"]: r for r in read_jsonl(QUESTIONS)}[ordering.question_id]
    assert ordering.answer == raw["answer_letters"] and len(ordering.answer) >= 3
    inputs = build_inputs(samples[:1], IdScheme("run_test", "scriptmem"), out_dir=tmp_path / "inputs")
    rows = inputs.sample_row(0)["questions"]
    assert len(rows) == 99 and all(r["options"] and len(r["options"]) >= 3 for r in rows)
    assert rows[0]["user_id"] == "eval:run_test:scriptmem:angry-conv-0"
    assert json.loads(rows[0]["gold"]) == ["B"]
    # what the Search stage sends: query and options only (aml_ray.stages.search)
    request = {"query": rows[0]["question"], "options": rows[0]["options"]}
    assert "B" not in request["options"] and json.dumps(["B"]) != json.dumps(request["options"])


@needs_files
def test_questions_hash_is_pinned(tmp_path):
    (tmp_path / "questions.jsonl").write_bytes(QUESTIONS.read_bytes().replace(b"conv-0#q0000", b"conv-0#q9999", 1))
    (tmp_path / "conversations.jsonl").write_text(json.dumps(script("angry")) + "\n", encoding="utf-8")
    with pytest.raises(DatasetHashMismatch, match=QUESTIONS_SHA256):
        resolve_scriptmem(tmp_path, cache_dir=tmp_path)


def test_resolve_needs_the_operator_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="not published: pass --data"):
        resolve_scriptmem(None, cache_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_scriptmem(tmp_path, cache_dir=tmp_path)
    (tmp_path / "conversations.jsonl").write_text(json.dumps(script("angry")) + "\n", encoding="utf-8")
    with pytest.raises(FileNotFoundError, match="no questions.jsonl beside"):
        resolve_scriptmem(tmp_path, cache_dir=tmp_path)


@needs_files
def test_questions_file_alone_names_the_missing_conversation_file(tmp_path):
    os.symlink(QUESTIONS, tmp_path / "questions.jsonl")
    missing = str(tmp_path / "conversations.jsonl")
    for step in (lambda p: resolve_scriptmem(p, cache_dir=tmp_path), load_scriptmem):
        with pytest.raises(FileNotFoundError, match="the conversation file .* is missing") as info:
            step(tmp_path / "questions.jsonl")
        assert missing in str(info.value) and "appears twice" not in str(info.value)
    # the same questions under another name, given as the conversation file
    os.symlink(QUESTIONS, tmp_path / "scriptmem_questions.jsonl")
    with pytest.raises(DatasetFormatError, match="question object .* the conversation file is missing"):
        load_scriptmem(tmp_path / "scriptmem_questions.jsonl")


@needs_files
def test_questions_file_names_the_conversation_file_beside_it(operator_dir, tmp_path):
    conv = resolve_scriptmem(operator_dir / "questions.jsonl", cache_dir=tmp_path)
    assert conv == operator_dir / "conversations.jsonl"
    assert sum(len(s.questions) for s in load_scriptmem(operator_dir / "questions.jsonl")) == 457


def test_registry_declaration():
    spec = get_dataset("scriptmem")
    assert (spec.scorer, spec.answer_prompt, spec.judge_prompt) == ("option_match", "scriptmem_answer", "option_match")
    rendered = load_prompt(spec.answer_prompt).render(
        question="Who left first?\n\nPlease provide (X).", options=["A. Ross", "B. Rachel"], speakers=[],
        question_date=None, memory_blocks=[{"speaker": None, "memories": [{"content": "Ross: bye", "created_at": None}]}])
    assert "A. Ross\nB. Rachel" in rendered and "(A, C, D)" in rendered and "(D, A, C, B)" in rendered
    load_prompt(spec.judge_prompt)


# ---------------------------------------------------------------- small cases


QA = {"qa_id": "angry:conv-0#q0000", "conversation_id": "angry:conv-0", "source": "angry", "qa_type": "multi_select",
      "question": "Which jurors voted guilty?\nA. #3\nB. #8\nC. #10\nPlease provide all correct options.",
      "option": ["A. #3", "B. #8", "C. #10"], "answer": ["A. #3", "C. #10"], "answer_letters": ["A", "C"]}


def test_small_layout_file():
    [sample] = parse_scriptmem([QA], [script("angry")])
    [q] = sample.questions
    assert q.question == "Which jurors voted guilty?\n\nPlease provide all correct options."
    assert q.options == ("A. #3", "B. #8", "C. #10") and q.answer == ["A", "C"] and q.category == "multi_select"


@pytest.mark.parametrize("change, match", [
    ({"answer_letters": ["A", "B"]}, "disagree with the gold option texts"),
    ({"answer_letters": ["A", "A"]}, "must be distinct option letters"),
    ({"qa_type": "true_false"}, "qa_type 'true_false'"),
    ({"option": ["A. #3", "C. #8", "B. #10"]}, "lettered A., B., ... in order"),
    ({"question": "Which jurors voted guilty? A. #3 B. #8 C. #10"}, "not on its own line"),
    ({"qa_type": "single_choice"}, "exactly one gold letter"),
])
def test_malformed_questions_are_errors(change, match):
    with pytest.raises(DatasetFormatError, match=match) as exc:
        parse_scriptmem([{**QA, **change}], [script("angry")])
    assert str(exc.value).startswith("item 0 (qa_id 'angry:conv-0#q0000'): field ")


def test_malformed_files_are_named_with_the_item_and_field(tmp_path):
    """Errors name the file they are in (questions.jsonl or the conversation file), the record and the field."""
    questions, conversations = tmp_path / "questions.jsonl", tmp_path / "conversations.jsonl"
    conversations.write_text(json.dumps(script("angry")) + "\n")
    no_option = {k: v for k, v in QA.items() if k != "option"}
    questions.write_text(json.dumps(QA) + "\n" + json.dumps({**no_option, "qa_id": "angry:conv-0#q0001"}) + "\n")
    with pytest.raises(DatasetFormatError) as exc:
        load_scriptmem(conversations)
    assert str(exc.value) == (f"{questions}: item 1 (qa_id 'angry:conv-0#q0001'): field 'option': missing; expected "
                              "a list of at least two options 'A. ...', 'B. ...'")
    questions.write_text(json.dumps(QA) + "\n")
    bad = script("angry")
    bad["conversation"]["session_1"][1]["text"] = 42
    conversations.write_text(json.dumps(bad) + "\n")
    with pytest.raises(DatasetFormatError) as exc:
        load_scriptmem(conversations)
    assert str(exc.value) == (f"{conversations}: item 0 (conversation_id 'angry:conv-0'): field "
                              "'conversation.session_1[1].text': expected non-empty text, got an integer 42")
    conversations.write_text(json.dumps(script("angry"))[:-1] + "\n")
    with pytest.raises(DatasetFormatError, match=r"conversations.jsonl: line 1: not JSON \("):
        load_scriptmem(conversations)
    conversations.write_text("")
    with pytest.raises(DatasetFormatError, match=r"conversations.jsonl: empty file; expected one conversation"):
        load_scriptmem(conversations)


def test_conversation_errors():
    with pytest.raises(ValueError, match=r"no conversation for \['angry:conv-0'\]"):
        parse_scriptmem([QA], [script("enemy")])
    bad = script("angry", date="22/09/1994")
    with pytest.raises(ValueError, match="malformed session date '22/09/1994'"):
        parse_scriptmem([QA], [bad])
    bad = script("angry")
    bad["conversation"]["session_1"][0]["type"] = "stage_direction"
    with pytest.raises(DatasetFormatError, match=r"'conversation.session_1\[0\].type': turn 'D1:1': type 'stage_direction'"):
        parse_scriptmem([QA], [bad])
    bad = script("angry")
    bad["conversation"]["session_1"][0]["speaker"] = None
    with pytest.raises(ValueError, match="needs a speaker"):
        parse_scriptmem([QA], [bad])
    with pytest.raises(ValueError, match="appears twice"):
        parse_scriptmem([QA], [script("angry"), script("angry")])


def test_session_dates():
    assert parse_session_date("September 22, 1994", where="x") == day("1994-09-22")
    assert parse_session_date("May 7 2001", where="x") == day("2001-05-07")
    assert parse_session_date("Unknown", where="x") is None
    for value in ("unknown", "", "1994-09-22", "Septober 22, 1994", "February 30, 1994", None):
        with pytest.raises(ValueError, match="malformed session date"):
            parse_session_date(value, where="friends-conv-0 session_1_date_time")


def test_split_question_keeps_stem_and_format_sentence():
    text = "Stem?\n\nA. one\nB. two\n\nPlease answer (X)."
    assert split_question(text, ["A. one", "B. two"], qa_id="x") == "Stem?\n\nPlease answer (X)."
    assert split_question("Stem?\nA. one\nB. two", ["A. one", "B. two"], qa_id="x") == "Stem?"


def test_docstring_examples():
    import doctest

    result = doctest.testmod(scriptmem)
    assert result.failed == 0 and result.attempted >= 3


# ---------------------------------------------------------------- one tiny run through Ray


def _recording_participant(bodies: list[dict]) -> FastAPI:
    app = FastAPI()

    @app.post("/add")
    async def add(request: Request):
        b = await request.json()
        return {"success": True, "request_id": b["request_id"], "user_id": b["user_id"], "session_id": b["session_id"]}

    @app.post("/search")
    async def search(request: Request):
        body = await request.json()
        if not body["user_id"].endswith(":preflight"):  # the run's pre-flight probe (aml_ray.run.preflight) is no sample
            bodies.append(body)
        return {"data": [{"id": "m1", "content": "Juror #8: It's possible."}]}

    return app


@needs_files
@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_run_through_ray_sends_options_and_scores_letters(operator_dir, tmp_path):
    from pydantic import SecretStr

    from aml_ray.actors.participant import ParticipantSpec
    from aml_ray.config import ModelEndpoint, model_endpoint_from_env
    from aml_ray.run.evaluation import EvaluationConfig, evaluate
    from tests.fake_openai import FakeOpenAI, Reply
    from tests.servers import ThreadServer

    raw = [r for r in read_jsonl(QUESTIONS) if r["source"] == "angry"]
    gold = {r["question"].split("\n")[0]: r["answer_letters"] for r in raw}
    sabotaged = {r["question"].split("\n")[0] for r in raw if r["qa_index"] % 4 == 0}

    def answer(prompt: str, n: int) -> Reply:
        stem = prompt.split("Question: ")[1].split("\n")[0]
        letters = gold[stem] + gold[stem][:1] if stem in sabotaged else gold[stem]  # a repeated letter: 0
        return Reply("(" + ", ".join(letters) + ")")

    bodies: list[dict] = []
    with ThreadServer(FakeOpenAI(answer).app) as llm, ThreadServer(_recording_participant(bodies)) as part:
        result = evaluate(EvaluationConfig(
            dataset="scriptmem", participant=ParticipantSpec(add_url=f"{part.base_url}/add",
                                                             search_url=f"{part.base_url}/search"),
            answer=ModelEndpoint(role="answer", base_url=f"{llm.base_url}/v1", model="answer-model",
                                 api_key=SecretStr("sk-a")),
            judge=model_endpoint_from_env("judge", {}), out_dir=tmp_path / "run",
            data_path=operator_dir / "conversations.jsonl", limit_samples=1))
    q = result.questions
    assert q.height == 99 and q["status"].unique().to_list() == ["scored"]
    assert q.filter(pl.col("score") == 0.0).height == len(sabotaged)
    overall = result.table.filter(pl.col("category") == "overall").to_dicts()[0]
    assert overall["accuracy"] == pytest.approx(1 - len(sabotaged) / 99) and overall["coverage"] == 1.0
    # Search got the options and never the gold
    assert len(bodies) == 99 and all(set(b) == {"query", "options", "user_id", "top_k"} for b in bodies)
    by_query = {b["query"]: b for b in bodies}
    for r in raw:
        body = by_query[next(x for x in q["question"].to_list() if x.startswith(r["question"].split("\n")[0]))]
        assert body["options"] == r["option"]
    assert result.run_info["bundle"]["counts_checked"] is True
