"""PersonaMem v1 adapter on small files built here in the released layout (questions CSV + shared contexts
JSONL; MANIFEST.md section 2), and the single-choice option match."""

from __future__ import annotations

import csv
import doctest
import json

import pytest

from aml_ray.datasets import personamem
from aml_ray.datasets.personamem import contexts_file_for, load_personamem, parse_options
from aml_ray.datasets.registry import get_dataset
from aml_ray.datasets.validate import DatasetFormatError
from aml_ray.prompts import load_prompt
from aml_ray.stages.scorers import get_scorer
from aml_ray.suite import DatasetCountMismatch, verify_loaded_bundle

COLUMNS = ["persona_id", "question_id", "question_type", "topic", "context_length_in_tokens",
           "user_question_or_message", "correct_answer", "all_options", "shared_context_id",
           "end_index_in_shared_context", "distance_to_ref_in_blocks"]
OPTIONS = ["(a) Try the new vegan ramen place.", "(b) A steakhouse downtown.", "(c) Skip dinner.",
           "(d) The sushi bar you went to last year."]


def context(n: int) -> list[dict]:
    msgs = [{"role": "system", "content": "Current user persona: Kanoa, 29, a nurse in Honolulu."}]
    for i in range(1, n):
        role = "user" if i % 2 else "assistant"
        msgs.append({"role": role, "content": f"{role} turn {i}: " + ("I became vegan." if i == 3 else "chat")})
    msgs.append({"role": "user", "content": ""})  # empty content is dropped
    return msgs


