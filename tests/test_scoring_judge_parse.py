"""Parsing the binary judge's reply: accepted forms, and the replies that must raise."""

import pytest

from aml_ray.scoring import JudgeParseError, parse_judge_label


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ('{"label": "CORRECT"}', "CORRECT"),
        ('{"label": "WRONG"}', "WRONG"),
        ('  {"label":"CORRECT"}\n', "CORRECT"),
        ('```json\n{"label": "WRONG"}\n```', "WRONG"),
        ('```\n{"label": "CORRECT"}\n```', "CORRECT"),
        ('The generated date matches the gold date.\n{"label": "CORRECT"}', "CORRECT"),
        ('Rationale: different city. {"label": "WRONG"} Hope this helps.', "WRONG"),
        ('{"label": "correct"}', "CORRECT"),
        ('{"label": "Correct"}', "CORRECT"),
        ('{"Label": "wrong"}', "WRONG"),
        ('{"label": " CORRECT. "}', "CORRECT"),
        ("{'label': 'WRONG'}", "WRONG"),
        ("Same person.\n{'label': 'correct'}", "CORRECT"),
        ('{"reasoning": "gold {7 May} matches", "label": "CORRECT"}', "CORRECT"),
        ("{'reasoning': \"it's the same day\", 'label': 'CORRECT'}", "CORRECT"),
        ('{"verdict": {"label": "WRONG"}}', "WRONG"),
        ("The answer names the same place.\nlabel: CORRECT", "CORRECT"),
        ("Different year.\nLabel: wrong", "WRONG"),
        ("Reasoning here\n**Label:** CORRECT", "CORRECT"),
        ('label = "WRONG"', "WRONG"),
        ("CORRECT", "CORRECT"),
        ("wrong.", "WRONG"),
        # words that are not a verdict on the answer do not count against the label
        ('The correct answer is Paris; the generated one says Paris.\n{"label": "CORRECT"}', "CORRECT"),
        ('The correct answer is Paris; the generated one says Rome.\n{"label": "WRONG"}', "WRONG"),
        ('Nothing wrong with the date format.\n{"label": "CORRECT"}', "CORRECT"),
        ('The answer would be wrong if the year mattered; it does not.\n{"label": "CORRECT"}', "CORRECT"),
        # a verdict in prose that agrees with the label
        ('The generated answer is correct.\n{"label": "CORRECT"}', "CORRECT"),
        ('The generated answer is wrong: it names 2022.\n{"label": "WRONG"}', "WRONG"),
        # repeated identical labels agree
        ('{"label": "WRONG"}\n{"label": "WRONG"}', "WRONG"),
    ],
)
def test_accepted_forms(reply, expected):
    assert parse_judge_label(reply) == expected


@pytest.mark.parametrize(
    "reply",
    [
        "The answer is correct, not wrong.",
        "CORRECT or WRONG? I think it is correct but it might be wrong.",
        "The label is correct.",
        "I cannot decide.",
        '{"label": "CORRECT" or "WRONG"}',
        '{"label": "PARTIAL"}',
        '{"label": true}',
        '{"answer": "CORRECT"}',
        '{"label": "CORRECT"}\n{"label": "WRONG"}',
        "label: CORRECT\nlabel: WRONG",
        # a positive verdict only in prose is not a label: asked again, never guessed
        "The answer is correct.",
        "Correct. Same city.",
        # a hedge is not an explicit verdict
        "I cannot tell; it might be right or wrong.",
        "It could be incorrect.",
        "The answer is probably wrong.",
    ],
)
def test_ambiguous_or_unlabelled_replies_raise(reply):
    with pytest.raises(JudgeParseError):
        parse_judge_label(reply)


@pytest.mark.parametrize(
    "reply",
    [
        "The answer is INCORRECT.",
        "WRONG",
        "label: wrong",
        "Incorrect",
        "incorrect.",
        "NOT CORRECT",
        "not correct",
        '{"label":"WRONG"}',
        '{"label": "INCORRECT"}',
        '{"label": "not correct"}',
        "label: INCORRECT",
        "It's incorrect.",
        "The answer isn't correct.",
        "The answer is not entirely correct.",
        "The answer is clearly wrong.",
        "Verdict: INCORRECT",
        "**Incorrect** - the gold says May.",
        "Wrong. The gold says May, the answer says June.",
        'The answer is incorrect.\n{"label": "WRONG"}',
    ],
)
def test_explicit_negative_is_wrong(reply):
    """Issue 24: a negative verdict in any form is WRONG at once, never a parse error to re-ask."""
    assert parse_judge_label(reply) == "WRONG"


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        ('label: WRONG\n{"label": "CORRECT"}', "conflicting"),
        ('{"label": "CORRECT"}\nlabel: incorrect', "conflicting"),
        ("The answer is CORRECT. On reflection, the answer is INCORRECT.", "conflicting"),
        ("Incorrect.\nlabel: CORRECT", "conflicting"),
        ("not incorrect", "double negative"),
        ("The answer is not incorrect.", "double negative"),
        ('{"label": "NOT WRONG"}', "double negative"),
        ("The answer isn't wrong.", "double negative"),
        # labels that disagree, whatever the prose says
        ('{"label": "CORRECT", "label2": "WRONG"}', "conflicting labels"),
        ('{"label": "CORRECT"}\nWRONG', "conflicting labels"),
        ('Same city.\n{"label": "WRONG"}\nFinal verdict: CORRECT', "conflicting labels"),
        ('{"verdict": "WRONG", "label": "CORRECT"}', "conflicting labels"),
        ('The gold is May.\n```json\n{"label": "CORRECT"}\n```\n{"label": "WRONG"}', "conflicting labels"),
    ],
)
def test_conflicting_verdicts_raise(reply, problem):
    with pytest.raises(JudgeParseError, match=problem):
        parse_judge_label(reply)


