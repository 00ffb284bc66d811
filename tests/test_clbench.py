"""CL-bench adapter on a small JSONL built here in the published layout (messages, rubrics, metadata), and
the all-or-nothing rubric judge on fixed cases."""

from __future__ import annotations

import doctest
import json

import pytest

from aml_ray.config import model_endpoint_from_env
from aml_ray.datasets import clbench
from aml_ray.datasets.clbench import MAX_QUESTION_CHARS, load_clbench, parse_task
from aml_ray.datasets.registry import get_dataset
from aml_ray.datasets.validate import DatasetFormatError
from aml_ray.prompts import load_prompt
from aml_ray.stages import rubric_all_or_nothing as aon
from aml_ray.stages.rubric_all_or_nothing import MetParseError, parse_met
from aml_ray.stages.scorers import get_scorer
from aml_ray.suite import DatasetCountMismatch, verify_loaded_bundle

RULE_BOOK = "RULE BOOK\nTwisted Cryptids\n\nRule 1: a Sighting card is revealed at an Encounter.\n\nRule 2: decoys score 2."


def task(tid="t1", *, messages=None, rubrics=None, category="Rule System Application", context_id="c1"):
    return {"messages": messages or [{"role": "system", "content": "You are a rules referee for the game."},
                                     {"role": "user", "content": RULE_BOOK + "\n\nWhat is a Sighting card?"}],
            "rubrics": rubrics or ["The response should say it is revealed at an Encounter.",
                                   {"rubric_criteria": "The response should cite Rule 1."}],
            "metadata": {"task_id": tid, "context_id": context_id, "context_category": category,
                         "sub_category": "Game Mechanics"}}


def write(tmp_path, tasks, sep="\n"):
    path = tmp_path / "clbench" / "CL-bench.jsonl"
    path.parent.mkdir(exist_ok=True)
    path.write_text(sep.join(json.dumps(t, ensure_ascii=False) for t in tasks) + "\n", encoding="utf-8")
    return path


def test_context_goes_to_memory_and_the_last_paragraph_is_the_question(tmp_path):
    multi = task("t2", category="Procedural Task Execution", messages=[
        {"role": "system", "content": "You follow the lab manual."},
        {"role": "user", "content": "Manual: step A, then step B."},
        {"role": "assistant", "content": "Understood: A then B."},
        {"role": "user", "content": "What comes after step A?"}])
    samples = load_clbench(write(tmp_path, [task(), multi]))
    assert [s.sample_id for s in samples] == ["t1", "t2"]
    (session,) = samples[0].sessions
    assert [m.role for m in session.messages] == ["system", "user"]
    assert session.messages[1].content == RULE_BOOK and session.messages[0].timestamp is None
    q = samples[0].questions[0]
    assert (q.question_id, q.question, q.category, q.answer) == ("t1", "What is a Sighting card?",
                                                                 "Rule System Application", None)
    assert q.rubric == ("The response should say it is revealed at an Encounter.", "The response should cite Rule 1.")
    assert q.evidence == ("c1", "Game Mechanics")
    # a final turn without a blank line is the question as a whole; earlier turns are memory
    assert [m.content for m in samples[1].sessions[0].messages] == [
        "You follow the lab manual.", "Manual: step A, then step B.", "Understood: A then B."]
    assert samples[1].questions[0].question == "What comes after step A?"


def test_an_oversized_last_paragraph_is_not_split():
    long_tail = "x" * (MAX_QUESTION_CHARS + 1)
    s = parse_task(task(messages=[{"role": "user", "content": "lead\n\n" + long_tail}]))
    assert s.sessions == () and s.questions[0].question == "lead\n\n" + long_tail


def test_unicode_line_separators_inside_strings_do_not_split_records(tmp_path):
    t = task()
    t["messages"][1]["content"] = RULE_BOOK.replace("Rule 2", "Rule\u20282") + "\n\nWhy?"
    assert len(load_clbench(write(tmp_path, [t, task("t2")]))) == 2