def write_split(tmp_path, rows: list[dict], contexts: dict[str, list[dict]], size: str = "32k", pair_form=False):
    folder = tmp_path / "personamem"
    folder.mkdir(exist_ok=True)
    q = folder / f"questions_{size}.csv"
    with open(q, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({c: "" for c in COLUMNS} | r)
    lines = [json.dumps({"shared_context_id": k, "messages": v} if pair_form else {k: v}, ensure_ascii=False)
             for k, v in contexts.items()]
    (folder / f"shared_contexts_{size}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return q


def row(qid, ctx, end, qtype="recall_user_shared_facts", gold="(a)", options=OPTIONS):
    return {"persona_id": "7", "question_id": qid, "question_type": qtype, "topic": "food",
            "user_question_or_message": f"What should I eat tonight? ({qid})", "correct_answer": gold,
            "all_options": json.dumps(options), "shared_context_id": ctx, "end_index_in_shared_context": str(end)}


@pytest.fixture
def split(tmp_path):
    rows = [row("q1", "ctxA", 6), row("q2", "ctxA", 6, qtype="suggest_new_ideas", gold="(d)"),
            row("q3", "ctxA", 4, qtype="acknowledge_latest_user_preferences", gold="(b)"),
            row("q4", "ctxB", 3)]
    return write_split(tmp_path, rows, {"ctxA": context(8), "ctxB": context(5)})


def test_questions_sharing_a_context_prefix_share_a_sample(split):
    samples = load_personamem(split)
    assert [(s.sample_id, [q.question_id for q in s.questions]) for s in samples] == [
        ("ctxA-6", ["q1", "q2"]), ("ctxA-4", ["q3"]), ("ctxB-3", ["q4"])]
    q = samples[0].questions[1]
    assert q.category == "suggest_new_ideas" and q.answer == "(d)" and q.options == tuple(OPTIONS)
    assert q.question == "What should I eat tonight? (q2)"


def test_a_question_never_sees_messages_after_its_end_index(split):
    samples = {s.sample_id: s for s in load_personamem(split)}
    full = context(8)
    for sid, end in (("ctxA-6", 6), ("ctxA-4", 4), ("ctxB-3", 3)):
        (session,) = samples[sid].sessions
        assert session.key == "context" and session.started_at_ms == 0
        src = (full if sid.startswith("ctxA") else context(5))[:end]
        assert [(m.role, m.content) for m in session.messages] == [(m["role"], m["content"]) for m in src]
        assert all(m.timestamp is None for m in session.messages)
    assert "I became vegan." not in " ".join(m.content for m in samples["ctxB-3"].sessions[0].messages)
    assert samples["ctxA-4"].sessions[0].messages[0].role == "system"


def test_both_context_line_forms_are_read(tmp_path):
    q = write_split(tmp_path, [row("q1", "ctx", 2)], {"ctx": context(3)}, size="128k", pair_form=True)
    assert contexts_file_for(q).name == "shared_contexts_128k.jsonl"
    assert len(load_personamem(q)[0].sessions[0].messages) == 2


def test_a_unicode_line_separator_inside_a_message_does_not_split_the_line(tmp_path):
    ctx = context(3)
    ctx[1]["content"] = "line\u2028separator"
    q = write_split(tmp_path, [row("q1", "ctx", 3)], {"ctx": ctx})
    assert load_personamem(q)[0].sessions[0].messages[1].content == "line\u2028separator"


@pytest.mark.parametrize(("patch", "field", "needle"), [
    ({"shared_context_id": "nope"}, "shared_context_id", "is not in the contexts file"),
    ({"end_index_in_shared_context": "99"}, "end_index_in_shared_context", "outside the context's"),
    ({"end_index_in_shared_context": "x"}, "end_index_in_shared_context", "is not a number"),
    ({"correct_answer": "(e)"}, "correct_answer", "is not one of the option labels"),
    ({"all_options": "not a list"}, "all_options", "all_options is not a list"),
    ({"all_options": json.dumps(["tea", "coffee"])}, "all_options", "lacks its '(x)' label"),
    ({"question_id": ""}, "question_id", "is empty or repeats"),
])
def test_bad_rows_are_refused_naming_the_file_line_and_column(tmp_path, patch, field, needle):
    q = write_split(tmp_path, [row("q0", "ctx", 2), row("q1", "ctx", 2) | patch], {"ctx": context(3)})
    with pytest.raises(DatasetFormatError) as exc:
        load_personamem(q)
    item = "line 3" + (" (question_id 'q1')" if patch.get("question_id") != "" else "")
    assert str(exc.value).startswith(f"{q}: {item}: field {field!r}: ") and needle in str(exc.value)


def test_a_row_with_fewer_cells_and_a_bad_context_message_are_named(tmp_path):
    q = write_split(tmp_path, [row("q1", "ctx", 2)], {"ctx": context(3)})
    q.write_text(q.read_text(encoding="utf-8") + "7,q2,recall_user_shared_facts\n", encoding="utf-8")
    with pytest.raises(DatasetFormatError) as exc:
        load_personamem(q)
    assert str(exc.value) == (f"{q}: line 3 (question_id 'q2'): field 'topic': expected a cell (the row has "
                              "fewer cells than the header), got null")
    bad = context(3)
    bad[1] = {"role": "narrator", "content": "x"}
    q = write_split(tmp_path, [row("q1", "ctx", 2)], {"ctx": bad})
    with pytest.raises(DatasetFormatError) as exc:
        load_personamem(q)
    assert str(exc.value) == (f"{contexts_file_for(q)}: line 1: field 'ctx[1].role': role 'narrator'; expected "
                              "one of ['user', 'assistant', 'system']")


def test_missing_columns_and_bad_names_are_refused(tmp_path):
    folder = tmp_path / "pm"
    folder.mkdir()
    (folder / "questions_32k.csv").write_text("question_id,question_type\nq1,x\n")
    (folder / "shared_contexts_32k.jsonl").write_text("")
    with pytest.raises(DatasetFormatError, match=r"questions_32k.csv: header: lacks columns \['persona_id'"):
        load_personamem(folder / "questions_32k.csv")
    (folder / "questions_32k.csv").write_text(",".join(COLUMNS) + "\n")
    with pytest.raises(DatasetFormatError, match="questions_32k.csv: header: no question rows"):
        load_personamem(folder / "questions_32k.csv")
    with pytest.raises(ValueError, match="questions_<size>.csv"):
        contexts_file_for(folder / "questions.csv")
    write_split(tmp_path, [row("q1", "ctx", 2)], {"ctx": context(3)})
    (tmp_path / "personamem" / "shared_contexts_32k.jsonl").write_text("\n")
    with pytest.raises(DatasetFormatError, match=r"shared_contexts_32k.jsonl: empty file; expected one"):
        load_personamem(tmp_path / "personamem" / "questions_32k.csv")


def test_python_literal_options_are_accepted():
    assert parse_options(str(OPTIONS), question_id="q") == tuple(OPTIONS)


def test_unpinned_bundle_is_count_checked_unless_allowed(split):
    samples = load_personamem(split)
    with pytest.raises(DatasetCountMismatch, match="total 4 != 589"):
        verify_loaded_bundle("personamem", split, samples)
    assert verify_loaded_bundle("personamem", split, samples, allow_hash_mismatch=True)["counts_checked"] is False


def _answered(answer, gold="(c)", options=OPTIONS, **kw):
    return {"question_id": "q", "gold": json.dumps(gold), "answer": answer, "options": options,
            "answer_status": "ok", "search_status": "ok", "category": "recall_user_shared_facts", **kw}


@pytest.mark.parametrize(("answer", "verdict", "letters"), [
    # read as PersonaMem's Evaluation.extract_answer reads replies (aml_ray/scoring/personamem_choice.py)
    ("(c)", "CORRECT", ["C"]),
    ("C", "CORRECT", ["C"]),
    ("Answer: (c) Skip dinner.", "CORRECT", ["C"]),
    ("<final_answer> c", "CORRECT", ["C"]),
    ("The answer is c", "CORRECT", ["C"]),
    ("(b)", "WRONG", ["B"]),
    ("(a) or (c)", "WRONG", ["A", "C"]),
    ("(e)", "WRONG", []),
    ("I would skip dinner.", "WRONG", []),
    ("", "WRONG", []),
])
async def test_single_choice_matches_exactly_one_gold_label(answer, verdict, letters):
    r = _answered(answer)
    await get_scorer("single_choice")([r])
    assert r["verdict"] == verdict and r["score"] == (1.0 if verdict == "CORRECT" else 0.0)
    assert r["status"] == "scored" and json.loads(r["score_detail"])["letters"] == letters


async def test_single_choice_keeps_errors_in_the_denominator():
    rows = [_answered(None, answer_status="error", search_status="ok"),
            _answered(None, answer_status="skipped", search_status="error"),
            _answered("(c)", options=[]), _answered("(c)", gold="the third one")]
    await get_scorer("single_choice")(rows)
    assert [r["status"] for r in rows] == ["answer_error", "search_error", "judge_error", "judge_error"]
    assert "has no options" in rows[2]["judge_error"] and "not one option label" in rows[3]["judge_error"]


def test_answer_prompt_lists_the_options_and_asks_for_a_label():
    text = load_prompt("personamem_answer").render(question="What should I eat?", options=list(OPTIONS),
                                                   memory_blocks=[], speakers=[], question_date=None)
    assert all(o in text for o in OPTIONS) and "for example (b)" in text


def test_registry_declaration():
    spec = get_dataset("personamem")
    assert (spec.scorer, spec.answer_prompt, spec.judge_prompt) == ("single_choice", "personamem_answer", "option_match")


def test_docstring_examples():
    result = doctest.testmod(personamem)
    assert result.failed == 0 and result.attempted > 0
