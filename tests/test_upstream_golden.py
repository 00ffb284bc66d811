"""Golden fixtures: small inputs scored here and by each benchmark's own evaluator (issue 26, Textual).

Every expected number below was computed once, by hand, by following the upstream code named next to
it (the sources were read at the commits given; nothing of it runs here). Each block also holds the
test that failed before the change it covers.
"""

from __future__ import annotations

import hashlib
import json

import polars as pl
import pytest
from pydantic import ValidationError

from aml_ray.config import model_endpoint_from_env
from aml_ray.datasets.longmemeval import QUESTION_TYPES, parse_longmemeval
from aml_ray.prompts import PROMPT_DIR, load_prompt
from aml_ray.scoring.aggregate import aggregate
from aml_ray.stages.scorers import get_scorer
from aml_ray.suite import SUITES_DIR, Suite, load_suite

ONLINE = model_endpoint_from_env("judge", {"JUDGE_API_BASE": "http://judge.invalid/v1", "JUDGE_MODEL": "m"})
OFFLINE = model_endpoint_from_env("judge", {})


class ScriptedJudge:
    """A judge model stand-in: ``reply(prompt) -> text``; records every prompt and the call's keywords."""

    def __init__(self, reply):
        self.reply, self.prompts, self.kwargs = reply, [], []

    async def complete_batch(self, batch, **kw):
        self.kwargs.append(kw)
        texts = [m[0]["content"] for m in batch]
        self.prompts += texts
        return [{"status": "ok", "text": self.reply(t), "error": None, "attempts": 1} for t in texts]


# ------------------------------------------------------------------------------------------ LongMemEval

# (question_id, question_type, judge label). Upstream src/evaluation/print_qa_metrics.py
# (xiaowu0162/LongMemEval @ b11ff723) on these labels prints:
#   single-session-user: 0.6667 (3), single-session-preference: 0.5 (2), single-session-assistant: 1.0 (1),
#   multi-session: 0.5 (2), temporal-reasoning: 0.0 (1), knowledge-update: 1.0 (3)
#   Task-averaged Accuracy: 0.6111   Overall Accuracy: 0.6667   Abstention Accuracy: 0.6667 (3)
LME_LABELS = [("q1", "single-session-user", True), ("q2", "single-session-user", False),
              ("q3_abs", "single-session-user", True), ("q4", "single-session-assistant", True),
              ("q5", "single-session-preference", False), ("q6", "single-session-preference", True),
              ("q7", "multi-session", True), ("q8_abs", "multi-session", False), ("q9", "temporal-reasoning", False),
              ("q10", "knowledge-update", True), ("q11", "knowledge-update", True),
              ("q12_abs", "knowledge-update", True)]
LME_BY_TYPE = {"single-session-user": (0.6667, 3), "single-session-preference": (0.5, 2),
               "single-session-assistant": (1.0, 1), "multi-session": (0.5, 2), "temporal-reasoning": (0.0, 1),
               "knowledge-update": (1.0, 3)}
LME_TASK_AVERAGED, LME_OVERALL, LME_ABSTENTION = 0.6111, 0.6667, 0.6667


def _lme_instance(qid: str, qtype: str) -> dict:
    return {"question_id": qid, "question_type": qtype, "question": f"question {qid}", "answer": "gold",
            "question_date": "2023/05/30 (Tue) 23:40", "haystack_dates": ["2023/05/20 (Sat) 08:00"],
            "haystack_session_ids": ["s1"], "haystack_sessions": [[{"role": "user", "content": "hello"}]],
            "answer_session_ids": ["s1"]}


def _lme_rows() -> pl.DataFrame:
    samples = parse_longmemeval([_lme_instance(q, t) for q, t, _ in LME_LABELS])
    labels = {q: ok for q, _, ok in LME_LABELS}
    return pl.DataFrame([{"dataset": "longmemeval_oracle", "question_id": q.question_id, "category": q.category,
                          "excluded": False, "status": "scored",
                          "verdict": "CORRECT" if labels[q.question_id] else "WRONG", "score": None,
                          "f1": None, "bleu1": None} for s in samples for q in s.questions])


