"""ScriptMem adapter: ``questions.jsonl`` + the operator's script conversation file -> samples.

Source: memorax-ai/ScriptMem @ :data:`SCRIPTMEM_COMMIT` (v1.0), ``data/public/questions.jsonl`` (pinned by
:data:`QUESTIONS_SHA256`) and the layout of ``data/public/conversations.jsonl`` and ``data/README.md``;
schema notes in ``shared/datasets/MANIFEST.md`` section 3.4. The script texts are **not** published (the
published ``conversations.jsonl`` holds only a synthetic ``format_example``), so the conversation file is
an operator input: a JSONL file in the published layout whose ``conversation`` objects hold the real
sessions.

Conversation file layout (one JSON object per line)::

    {"conversation_id": "angry:conv-0", "source": "angry", "sample_id": "conv-0",
     "conversation": {"speakers": [...], "session_1_date_time": "September 22, 1994",
                      "session_1": [{"type": "dialogue", "speaker": "...", "dia_id": "D1:1", "text": "..."},
                                    {"type": "narration", "speaker": null, "dia_id": "D1:2", "text": "..."}]}}

The published placeholder wraps that object as ``"conversation": {"format_example": {...}}``; it is
parsed the same way, but :func:`parse_scriptmem` refuses it (:class:`ScriptsNotPublished`) unless
``allow_placeholder`` is set (tests), so no run scores 457 questions against a two-line example.

Mapping decisions:

- One sample per conversation (one per source script); ``sample_id = f"{source}-{sample_id}"``
  (``angry-conv-0``; a ``:`` would make the platform ids ambiguous). ``speakers`` is left empty so the
  answer prompt shows the memories as one block in the participant's order (a script has many
  speakers, not a user and an assistant).
- Sessions are the ``session_N`` lists in numeric order; a session without turns is skipped. A turn
  becomes ``Message(role="user", content=...)``: ``"<speaker>: <text>"`` for ``type == "dialogue"``,
  ``"[Narration] <text>"`` for ``type == "narration"`` (speaker null). The role only says the text is
  input to remember; the speaker's name stays in the content. Another ``type``, a dialogue turn
  without a speaker, or empty text raises ``DatasetFormatError`` naming the ``dia_id``.
- Dates: ``session_N_date_time`` is ``"<Month> <d>, <yyyy>"`` (``"September 22, 1994"``), taken as
  00:00 UTC, and a message's timestamp is that + its 0-based position in ms; or the literal
  ``"Unknown"``, which the upstream README documents as the value for undated sessions: those messages
  carry no timestamp (never the current time). Anything else raises ``DatasetFormatError``.
- Questions (``questions.jsonl``): ``question_id`` is the upstream ``qa_id`` (``angry:conv-0#q0000``, the
  id a ScriptMem submission uses); ``category`` is ``qa_type`` (``single_choice``, ``multi_select``,
  ``ordering``: the scoring rule depends on it); ``options`` is the upstream ``option`` list
  (``"A. ..."``), sent to Search as ``options``; ``answer`` (the gold, never sent) is the list of gold
  letters ``answer_letters`` in order, checked against the letters of the gold option texts.
  ``question`` is the upstream question text with its lettered option lines removed (they travel as
  ``options``); the stem and the upstream answer-format sentence (which alone tells a multi-select from
  a single choice) are kept unchanged.

The pinned questions file holds 457 questions: single_choice 298, multi_select 123, ordering 36; by
source friends 174, angry 99, enemy 94, man_earth 90 (:data:`EXPECTED_QA_TYPES`, :data:`EXPECTED_SOURCES`).
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

from aml_ray.contract import Message
from aml_ray.datasets.jsonl import iter_jsonl
from aml_ray.datasets.dates import utc_midnight_ms
from aml_ray.datasets.base import Question, Sample, Session
from aml_ray.datasets.fetch import DatasetError, DatasetHashMismatch, verify_sha256
from aml_ray.datasets.validate import DatasetFormatError, Where, describe, in_file

#: Dataset name used in ids (``eval:<run>:scriptmem:<sample>``).
DATASET = "scriptmem"
SCRIPTMEM_REPO = "memorax-ai/ScriptMem"
SCRIPTMEM_COMMIT = "22ac7e7e70124280d8af6100262ee7f88fff3436"
QUESTIONS_URL = ("https://raw.githubusercontent.com/" + SCRIPTMEM_REPO + "/" + SCRIPTMEM_COMMIT
                 + "/data/public/questions.jsonl")
#: sha256 of the pinned ``questions.jsonl`` (MANIFEST appendix).
QUESTIONS_SHA256 = "5d9625c59f60473f5a70183a83531bc90a9273ad869fea794cdde79924b3d0f3"
QUESTIONS_FILE = "questions.jsonl"
#: Default name of the conversation file inside a ScriptMem folder (the published layout's name).
CONVERSATIONS_FILE = "conversations.jsonl"

#: The three question types and the letter rule each is scored by (:mod:`aml_ray.stages.options`).
QA_TYPES = ("single_choice", "multi_select", "ordering")
CATEGORY_NAMES = {"single_choice": "single choice", "multi_select": "multi-select", "ordering": "ordering"}
EXPECTED_QA_TYPES = {"single_choice": 298, "multi_select": 123, "ordering": 36}
EXPECTED_SOURCES = {"friends": 174, "angry": 99, "enemy": 94, "man_earth": 90}
#: The ``session_N_date_time`` value the upstream README documents for undated sessions.
UNKNOWN_DATE = "Unknown"

_SESSION_KEY = re.compile(r"^session_(\d+)$")
_DATE = re.compile(r"^\s*([A-Za-z]+)\s+(\d{1,2}),?\s+(\d{4})\s*$")
_OPTION = re.compile(r"^([A-Z])\.\s")


class ScriptsNotPublished(DatasetError, FileNotFoundError):
    """The conversation file is the published placeholder (a synthetic ``format_example``), not scripts.

    A ``FileNotFoundError``: the input the benchmark needs, the script texts, is absent.
    """


def parse_session_date(value: Any, *, where: str | Where) -> int | None:
    """Parse a ScriptMem ``session_N_date_time`` into UTC Unix milliseconds, or None for ``"Unknown"``.

    Examples:
        >>> parse_session_date("September 22, 1994", where="friends-conv-0 session_1")
        780192000000
        >>> parse_session_date("Unknown", where="angry-conv-0 session_1") is None
        True

    Args:
        value: the field's value.
        where: the field's place (a :class:`Where`, or text naming the sample and session).

    Returns:
        Milliseconds since the epoch of that day's 00:00 UTC, or None for the literal ``"Unknown"``.

    Raises:
        DatasetFormatError: anything else (not a string, another format, an unknown month, an
            impossible day).
    """
    here = where if isinstance(where, Where) else Where(f"ScriptMem {where}")

    def bad(why: str) -> DatasetFormatError:
        return here.error(f"malformed session date {value!r} ({why}); expected a date like 'September 22, 1994' "
                          f"or {UNKNOWN_DATE!r}")

    if value == UNKNOWN_DATE:
        return None
    if not isinstance(value, str):
        raise bad("not a string")
    m = _DATE.match(value)
    if not m:
        raise bad("does not match '<Month> <d>, <yyyy>'")
    return utc_midnight_ms(m.group(3), m.group(1), m.group(2), bad)


def _render_turn(turn: Any, where: Where) -> str:
    where.check(turn, dict, "a turn object {type, speaker, dia_id, text}")
    kind, speaker = turn.get("type"), turn.get("speaker")
    text = where.get(turn, "text", str, "non-empty text", nonempty=True)
    if kind == "dialogue":
        if not isinstance(speaker, str) or not speaker.strip():
            raise (where / "speaker").error(f"turn {turn.get('dia_id')!r}: a dialogue turn needs a speaker, "
                                            f"got {describe(speaker)}")
        return f"{speaker}: {text}"
    if kind == "narration":
        return f"[Narration] {text}"
    raise (where / "type").error(f"turn {turn.get('dia_id')!r}: type {kind!r} is not 'dialogue' or 'narration'")


def _sessions(conv: dict[str, Any], where: Where) -> tuple[Session, ...]:
    numbered = sorted((int(m.group(1)), key) for key in conv if (m := _SESSION_KEY.match(key)))
    sessions = []
    for _, key in numbered:
        turns = (where / key).check(conv[key], list, "a list of turns")
        if not turns:
            continue
        date_key = f"{key}_date_time"
        if date_key not in conv:
            raise (where / date_key).error(f"missing; {key} has turns, so its date is required")
        start = parse_session_date(conv[date_key], where=where / date_key)
        messages = tuple(
            Message(role="user", content=_render_turn(turn, where / key / i),
                    timestamp=None if start is None else start + i)
            for i, turn in enumerate(turns))
        sessions.append(Session(key=key, index=len(sessions) + 1, started_at_ms=start,  # type: ignore[arg-type]
                                messages=messages))
    return tuple(sessions)


def split_question(text: str, options: list[str], *, qa_id: str, where: Where | None = None) -> str:
    """The question text without its lettered option lines (stem and answer-format sentence kept).

    Examples:
        >>> split_question("Who spoke first?\\nA. Ross\\nB. Rachel\\nPlease answer (X).",
        ...                ["A. Ross", "B. Rachel"], qa_id="friends:conv-0#q0000")
        'Who spoke first?\\n\\nPlease answer (X).'

    Args:
        text: the upstream ``question``: stem, the options one per line, then the format sentence.
        options: the upstream ``option`` list, in order.
        qa_id: for the error message.
        where: the question field's place in the file (default: question ``qa_id``, field ``question``).

    Returns:
        ``stem + "\\n\\n" + format sentence`` (each stripped; the sentence may be empty).

    Raises:
        DatasetFormatError: the options are not found in order, each at the start of a line.
    """
    pos, first = 0, None
    for option in options:
        i = text.find(option, pos)
        while i > 0 and text[i - 1] != "\n":
            i = text.find(option, i + 1)
        if i <= 0:
            raise (where or Where(f"question {qa_id}", "question")).error(
                f"option {option[:40]!r} is not on its own line, in order, in the question text")
        first = i if first is None else first
        pos = i + len(option)
    stem, tail = text[:first].strip(), text[pos:].strip()
    return f"{stem}\n\n{tail}" if tail else stem


def _letters_of(answer: Any) -> list[str]:
    parts = answer if isinstance(answer, list) else [answer]
    letters = []
    for part in parts:
        m = _OPTION.match(str(part))
        letters.append(m.group(1) if m else "?")
    return letters


def _question(item: Any, where: Where) -> Question:
    """One ``questions.jsonl`` record as a Question (its sample_id is set once its conversation is known)."""
    where.check(item, dict, "a question object {qa_id, conversation_id, qa_type, question, option, answer, "
                            "answer_letters}")
    qa_id = where.get(item, "qa_id", str, nonempty=True)
    where.get(item, "conversation_id", str, nonempty=True)
    qa_type = item.get("qa_type")
    if qa_type not in QA_TYPES:
        raise (where / "qa_type").error(f"qa_type {qa_type!r} is not one of {QA_TYPES}")
    options = where.get(item, "option", list, "a list of at least two options 'A. ...', 'B. ...'")
    if len(options) < 2 or not all(isinstance(o, str) for o in options):
        raise (where / "option").error("'option' must list at least two options as text")
    letters = [(_OPTION.match(o) or [None, None])[1] for o in options]
    if letters != [chr(ord("A") + i) for i in range(len(options))]:
        raise (where / "option").error("options must be lettered A., B., ... in order")
    gold = item.get("answer_letters")
    if not isinstance(gold, list) or not gold or not set(map(str, gold)) <= set(letters) or len(set(gold)) != len(gold):
        raise (where / "answer_letters").error(f"answer_letters {gold!r} must be distinct option letters")
    if gold != _letters_of(item.get("answer")):
        raise (where / "answer_letters").error(f"answer_letters {gold} disagree with the gold option texts "
                                               f"{_letters_of(item.get('answer'))}")
    if qa_type == "single_choice" and len(gold) != 1:
        raise (where / "answer_letters").error("a single_choice question needs exactly one gold letter")
    text = where.get(item, "question", str, nonempty=True)
    return Question(question_id=qa_id, sample_id="", question=split_question(text, options, qa_id=qa_id,
                                                                             where=where / "question"),
                    answer=list(gold), category=qa_type, options=tuple(options))


def parse_scriptmem(questions: list[dict[str, Any]], conversations: list[dict[str, Any]], *,
                    allow_placeholder: bool = False, questions_file: str | os.PathLike[str] | None = None,
                    conversations_file: str | os.PathLike[str] | None = None) -> list[Sample]:
    """Join the questions with their conversations (mapping rules in the module docstring).

    Args:
        questions: the decoded lines of ``questions.jsonl``.
        conversations: the decoded lines of the conversation file.
        allow_placeholder: accept the published ``format_example`` placeholder (for tests; the samples
            are then the synthetic example, not the scripts).
        questions_file / conversations_file: the files they were read from, named in errors.

    Returns:
        One sample per conversation that has questions, in conversation-file order; each sample's
        questions in ``questions.jsonl`` order.

    Raises:
        ScriptsNotPublished: a conversation is the published ``format_example`` and placeholders are
            not allowed.
        DatasetFormatError: a question whose ``conversation_id`` has no conversation (the message lists
            the missing ids), a duplicate conversation, or any malformed field; the message names the
            file, the item (its 0-based position among the file's records and its id) and the field.
    """
    by_conversation: dict[str, list[Question]] = defaultdict(list)
    with in_file(questions_file):
        for i, item in enumerate(questions):
            where = Where.item_of(i, item, "qa_id")
            q = _question(item, where)
            by_conversation[item["conversation_id"]].append(q)
    convs: dict[str, tuple[Where, dict[str, Any]]] = {}
    with in_file(conversations_file):
        for i, line in enumerate(conversations):
            where = Where.item_of(i, line, "conversation_id")
            where.check(line, dict, "a conversation object {conversation_id, source, sample_id, conversation}")
            if "qa_id" in line and "conversation" not in line:
                raise where.error(
                    f"is a question object (qa_id {line['qa_id']!r}), not a conversation: this is a questions "
                    f"file, and the conversation file is missing; pass the operator's {CONVERSATIONS_FILE} "
                    f"(the scripts are not published) with {QUESTIONS_FILE} beside it")
            cid = where.get(line, "conversation_id", str, required=False)
            if not cid:
                cid = f"{where.get(line, 'source', str)}:{where.get(line, 'sample_id', (str, int))}"
            if cid in convs:
                raise (where / "conversation_id").error(f"{cid!r} appears twice")
            convs[cid] = (where, line)
        missing = sorted(set(by_conversation) - set(convs))
        if missing:
            raise DatasetFormatError(f"no conversation for {missing} ({sum(len(by_conversation[m]) for m in missing)} "
                                     "questions); the conversation file must hold every script the questions "
                                     "are about")
        samples = []
        for cid, (where, line) in convs.items():
            if cid not in by_conversation:
                continue
            conv = where.get(line, "conversation", dict)
            conv_at = where / "conversation"
            if "format_example" in conv:
                if not allow_placeholder:
                    raise ScriptsNotPublished(
                        f"ScriptMem conversation {cid!r} is the published placeholder (a synthetic "
                        "format_example); the script texts are not published. Pass the operator's "
                        f"conversation file in the same layout (--data PATH, or {CONVERSATIONS_FILE} beside "
                        f"{QUESTIONS_FILE})")
                conv, conv_at = conv_at.get(conv, "format_example", dict), conv_at / "format_example"
            source = line.get("source") if isinstance(line.get("source"), str) else None
            sample = line.get("sample_id") if isinstance(line.get("sample_id"), (str, int)) else None
            sample_id = f"{source or cid.split(':')[0]}-{sample or cid.split(':')[-1]}"
            sessions = _sessions(conv, conv_at)
            if not sessions:
                raise conv_at.error("no session with turns; expected session_1, session_2, ... lists of turns")
            samples.append(Sample(sample_id=sample_id, sessions=sessions,
                                  questions=tuple(replace(q, sample_id=sample_id) for q in by_conversation[cid])))
    return samples


def _read_jsonl(path: Path, what: str = "one JSON object per line") -> list[dict[str, Any]]:
    return [obj for _, obj in iter_jsonl(path, what)]


def questions_beside(conversations: Path) -> Path:
    """Where :func:`load_scriptmem` looks for ``questions.jsonl``: beside the conversation file."""
    return conversations.parent / QUESTIONS_FILE


def conversation_file(data: str | os.PathLike[str]) -> Path:
    """The conversation file that a ``--data`` path names.

    A folder names its ``conversations.jsonl``; ``questions.jsonl`` itself names the
    ``conversations.jsonl`` beside it; any other path names itself.

    Raises:
        FileNotFoundError: ``data`` is ``questions.jsonl`` and no ``conversations.jsonl`` sits beside it;
            the message names the missing file.
    """
    conv = Path(data)
    if conv.is_dir():
        return conv / CONVERSATIONS_FILE
    if conv.name == QUESTIONS_FILE:
        beside = conv.parent / CONVERSATIONS_FILE
        if not beside.is_file():
            raise FileNotFoundError(
                f"ScriptMem: {conv} is the questions file; the conversation file {beside} is missing. Pass "
                f"--data PATH to the operator's {CONVERSATIONS_FILE} (the scripts are not published), with "
                f"{QUESTIONS_FILE} beside it")
        return beside
    return conv


def load_scriptmem(path: str | os.PathLike[str], *, allow_placeholder: bool = False) -> list[Sample]:
    """Load ScriptMem from the operator's conversation file and the ``questions.jsonl`` beside it.

    Args:
        path: the conversation file, or a folder holding ``conversations.jsonl`` and ``questions.jsonl``
            (see :func:`conversation_file`).
        allow_placeholder: see :func:`parse_scriptmem`.

    Returns:
        The samples (457 questions over 4 samples for the pinned questions file).

    Raises:
        FileNotFoundError: a file is missing (:class:`ScriptsNotPublished` for the placeholder).
        DatasetFormatError: an empty file, invalid JSON or any error of :func:`parse_scriptmem`; the
            message names the file.
    """
    conv = conversation_file(path)
    questions = questions_beside(conv)
    return parse_scriptmem(_read_jsonl(questions, "one question object per line"),
                           _read_jsonl(conv, "one conversation object per line"), allow_placeholder=allow_placeholder,
                           questions_file=questions, conversations_file=conv)


def resolve_scriptmem(data: Path | None, *, cache_dir: Path, allow_hash_mismatch: bool = False) -> Path:
    """Find the operator's conversation file with a verified ``questions.jsonl`` beside it.

    The conversation file is ``data`` (a file, or a folder holding ``conversations.jsonl``); it is the
    operator's own (the scripts are unpublished), so it is not pinned here: the run records its sha256.
    ``questions.jsonl`` must sit beside it with sha256 :data:`QUESTIONS_SHA256` (the layout of
    ``shared/datasets/scriptmem/``; the pinned file is at :data:`QUESTIONS_URL`). The published
    placeholder is refused here already, so a suite can report ScriptMem as absent before any work.

    Args:
        data: the conversation file, its folder, or the ``questions.jsonl`` beside it (see
            :func:`conversation_file`). Required: there is no public source of the scripts.
        cache_dir: the dataset cache root (unused: nothing is downloaded for a run; kept for the
            :class:`~aml_ray.datasets.registry.DatasetSpec` signature).
        allow_hash_mismatch: accept a ``questions.jsonl`` with another sha256.

    Returns:
        The conversation file's path (what :func:`load_scriptmem` reads).

    Raises:
        FileNotFoundError: no ``data`` (the message says what to pass), it does not exist, no
            ``questions.jsonl`` sits beside it, or ``data`` is ``questions.jsonl`` without a conversation
            file beside it (the message names the missing file); :class:`ScriptsNotPublished` when the conversation file
            is the published ``format_example`` placeholder.
        DatasetHashMismatch: ``questions.jsonl`` has another sha256, unless allowed.
    """
    if data is None:
        raise FileNotFoundError(
            "ScriptMem needs the script conversation file, which is not published: pass --data PATH to a "
            f"{CONVERSATIONS_FILE} in the published layout, with the pinned {QUESTIONS_FILE} beside it")
    conv = conversation_file(data)
    if not conv.is_file():
        raise FileNotFoundError(f"ScriptMem conversation file {conv} does not exist (--data PATH)")
    questions = questions_beside(conv)
    if not questions.is_file():
        raise FileNotFoundError(
            f"ScriptMem: no {QUESTIONS_FILE} beside {conv}; put the pinned file (sha256 {QUESTIONS_SHA256}, "
            f"{QUESTIONS_URL}) there")
    try:
        verify_sha256(questions, QUESTIONS_SHA256)
    except DatasetHashMismatch:
        if not allow_hash_mismatch:
            raise
    placeholders = [line.get("conversation_id") for line in _read_jsonl(conv, "one conversation object per line")
                    if isinstance(line, dict) and isinstance(line.get("conversation"), dict)
                    and "format_example" in line["conversation"]]
    if placeholders:
        raise ScriptsNotPublished(
            f"ScriptMem: {conv} is the published placeholder (synthetic format_example for {placeholders}); "
            "the script texts are not published. Pass the operator's conversation file in the same layout "
            f"(--data PATH, with the pinned {QUESTIONS_FILE} beside it)")
    return conv