@pytest.mark.parametrize(("mutate", "expected"), [
    (lambda t: t["metadata"].pop("task_id"),
     "line 3: field 'metadata.task_id': missing; expected a non-empty string or an integer"),
    (lambda t: t["metadata"].pop("context_category"),
     "line 3 (task_id 't1'): field 'metadata.context_category': missing; expected a non-empty string"),
    (lambda t: t.update(rubrics=[]),
     "line 3 (task_id 't1'): field 'rubrics': expected a non-empty list of rubric items, got an empty list"),
    (lambda t: t.update(rubrics=[{"weight": 1}]),
     "line 3 (task_id 't1'): field 'rubrics[0]': expected text or {rubric_criteria: text}, got an object"),
    (lambda t: t["messages"].append({"role": "assistant", "content": "reference answer"}),
     "line 3 (task_id 't1'): field 'messages[2].role': the last message is 'assistant', not the user's task"),
    (lambda t: t["messages"].append({"role": "tool", "content": "x"}),
     "line 3 (task_id 't1'): field 'messages[2].role': role 'tool'; expected one of ['system', 'user', 'assistant']"),
    (lambda t: t["messages"][0].update(content="  "),
     "line 3 (task_id 't1'): field 'messages[0].content': expected non-empty text, got a string '  '"),
    (lambda t: t.pop("messages"), "line 3 (task_id 't1'): field 'messages': missing; expected a non-empty list of "
                                  "messages {role, content}"),
    (lambda t: t.update(metadata="t1"), "line 3: field 'metadata': expected an object {task_id, context_id, "
                                        "context_category, sub_category}, got a string 't1'"),
])
def test_bad_tasks_are_refused_naming_the_line_task_and_field(mutate, expected):
    t = task()
    mutate(t)
    with pytest.raises(DatasetFormatError) as exc:
        parse_task(t, line=3)
    assert str(exc.value) == expected