def test_longmemeval_types_hold_their_abstention_questions_as_upstream():
    table = {r["category"]: r for r in aggregate(_lme_rows()).to_dicts()}
    assert {t: (round(table[t]["accuracy"], 4), table[t]["n_total"]) for t in QUESTION_TYPES} == LME_BY_TYPE
    assert round(table["overall"]["accuracy"], 4) == LME_OVERALL
    # the task average as aml_ray.run.suite_run.evaluate_suite computes it from the table (the suite's rule)
    avg = load_suite().bundle("longmemeval_oracle").task_averages[0]
    values = [table[c]["accuracy"] for c in avg.categories if table.get(c)]
    assert round(sum(values) / len(values), 4) == LME_TASK_AVERAGED


def test_longmemeval_secondary_metrics_report_task_average_and_abstention():
    from aml_ray.suite import secondary_metrics

    got = secondary_metrics(load_suite().bundle("longmemeval_oracle"), _lme_rows())
    assert {k: round(v, 4) for k, v in got.items()} == {"task-averaged accuracy": LME_TASK_AVERAGED,
                                                       "abstention accuracy": LME_ABSTENTION}


# upstream src/evaluation/evaluate_qa.py get_anscheck_prompt, rendered with question "Q?", answer "A." and
# response "R." (its template.format(question, answer, response))
_CONTAINS = ("I will give you a question, a correct answer, and a response from a model. Please answer yes if the "
             "response contains the correct answer. Otherwise, answer no. If the response is equivalent to the "
             "correct answer or contains all the intermediate steps to get the correct answer, you should also "
             "answer yes. If the response only contains a subset of the information required by the answer, "
             "answer no.")
UPSTREAM_PROMPTS = {
    "multi-session": _CONTAINS + " \n\nQuestion: Q?\n\nCorrect Answer: A.\n\nModel Response: R.\n\n"
    "Is the model response correct? Answer yes or no only.",
    "temporal-reasoning": _CONTAINS + " In addition, do not penalize off-by-one errors for the number of days. If "
    "the question asks for the number of days/weeks/months, etc., and the model makes off-by-one errors (e.g., "
    "predicting 19 days when the answer is 18), the model's response is still correct. \n\nQuestion: Q?\n\n"
    "Correct Answer: A.\n\nModel Response: R.\n\nIs the model response correct? Answer yes or no only.",
    "knowledge-update": "I will give you a question, a correct answer, and a response from a model. Please answer "
    "yes if the response contains the correct answer. Otherwise, answer no. If the response contains some previous "
    "information along with an updated answer, the response should be considered as correct as long as the updated "
    "answer is the required answer.\n\nQuestion: Q?\n\nCorrect Answer: A.\n\nModel Response: R.\n\n"
    "Is the model response correct? Answer yes or no only.",
    "single-session-preference": "I will give you a question, a rubric for desired personalized response, and a "
    "response from a model. Please answer yes if the response satisfies the desired response. Otherwise, answer no. "
    "The model does not need to reflect all the points in the rubric. The response is correct as long as it recalls "
    "and utilizes the user's personal information correctly.\n\nQuestion: Q?\n\nRubric: A.\n\nModel Response: R."
    "\n\nIs the model response correct? Answer yes or no only.",
    "abstention": "I will give you an unanswerable question, an explanation, and a response from a model. Please "
    "answer yes if the model correctly identifies the question as unanswerable. The model could say that the "
    "information is incomplete, or some other information is given but the asked information is not.\n\n"
    "Question: Q?\n\nExplanation: A.\n\nModel Response: R.\n\nDoes the model correctly identify the question as "
    "unanswerable? Answer yes or no only.",
}
UPSTREAM_PROMPTS["single-session-user"] = UPSTREAM_PROMPTS["single-session-assistant"] = \
    UPSTREAM_PROMPTS["multi-session"]


@pytest.mark.parametrize("variant", sorted(UPSTREAM_PROMPTS))
def test_upstream_judge_prompt_is_upstream_wording(variant):
    text = load_prompt("longmemeval_judge_upstream").render(category=variant, question="Q?", gold="A.", answer="R.")
    assert text == UPSTREAM_PROMPTS[variant]