RATIONALE_REPLIES = [
    # a one-line rationale, then the JSON label the prompts ask for; verdict words in the rationale are not labels
    ('The year is correct but the month is wrong.\n{"label": "WRONG"}', "WRONG"),
    ('The generated answer gives 7 May 2023 in another date format, which is not wrong.\n{"label": "CORRECT"}',
     "CORRECT"),
    ('{"label": "CORRECT", "reason": "the answer is not wrong"}', "CORRECT"),
    ('{"reason": "the answer is correct about the city but wrong about the year", "label": "WRONG"}', "WRONG"),
    ('The answer is not incorrect: it names the same person.\n{"label": "CORRECT"}', "CORRECT"),
    ("The gold answer is Paris and the generated answer says Paris, so it is correct.\n"
     '```json\n{"label": "CORRECT"}\n```', "CORRECT"),
    ('The answer says 2021, the gold says 2022; it is wrong.\n```json\n{"label": "WRONG"}\n```', "WRONG"),
    ("Rationale: the answer mentions the right hobby (pottery) but adds a wrong detail that does not contradict "
     'the gold.\n{"label": "CORRECT"}', "CORRECT"),
    ('The answer is partially correct but misses the second item, so it is incomplete.\n{"label": "WRONG"}', "WRONG"),
    ("Nothing in the answer is incorrect, and it covers the gold.\n{'label': 'CORRECT'}", "CORRECT"),
    ('It is not wrong to write "last week" for the gold date here.\n{"label": "CORRECT"}', "CORRECT"),
    ('The generated answer is wrong about the date.\n\n{"label": "WRONG"}\n', "WRONG"),
    ("Although the phrasing is different, it is correct.\n{\"label\": \"correct\"}", "CORRECT"),
    ('The answer says the information is not available, which is wrong.\n{"label":"WRONG"}', "WRONG"),
    ('**Rationale:** the correct answer is Lisbon; the reply says Porto, which is incorrect.\n'
     '**Label:** {"label": "WRONG"}', "WRONG"),
    # a bare label ends the reply after the rationale
    ("The generated answer is correct, but incomplete. WRONG", "WRONG"),
    ("The generated answer names the same city, so nothing is wrong. CORRECT", "CORRECT"),
    ("CORRECTNESS: WRONG", "WRONG"),
    ("The answer refers to the same event.\nCORRECTNESS: CORRECT", "CORRECT"),
    ("Same year and month, different day format.\nFinal verdict: **CORRECT**", "CORRECT"),
    ("The gold says two dogs, the answer says three; that is not correct.\nVerdict: WRONG", "WRONG"),
    ('The answer is wrong? No: it is right.\n{"label": "CORRECT"}\nCORRECT', "CORRECT"),
    ("The answer is correct about the place but not the time - WRONG", "WRONG"),
]


@pytest.mark.parametrize(("reply", "expected"), RATIONALE_REPLIES)
def test_a_label_after_a_rationale_is_the_verdict(reply, expected):
    """A well-formed label decides; prose around it is rationale, whatever verdict words it uses."""
    assert parse_judge_label(reply) == expected


@pytest.mark.parametrize("reply", ["", "   \n\t", None])
def test_empty_reply_raises(reply):
    with pytest.raises(JudgeParseError, match="empty judge reply"):
        parse_judge_label(reply)


def test_error_is_value_error_and_shows_reply():
    with pytest.raises(ValueError, match="I cannot decide"):
        parse_judge_label("I cannot decide")


def test_error_message_truncates_reply_to_200_chars():
    reply = "x" * 150 + "y" * 500
    with pytest.raises(JudgeParseError) as info:
        parse_judge_label(reply)
    assert info.value.reply == reply[:200]
    assert "x" * 150 + "y" * 50 in str(info.value)
    assert "y" * 51 not in str(info.value)
