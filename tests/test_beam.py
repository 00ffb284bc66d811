"""BEAM 100K adapter on the real files in ../shared/datasets (never copied into the repo), plus small cases."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pytest

from aml_ray.datasets import beam
from aml_ray.datasets.beam import (
    ABILITIES,
    BEAM_100K_FILES,
    EXPECTED_COUNTS,
    QUESTIONS_FILE,
    load_beam,
    parse_beam_conversation,
    parse_time_anchor,
    resolve_beam,
)
from aml_ray.datasets.chunking import MAX_CHUNK_MESSAGES, chunk_sample
from aml_ray.datasets.fetch import DatasetHashMismatch
from aml_ray.datasets.validate import DatasetFormatError
from aml_ray.datasets.registry import get_dataset
from aml_ray.ids import IdScheme
from aml_ray.run.inputs import build_inputs
from aml_ray.prompts import load_prompt
from tests.conftest import SHARED_DATASETS

BEAM_DIR = SHARED_DATASETS / "beam" / "100K"
# The benchmark files come from ../shared/datasets (never copied here); a missing file fails, never skips.
needs_files = pytest.mark.usefixtures("_require_needs_files")


@pytest.fixture
def _require_needs_files() -> None:
    assert BEAM_DIR.exists(), f"{BEAM_DIR} is missing: tests read the benchmarks from ../shared/datasets"


@pytest.fixture(scope="module")
def samples():
    return load_beam(BEAM_DIR)


def day(s: str) -> int:
    return int(datetime.strptime(s, "%Y-%m-%d").replace(tzinfo=timezone.utc).timestamp()) * 1000


# ---------------------------------------------------------------- real files


@needs_files
def test_counts_equal_the_manifest(samples):
    messages = [m for s in samples for sess in s.sessions for m in sess.messages]
    questions = [q for s in samples for q in s.questions]
    assert len(samples) == EXPECTED_COUNTS["conversations"] == 20
    assert sum(len(s.sessions) for s in samples) == EXPECTED_COUNTS["batches"] == 82
    assert len(messages) == EXPECTED_COUNTS["messages"] == 5094
    assert Counter(m.role for m in messages) == {"user": 2547, "assistant": 2547}
    assert len(questions) == EXPECTED_COUNTS["questions"] == 400
    assert Counter(q.category for q in questions) == {a: 40 for a in ABILITIES}
    assert all(s.questions and Counter(q.category for q in s.questions) == {a: 2 for a in ABILITIES} for s in samples)


@needs_files
def test_resolve_verifies_every_pinned_file(tmp_path):
    assert len(BEAM_100K_FILES) == 40
    assert resolve_beam(BEAM_DIR, cache_dir=tmp_path) == BEAM_DIR
    assert resolve_beam(SHARED_DATASETS, cache_dir=tmp_path) == BEAM_DIR  # the datasets root is accepted too


@needs_files
def test_samples_sessions_and_dates(samples):
    first = samples[0]
    assert [s.sample_id for s in samples] == [f"conv-{n}" for n in range(1, 21)]
    assert [s.key for s in first.sessions] == ["batch_1", "batch_2", "batch_3"]
    # the first message of each batch carries the date ("March-15-2024"); midnight UTC + position in ms
    assert [s.started_at_ms for s in first.sessions] == [day("2024-03-15"), day("2024-04-05"), day("2024-04-25")]
    msgs = first.sessions[0].messages
    assert [m.timestamp for m in msgs[:3]] == [day("2024-03-15"), day("2024-03-15") + 1, day("2024-03-15") + 2]
    assert msgs[0].role == "user" and msgs[0].content.endswith("->-> 1,1")  # content verbatim
    assert first.speakers == ()
    # conversation 5 reads chat_trunecated.json (the file upstream prefers), conversation 1 chat.json
    assert beam.chat_file(BEAM_DIR / "5").name == "chat_trunecated.json"
    assert beam.chat_file(BEAM_DIR / "1").name == "chat.json"


@needs_files
def test_questions_carry_rubric_gold_and_evidence(samples):
    qs = {q.question_id: q for s in samples for q in s.questions}
    q = qs["conv-1:information_extraction:q0"]
    assert (q.question, q.answer) == ("When does my first sprint end?", "My first sprint ends on March 29.")
    assert q.rubric == ("LLM response should state: March 29",) and q.evidence == ("28",)
    eo = qs["conv-1:event_ordering:q0"]
    assert eo.rubric == ("Core functionality", "Transaction error handling", "Security and deployment")
    assert qs["conv-1:contradiction_resolution:q0"].evidence == ("58", "24")  # dict of lists, flattened
    assert qs["conv-1:abstention:q0"].answer.startswith("Based on the provided chat, there is no information")
    assert all(q.rubric and q.options is None and q.excluded_reason is None for q in qs.values())


@needs_files
def test_question_rows_and_chunks(samples, tmp_path):
    inputs = build_inputs(samples[:1], IdScheme("run_test", "beam"), out_dir=tmp_path)
    rows = inputs.sample_row(0)["questions"]
    assert len(rows) == 20 and inputs.n_scorable == 20
    assert rows[0]["user_id"] == "eval:run_test:beam:conv-1" and rows[0]["options"] is None
    assert all(r["rubric"] for r in rows)
    chunks = chunk_sample(samples[0])
    assert all(len(c.messages) <= MAX_CHUNK_MESSAGES for c in chunks)
    assert {c.session_key for c in chunks} == {"batch_1", "batch_2", "batch_3"}


def test_registry_declaration():
    spec = get_dataset("beam")
    assert (spec.scorer, spec.answer_prompt, spec.judge_prompt) == ("rubric_judge", "beam_answer", "beam_rubric_judge")
    assert set(spec.category_names) == set(ABILITIES)
    for name in (spec.answer_prompt, spec.judge_prompt):
        load_prompt(name)


# ---------------------------------------------------------------- small cases


def chat(*batches) -> list[dict]:
    return [{"batch_number": i + 1, "time_anchor": None, "turns": turns} for i, turns in enumerate(batches)]


def msg(role, id_, content="hello", **kw) -> dict:
    return {"role": role, "id": id_, "content": content, **kw}


PROBING = {"abstention": [{"question": "Q?", "ideal_response": "No info.", "rubric": ["say no info"]}]}


def test_a_later_time_anchor_moves_the_date_and_a_batch_anchor_wins():
    data = chat([[msg("user", 0, time_anchor="May-02-2024"), msg("assistant", 1)],
                 [msg("user", 2, time_anchor="May-09-2024"), msg("assistant", 3)]])
    data[0]["time_anchor"] = "May-01-2024"
    sample = parse_beam_conversation("conv-x", data, PROBING)
    stamps = [m.timestamp for m in sample.sessions[0].messages]
    assert stamps == [day("2024-05-01"), day("2024-05-01") + 1, day("2024-05-09") + 2, day("2024-05-09") + 3]
    assert sample.questions[0].answer == "No info." and sample.questions[0].category == "abstention"


@pytest.mark.parametrize("anchor, why", [("2024-03-15", "does not match"), ("Smarch-15-2024", "unknown month"),
                                         ("February-30-2024", "day is out of range"), (15, "not a string")])
def test_malformed_date_is_an_error(anchor, why):
    with pytest.raises(DatasetFormatError, match=why):
        parse_time_anchor(anchor, where="conv-x batch 1")
    data = chat([[msg("user", 0, time_anchor=anchor), msg("assistant", 1)]])
    with pytest.raises(DatasetFormatError) as exc:
        parse_beam_conversation("conv-x", data, PROBING)
    assert str(exc.value).startswith(f"conv-x item 0 (batch_number 1): field 'turns[0][0].time_anchor': "
                                     f"malformed time_anchor {anchor!r} (")


def test_missing_date_is_an_error_never_now():
    with pytest.raises(DatasetFormatError, match=r"conv-x item 0 \(batch_number 1\): field 'time_anchor': missing on "
                                                 "the batch and on its first message"):
        parse_beam_conversation("conv-x", chat([[msg("user", 0), msg("assistant", 1)]]), PROBING)


@pytest.mark.parametrize("bad, match", [
    ({"role": "system"}, "field 'turns[0][1].role': role 'system' is not one of"),
    ({"content": "  "}, "field 'turns[0][1].content': expected non-empty text, got a string '  '"),
    ({"content": None}, "field 'turns[0][1].content': expected non-empty text, got null"),
])
def test_bad_messages_are_errors(bad, match):
    data = chat([[msg("user", 0, time_anchor="May-02-2024"), {**msg("assistant", 1), **bad}]])
    with pytest.raises(DatasetFormatError, match=re.escape(match)):
        parse_beam_conversation("conv-x", data, PROBING)


def test_bad_questions_are_errors():
    data = chat([[msg("user", 0, time_anchor="May-02-2024")]])
    with pytest.raises(ValueError, match="unknown ability types"):
        parse_beam_conversation("conv-x", data, {"telepathy": []})
    with pytest.raises(DatasetFormatError) as exc:
        parse_beam_conversation("conv-x", data, {"abstention": [{"question": "Q?", "rubric": []}]})
    assert str(exc.value) == ("conv-x abstention[0] (question_id 'conv-x:abstention:q0'): field 'rubric': "
                              "expected a non-empty list of non-empty strings, got an empty list")
    with pytest.raises(DatasetFormatError, match=r"field 'question': missing; expected a non-empty string"):
        parse_beam_conversation("conv-x", data, {"abstention": [{"rubric": ["say no"]}]})


def test_a_malformed_file_is_named(tmp_path):
    """The chat file and the questions file are named apart (the batch or question, and the field)."""
    conv = tmp_path / "100K" / "1"
    conv.mkdir(parents=True)
    (conv / "chat.json").write_text(json.dumps(chat([[msg("user", 0, time_anchor="May-02-2024"), "hi"]])))
    (conv / QUESTIONS_FILE).write_text(json.dumps(PROBING))
    with pytest.raises(DatasetFormatError) as exc:
        load_beam(tmp_path)
    assert str(exc.value) == (f"{conv / 'chat.json'}: conv-1 item 0 (batch_number 1): field 'turns[0][1]': "
                              "expected a message object, got a string 'hi'")
    (conv / "chat.json").write_text(json.dumps(chat([[msg("user", 0, time_anchor="May-02-2024")]])))
    (conv / QUESTIONS_FILE).write_text("")
    with pytest.raises(DatasetFormatError) as exc:
        load_beam(tmp_path)
    assert str(exc.value) == f"{conv / QUESTIONS_FILE}: empty file; expected an object keyed by ability"


def _link_tier(dest: Path, *, altered: str | None = None) -> None:
    """A tier directory of symlinks to the shared files (nothing copied); ``altered`` gets other bytes."""
    for rel in BEAM_100K_FILES:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if rel == altered:
            target.write_bytes((BEAM_DIR / rel).read_bytes() + b"\n")
        else:
            os.symlink(BEAM_DIR / rel, target)


@needs_files
def test_hash_mismatch_is_refused_unless_allowed(tmp_path):
    _link_tier(tmp_path / "100K", altered="3/probing_questions.json")
    with pytest.raises(DatasetHashMismatch, match="3/probing_questions.json"):
        resolve_beam(tmp_path, cache_dir=tmp_path / "cache")
    assert resolve_beam(tmp_path, cache_dir=tmp_path / "cache", allow_hash_mismatch=True) == tmp_path / "100K"


@needs_files
def test_missing_file_and_layout_are_refused(tmp_path):
    _link_tier(tmp_path / "100K")
    (tmp_path / "100K" / "7" / "chat_trunecated.json").unlink()
    with pytest.raises(FileNotFoundError, match="lacks 1 pinned file"):
        resolve_beam(tmp_path / "100K", cache_dir=tmp_path / "cache")
    with pytest.raises(FileNotFoundError, match="BEAM 100K data not found"):
        resolve_beam(tmp_path / "nowhere", cache_dir=tmp_path / "cache")


@needs_files
def test_a_verified_cache_is_used_without_download(tmp_path):
    _link_tier(tmp_path / "beam" / "100K")
    assert resolve_beam(None, cache_dir=tmp_path) == tmp_path / "beam" / "100K"