@pytest.mark.parametrize("reply, label", [
    # upstream evaluate_qa.py: label = 'yes' in eval_response.lower()
    ("Yes", "CORRECT"), ("yes.", "CORRECT"), ("YES, it does.", "CORRECT"), ("No", "WRONG"), ("no.", "WRONG"),
    ("", "WRONG"), ("I would not say yes", "CORRECT"), ("Eyes closed: no", "CORRECT"),
])
def test_upstream_replies_are_read_as_upstream_reads_them(reply, label):
    from aml_ray.scoring.judge_protocols import read_yes_no

    assert read_yes_no(reply) == label


async def test_category_judge_with_the_upstream_prompt_judges_as_upstream():
    from aml_ray.scoring.judge_protocols import PROTOCOLS

    judge = ScriptedJudge(lambda p: "Yes" if "Model Response: right" in p else "No.")
    rows = [{"question_id": qid, "question": f"Q{qid}?", "gold": json.dumps("A."), "answer": ans,
             "answer_status": "ok", "search_status": "ok", "category": cat}
            for qid, cat, ans in (("a", "temporal-reasoning", "right"), ("b", "knowledge-update", "wrong"),
                                  ("c_abs", "multi-session", "right"))]
    await get_scorer("category_judge")(rows, endpoint=ONLINE, model=judge,
                                       prompt=load_prompt("longmemeval_judge_upstream"))
    assert [r["verdict"] for r in rows] == ["CORRECT", "WRONG", "CORRECT"]
    assert [r["status"] for r in rows] == ["scored"] * 3
    by_q = {p.split("Question: Q")[1].split("?")[0]: p for p in judge.prompts}
    assert "off-by-one" in by_q["a"] and "updated answer" in by_q["b"]
    # the '_abs' question gets upstream's abstention template, whatever its question type
    assert by_q["c_abs"].startswith("I will give you an unanswerable question")
    assert {kw["max_tokens"] for kw in judge.kwargs} == {PROTOCOLS["longmemeval-upstream"].max_tokens} == {10}


def _suite_dict() -> dict:
    return json.loads((SUITES_DIR / "textual.json").read_text())


def _upstream_suite() -> Suite:
    data = _suite_dict()
    sha = hashlib.sha256((PROMPT_DIR / "longmemeval_judge_upstream.j2").read_bytes()).hexdigest()
    for b in data["bundles"]:
        if b["dataset"].startswith("longmemeval"):
            b["prompts"]["judge"] = {"name": "longmemeval_judge_upstream", "sha256": sha}
            b["judge_protocol"] = "longmemeval-upstream"
    return Suite.model_validate(data)


def test_a_suite_names_the_upstream_protocol_and_the_default_stays_ours():
    from aml_ray.suite import baseline_deviations, release_baseline

    default = load_suite()
    assert default.bundle("longmemeval_oracle").judge_protocol == "aml-ray"
    suite = _upstream_suite()
    bundle = suite.bundle("longmemeval_oracle")
    assert bundle.judge_protocol == "longmemeval-upstream"
    assert release_baseline(suite)["bundles"]["longmemeval_oracle"]["judge_protocol"] == "longmemeval-upstream"
    run_info = {"models": {"answer": {"model": "gpt-4o-mini"}, "judge": {"model": "gpt-4o-mini"}}, "top_k": 100,
                "context_budget_tokens": 16000, "judge_runs": 1, "bundle": {"files_match": True},
                "prompts": {r: {"sha256": p.sha256} for r, p in bundle.prompts.items()}}
    assert any("gpt-4o-2024-08-06" in d for d in baseline_deviations(suite, bundle, run_info))
    data = _suite_dict()
    for b in data["bundles"]:
        if b["name"] == "longmemeval_oracle":
            b["judge_protocol"] = "longmemeval-upstream"  # the judge prompt is still ours: refused
    with pytest.raises(ValidationError, match="longmemeval_judge_upstream"):
        Suite.model_validate(data)