def test_repeated_task_bad_json_and_empty_file_name_the_file_and_line(tmp_path):
    path = write(tmp_path, [task(), task()])
    with pytest.raises(DatasetFormatError) as exc:
        load_clbench(path)
    assert str(exc.value) == f"{path}: line 2: field 'metadata.task_id': task_id 't1' occurs twice"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [\n')
    with pytest.raises(DatasetFormatError, match=r"bad.jsonl: line 1: not JSON \("):
        load_clbench(bad)
    bad.write_text("\n\n")
    with pytest.raises(DatasetFormatError, match=r"bad.jsonl: empty file; expected one CL-bench task object per line"):
        load_clbench(bad)
    bad.write_text(json.dumps(task()) + "\n" + json.dumps(["not", "a", "task"]) + "\n")
    with pytest.raises(DatasetFormatError) as exc:
        load_clbench(bad)
    assert str(exc.value) == (f"{bad}: line 2: expected a task object {{messages, rubrics, metadata}}, got a list")


def test_unpinned_bundle_is_count_checked_unless_allowed(tmp_path):
    path = write(tmp_path, [task()])
    with pytest.raises(DatasetCountMismatch, match="total 1 != 1899"):
        verify_loaded_bundle("clbench", path, load_clbench(path))
    assert verify_loaded_bundle("clbench", path, load_clbench(path), allow_hash_mismatch=True)["bundle"] == "clbench"


# --- the all-or-nothing rubric judge -------------------------------------------------------------------

class ScriptedJudge:
    """A judge model stand-in replying from a script, one reply per call in order."""

    def __init__(self, *replies):
        self.replies = list(replies)
        self.calls: list[dict] = []

    async def complete_batch(self, batch, **kw):
        self.calls.append({"prompts": [m[0]["content"] for m in batch], **kw})
        out = []
        for _ in batch:
            text = self.replies.pop(0)
            out.append({"status": "ok" if text else "error", "text": text, "attempts": 1,
                        "error": None if text else "empty reply"})
        return out


ONLINE = model_endpoint_from_env("judge", {"JUDGE_API_BASE": "http://judge.invalid/v1", "JUDGE_MODEL": "m"})
OFFLINE = model_endpoint_from_env("judge", {})
THREE = ["Names the card.", "Cites rule 1.", "Says decoys score 2."]


def rubric_row(answer="A Sighting card is revealed at an Encounter (Rule 1); decoys score 2.", rubric=THREE, **kw):
    return {"question_id": "t1", "question": "What is a Sighting card?", "answer": answer, "rubric": rubric,
            "gold": "null", "answer_status": "ok", "search_status": "ok", "category": "Rule System Application",
            "judge_status": None, **kw}


@pytest.mark.parametrize(("reply", "score", "verdict"), [
    ('1. met\n2. met\n3. met\n{"met": [true, true, true]}', 1.0, "CORRECT"),
    ('{"met": [true, false, true]}', 0.0, "WRONG"),       # one unmet item fails the task
    ('{"met": ["yes", "no", "no"]}', 0.0, "WRONG"),
])
async def test_a_task_scores_one_only_when_every_item_is_met(reply, score, verdict):
    r = rubric_row()
    judge = ScriptedJudge(reply)
    await get_scorer("rubric_all_or_nothing")([r], endpoint=ONLINE, model=judge, prompt=load_prompt("clbench_judge"))
    assert (r["score"], r["verdict"], r["status"]) == (score, verdict, "scored")
    detail = json.loads(r["score_detail"])
    assert detail["n_items"] == 3 and detail["met"] == parse_met(reply, 3)
    prompt = judge.calls[0]["prompts"][0]
    assert all(f"{i}. {item}" in prompt for i, item in enumerate(THREE, start=1))


async def test_an_unusable_reply_is_asked_again_then_recorded_as_judge_error():
    ok, bad = rubric_row(), rubric_row()
    judge = ScriptedJudge('{"met": [true, true, true]}', '{"met": [true]}', "", "no json at all")
    await get_scorer("rubric_all_or_nothing")([ok, bad], endpoint=ONLINE, model=judge,
                                              prompt=load_prompt("clbench_judge"), max_parse_retries=2)
    assert ok["status"] == "scored" and ok["score"] == 1.0
    assert bad["status"] == "judge_error" and bad["score"] is None and bad["judge_attempts"] == 3
    assert "no {\"met\"" in bad["judge_error"]
    assert [c["use_cache"] for c in judge.calls] == [True, False, False]  # re-asks bypass the cache


async def test_repeated_judge_runs_keep_every_verdict():
    r = rubric_row()
    judge = ScriptedJudge('{"met": [true, true, true]}', '{"met": [true, false, true]}')
    await get_scorer("rubric_all_or_nothing")([r], endpoint=ONLINE, model=judge, prompt=load_prompt("clbench_judge"),
                                              judge_runs=2)
    assert r["judge_verdicts"] == ["CORRECT", "WRONG"] and r["verdict"] == "CORRECT" and r["score"] == 1.0


async def test_offline_stand_in_and_errors_stay_in_the_denominator():
    rows = [rubric_row(), rubric_row(answer="I do not know."), rubric_row(answer_status="error"),
            rubric_row(search_status="error", answer_status="skipped"), rubric_row(rubric=[])]
    await get_scorer("rubric_all_or_nothing")(rows, endpoint=OFFLINE, model=None, prompt=load_prompt("clbench_judge"))
    assert [r["status"] for r in rows] == ["scored", "scored", "answer_error", "search_error", "judge_error"]
    assert rows[0]["score"] == 1.0 and rows[1]["score"] == 0.0 and "not an official" in rows[0]["judge_raw"]


def test_parse_met_refuses_wrong_lengths_and_values():
    with pytest.raises(MetParseError, match="2 verdicts for 3"):
        parse_met('{"met": [true, true]}', 3)
    with pytest.raises(MetParseError, match="not true/false"):
        parse_met('{"met": [true, "maybe"]}', 2)
    assert parse_met('draft {"met": [false]} final {"met": [true]}', 1) == [True]  # the last object wins


def test_registry_declaration():
    spec = get_dataset("clbench")
    assert (spec.scorer, spec.answer_prompt, spec.judge_prompt) == ("rubric_all_or_nothing", "clbench_answer",
                                                                     "clbench_judge")


@pytest.mark.parametrize("module", [clbench, aon])
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.failed == 0 and result.attempted > 0
