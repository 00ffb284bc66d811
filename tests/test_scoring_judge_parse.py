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
        # prose that mentions both words does not matter once a structured label is present
        ('It is not WRONG to call it CORRECT here.\n{"label": "CORRECT"}', "CORRECT"),
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
        '{"label": "INCORRECT"}',
        '{"label": "PARTIAL"}',
        '{"label": true}',
        '{"answer": "CORRECT"}',
        '{"label": "CORRECT"}\n{"label": "WRONG"}',
        "label: CORRECT\nlabel: WRONG",
        "INCORRECT",
    ],
)
def test_ambiguous_or_unlabelled_replies_raise(reply):
    with pytest.raises(JudgeParseError):
        parse_judge_label(reply)


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