def test_run_json_bundle_record_names_the_judge_protocol(tmp_path):
    from aml_ray.suite import verify_loaded_bundle

    f = tmp_path / "lme.json"
    f.write_text(json.dumps([_lme_instance("q1", "multi-session")]))
    info = verify_loaded_bundle("longmemeval_oracle", f, parse_longmemeval(json.loads(f.read_text())))
    assert info["judge_protocol"]["name"] == "aml-ray" and "aml-ray" in info["judge_protocol"]["label"]


# ------------------------------------------------------------------------------------------ BEAM

ITEM = {"full": '{"score": 1.0}', "half": '{"score": 0.5}', "none": '{"score": 0.0}', "off": '{"score": 0.7}'}


def _beam_reply(matches=None):
    def reply(prompt: str) -> str:
        if "REFERENCE EVENTS" in prompt:
            return json.dumps({"matches": matches})
        return ITEM[prompt.split("RUBRIC CRITERION (what to check): ")[1].split("\n")[0]]
    return reply


def _beam_row(rubric, category="information_extraction", answer="an answer", qid="conv-1:x:q0") -> dict:
    return {"question_id": qid, "question": "Q?", "category": category, "rubric": list(rubric),
            "gold": json.dumps("gold"), "answer": answer, "search_status": "ok", "answer_status": "ok",
            "judge_status": None, "verdict": None, "score": None, "score_detail": None, "f1": None, "bleu1": None}


async def test_beam_rubric_takes_int_of_each_item_score_as_upstream():
    # BEAM evaluation.py (mohammadtavakoli78/BEAM @ 5a64c992) evaluate_information_extraction: score +=
    # int(response['score']) per rubric item, then / len(rubric): items 1.0, 0.5, 0.0, 1.0 -> (1+0+0+1)/4 = 0.5
    rows = [_beam_row(["full", "half", "none", "full"])]
    await get_scorer("rubric_judge")(rows, endpoint=ONLINE, model=ScriptedJudge(_beam_reply()),
                                     prompt=load_prompt("beam_rubric_judge"))
    assert rows[0]["score"] == 0.5 and rows[0]["status"] == "scored"


async def test_beam_half_credit_variant_is_named_by_its_prompt():
    rows = [_beam_row(["full", "half", "none", "full"])]
    await get_scorer("rubric_judge")(rows, endpoint=ONLINE, model=ScriptedJudge(_beam_reply()),
                                     prompt=load_prompt("beam_rubric_judge_half_credit"))
    assert rows[0]["score"] == 0.625 and json.loads(rows[0]["score_detail"])["credit_rule"] == "half_credit"


async def test_beam_event_ordering_score_is_tau_norm_as_upstream_reports_it():
    # BEAM evaluation.py event_ordering_score on reference [r0, r1, r2, r3] and the aligned answer
    # [r0, r2, r1, x] (x matches nothing): tp 3, fp 1, fn 1 -> F1 0.75; ranks [1,2,3,4,6] vs [1,3,2,6,4]
    # -> tau-b 0.6 -> tau_norm 0.8, final_score 0.6. src/evaluation/report_results.py averages
    # object['tau_norm'] for event_ordering (llm_judge_score elsewhere), so the reported score is 0.8.
    rows = [_beam_row(["full", "full", "full", "full"], category="event_ordering", answer="a\nb\nc\nd")]
    await get_scorer("rubric_judge")(rows, endpoint=ONLINE, model=ScriptedJudge(_beam_reply([1, 3, 2, 0])),
                                     prompt=load_prompt("beam_rubric_judge"))
    r = rows[0]
    detail = json.loads(r["score_detail"])
    assert r["score"] == pytest.approx(0.8) and r["status"] == "scored" and r["verdict"] == "WRONG"
    assert detail["ordering"]["tau_b"] == pytest.approx(0.6) and detail["ordering"]["f1"] == 0.75
    assert detail["ordering"]["final"] == pytest.approx(0.6)  # final_score, kept for audit
    assert detail["rubric_mean"] == 1.0


