"""The run's leak rules (aml_ray.run.isolation): the id rule and the content rule, without Ray."""

from __future__ import annotations

from aml_ray.run.isolation import find_leaks, index_adds


def add(user: str, n: int, *texts: str) -> dict:
    return {"request_id": f"{user}:chunk-{n}", "user_id": user,
            "messages": [{"role": "user", "content": t} for t in texts]}


ALICE = [add("eval:r:d:a", 0, "I adopted a grey cat called Pepper from the shelter on Main Street", "ok",
             "We both went to the big lake by the old mill for the summer")]
BOB = [add("eval:r:d:b", 0, "My sister Jane runs a bakery that sells sourdough every single morning", "ok",
           "We both went to the big lake by the old mill for the summer")]


def leaks_of(rows, *users):
    return [(l["question_id"], l["owner_user_id"], l["rule"], l["rank"]) for l in find_leaks(rows, index_adds(users))]


def test_leaks_by_content_and_by_id_and_never_for_shared_or_short_messages():
    rows = [
        {"question_id": "a-own", "user_id": "eval:r:d:a", "memories": [
            {"id": "1", "content": "I adopted a grey cat called Pepper from the shelter on Main Street"},
            {"id": "2", "content": "ok"},  # short: Bob was sent it too, and it is under 8 words anyway
            {"id": "3", "content": "We both went to the big lake by the old mill for the summer"}]},  # shared
        {"question_id": "a-leak", "user_id": "eval:r:d:a", "memories": [
            {"id": "9", "content": "Alice: hello\nBob: my sister  Jane runs a bakery that sells sourdough every "
                                   "single morning\nthanks"}]},
        {"question_id": "b-id", "user_id": "eval:r:d:b", "memories": [{"id": "eval:r:d:a:chunk-0", "content": "x"}]},
    ]
    leaks = find_leaks(rows, index_adds([("eval:r:d:a", ALICE), ("eval:r:d:b", BOB)]))
    assert [(l["question_id"], l["owner_user_id"], l["rule"], l["rank"]) for l in leaks] == \
        [("a-leak", "eval:r:d:b", "content", 1), ("b-id", "eval:r:d:a", "id", 1)]
    assert leaks[0]["evidence"] == "message starting 'my sister jane runs a bakery that sells'"


# LongMemEval's haystacks share sessions across questions and edit them lightly: question 02's user was sent
# "Congratulations on your smoker! " + a message that question 03's user was sent alone.
SMOKER = "hickory and apple wood is a fantastic combination for smoking ribs low and slow all afternoon"
LONG = [add("eval:r:lme:02", 0, "Congratulations on your smoker! " + SMOKER,
            "Shared session: what temperature should I hold the smoker at for pork shoulder overnight?")]
SHORT = [add("eval:r:lme:03", 0, SMOKER,
             "Shared session: what temperature should I hold the smoker at for pork shoulder overnight?")]


def test_another_users_message_inside_the_asking_users_own_message_is_no_leak():
    own_chunk = {"id": "eval:r:lme:02:chunk-0#0", "content": "user: Congratulations on your smoker! " + SMOKER}
    shared = {"id": "eval:r:lme:03:chunk-0#1",  # a store may dedupe shared text under either user's id
              "content": "Shared session: what temperature should I hold the smoker at for pork shoulder overnight?"}
    rows = [{"question_id": "02", "user_id": "eval:r:lme:02", "memories": [own_chunk]},
            {"question_id": "03", "user_id": "eval:r:lme:03", "memories": [{"id": "m", "content": SMOKER}]},
            {"question_id": "03b", "user_id": "eval:r:lme:03", "memories": [{"id": "m2", "content": shared["content"]}]}]
    assert leaks_of(rows, ("eval:r:lme:02", LONG), ("eval:r:lme:03", SHORT)) == []


def test_the_longer_message_of_another_user_is_still_a_leak():
    """The asking user was sent only the shorter text: the other user's whole message is not its own."""
    rows = [{"question_id": "03", "user_id": "eval:r:lme:03", "memories": [
        {"id": "x", "content": "noise"}, {"id": "y", "content": "Congratulations on your smoker! " + SMOKER}]}]
    assert leaks_of(rows, ("eval:r:lme:02", LONG), ("eval:r:lme:03", SHORT)) == [("03", "eval:r:lme:02", "content", 2)]


def test_a_message_that_several_other_users_share_is_a_leak():
    secret = "The vault code for the storage unit on Elm Road is four one seven nine"
    users = [("eval:r:d:a", [add("eval:r:d:a", 0, "Alice talks about her garden and the tomatoes growing there")]),
             ("eval:r:d:b", [add("eval:r:d:b", 0, secret)]),
             ("eval:r:d:c", [add("eval:r:d:c", 0, secret)])]
    rows = [{"question_id": "a", "user_id": "eval:r:d:a", "memories": [{"id": "z", "content": "[note] " + secret}]}]
    assert leaks_of(rows, *users) == [("a", "eval:r:d:b", "content", 1)]