async def test_beam_item_score_off_the_scale_is_credited_as_upstream():
    # evaluation.py: score += int(response['score']) -> int(0.7) = 0 for the nine abilities; event ordering's
    # llm_judge_score reads float(0.7); items 1.0 and 0.7 -> (1 + 0) / 2 = 0.5, and (1 + 0.7) / 2 = 0.85
    rows = [_beam_row(["full", "off"]), _beam_row(["full", "off"], category="event_ordering", answer="a\nb")]
    await get_scorer("rubric_judge")(rows, endpoint=ONLINE, model=ScriptedJudge(_beam_reply([1, 2])),
                                     prompt=load_prompt("beam_rubric_judge"))
    assert rows[0]["score"] == 0.5 and rows[0]["status"] == "scored"
    assert [it["credit"] for it in json.loads(rows[0]["score_detail"])["items"]] == [1.0, 0.0]
    detail = json.loads(rows[1]["score_detail"])
    assert detail["rubric_mean"] == pytest.approx(0.85) and rows[1]["score"] == 1.0  # tau_norm of [r0, r1]


def test_beam_one_event_answer_is_defined_where_upstream_gives_nan():
    from aml_ray.stages.rubric import ordering_score

    # upstream: scipy kendalltau of one-item rankings is NaN, so tau_norm (and the ability's reported mean) is
    # NaN; here the rule "one item is in order" defines tau_norm as 1.0
    got = ordering_score(1, [0])
    assert got["final"] == 1.0 and got["tau_b"] is None and got["tau_norm"] == 1.0
    assert got["undefined_tau"] == "one item: nothing to order (upstream NaN); tau_norm defined as 1.0"


# ------------------------------------------------------------------------------------------ --judge-runs

def test_judge_runs_summary_uses_partial_credit_as_the_table_does():
    from aml_ray.run.evaluation import usage_summary

    frame = pl.DataFrame({
        "question_id": ["a", "b", "c", "d", "e"], "category": ["x"] * 5, "dataset": ["beam"] * 5,
        "excluded": [False, False, False, False, True],
        "status": ["scored", "scored", "scored", "judge_error", "scored"],
        "verdict": ["WRONG", "CORRECT", "WRONG", None, "CORRECT"], "score": [0.5, 1.0, 0.25, None, 1.0],
        "judge_verdicts": [["WRONG", "0.75"], ["CORRECT", "CORRECT"], ["WRONG", "WRONG"], ["judge_error", "0.5"],
                           ["CORRECT", "CORRECT"]],
        "context_tokens": [10] * 5, "memories_cut": [0] * 5, "prompt_tokens": [1] * 5, "completion_tokens": [1] * 5,
        "answer_cached": [False] * 5, "cost_usd": [None] * 5, "f1": [None] * 5, "bleu1": [None] * 5,
    }, schema_overrides={"cost_usd": pl.Float64, "f1": pl.Float64, "bleu1": pl.Float64})
    table = aggregate(frame).filter(pl.col("category") == "overall").to_dicts()[0]
    summary = usage_summary(frame)["judge_runs_summary"]
    # run 1 = the table (0.5 + 1 + 0.25 + 0) / 4; run 2 from each row's second run (0.75 + 1 + 0 + 0.5) / 4
    assert summary["accuracy_per_run"] == pytest.approx([table["accuracy"], 0.5625])
    assert table["accuracy"] == pytest.approx(0.4375)


# ------------------------------------------------------------------------------------------ ScriptMem

# memorax-ai/ScriptMem @ 22ac7e7e src/evaluate.py (predicted_letters + score_item) on these answers
SCRIPTMEM_GOLDEN = [
    ("\\boxed{B}", ["B"], "single_choice", 1.0), ("(B. Juror 8)", ["B"], "single_choice", 1.0),
    ("[B: Juror 8]", ["B"], "single_choice", 1.0), ("Final answer: B", ["B"], "single_choice", 1.0),
    ("(B)", ["B"], "single_choice", 1.0), ("b", ["B"], "single_choice", 1.0),
    ("<think>maybe (A)</think> (B)", ["B"], "single_choice", 1.0), ("(A)(B)", ["B"], "single_choice", 0.0),
    ("(A) or (B)", ["B"], "single_choice", 0.0), ("The answer is B", ["B"], "single_choice", 0.0),
    ("D -> A -> C -> B", ["D", "A", "C", "B"], "ordering", 1.0),
    ("(D, A, C, B)", ["D", "A", "C", "B"], "ordering", 1.0), ("[D; A; C; B]", ["D", "A", "C", "B"], "ordering", 1.0),
    ("\\boxed{D, A, C, B}", ["D", "A", "C", "B"], "ordering", 1.0),
    ("(D, C, A, B)", ["D", "A", "C", "B"], "ordering", 0.0), ("(D, A, D, B)", ["D", "A", "C", "B"], "ordering", 0.0),
    ("(C, A)", ["A", "C"], "multi_select", 1.0), ("Final answer: (a, c)", ["A", "C"], "multi_select", 1.0),
    ("I pick (A) first. Final answer: (A, C)", ["A", "C"], "multi_select", 1.0),
    ("A and C", ["A", "C"], "multi_select", 0.0), ("(A, C, D)", ["A", "C"], "multi_select", 0.0),
]


async def test_scriptmem_answers_are_read_as_upstream_reads_them():
    from aml_ray.stages.options import option_rows

    rows = [{"question_id": f"angry:conv-0#q{i:04d}", "category": rule,
             "options": [f"{c}. option {c}" for c in "ABCDEF"], "gold": json.dumps(gold), "answer": answer,
             "search_status": "ok", "answer_status": "ok", "judge_status": None, "verdict": None, "score": None,
             "score_detail": None, "f1": None, "bleu1": None}
            for i, (answer, gold, rule, _) in enumerate(SCRIPTMEM_GOLDEN)]
    await option_rows(rows)
    assert [(r["answer"], r["score"]) for r in rows] == [(a, s) for a, _, _, s in SCRIPTMEM_GOLDEN]
    assert sum(s for *_, s in SCRIPTMEM_GOLDEN) / len(SCRIPTMEM_GOLDEN) == pytest.approx(14 / 21)


# ------------------------------------------------------------------------------------------ PersonaMem

# bowen-upenn/PersonaMem inference.py / inference_standalone_openai.py Evaluation.extract_answer
# (_extract_only_options: letters a-d in "(x)", else standalone letters a-d; equal to {correct}; then the
# whole reply), gold "(b)"
PERSONAMEM_GOLDEN = [
    ("<final_answer> b", True), ("The answer is b", True), ("(b)", True), ("B", True),
    ("<final_answer>(b)</final_answer>", True), ("I pick a reply: (b)", True),
    ("(c) is tempting, but <final_answer> b", True), ("b) steakhouse", True),
    ("I'd choose a: b", False), ("(a) or (b)", False), ("<final_answer> b\nBecause (a) was wrong", False), ("", False),
]


async def test_personamem_answers_are_read_as_upstream_reads_them():
    options = ["(a) Vegan ramen.", "(b) A steakhouse.", "(c) Skip dinner.", "(d) Sushi."]
    rows = [{"question_id": f"q{i}", "gold": json.dumps("(b)"), "answer": answer, "options": options,
             "answer_status": "ok", "search_status": "ok", "category": "recall_user_shared_facts"}
            for i, (answer, _) in enumerate(PERSONAMEM_GOLDEN)]
    await get_scorer("single_choice")(rows)
    assert [(r["answer"], r["verdict"]) for r in rows] == [
        (a, "CORRECT" if ok else "WRONG") for a, ok in PERSONAMEM_GOLDEN]
    assert all(r["status"] == "scored" for r in rows)


# ------------------------------------------------------------------------------------------ declarations

def test_every_protocol_prompt_declares_its_protocol():
    from aml_ray.scoring.judge_protocols import DEFAULT_PROTOCOL, PROTOCOLS, protocol_of

    for name, protocol in PROTOCOLS.items():
        if protocol.prompt is None:
            assert name == DEFAULT_PROTOCOL
            continue
        assert protocol_of(load_prompt(protocol.prompt)).name == name
    for shipped in ("longmemeval_judge", "beam_rubric_judge", "option_match"):
        assert protocol_of(load_prompt(shipped)).name == DEFAULT_PROTOCOL


@pytest.mark.parametrize("module", ["aml_ray.scoring.judge_protocols", "aml_ray.scoring.judge_runs",
                                    "aml_ray.scoring.personamem_choice", "aml_ray.suite"])
def test_docstring_examples(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0
