"""BEAM (100K tier) adapter: ``beam/100K/<n>/{chat*.json, probing_questions.json}`` -> samples.

Source: mohammadtavakoli78/BEAM @ :data:`BEAM_COMMIT` ("Beyond a Million Tokens", Tavakoli et al.;
the 100K tier is the paper's "128K"), files ``chats/100K/<n>/chat_trunecated.json`` (when present, else
``chat.json``; the upstream spelling, and the file the repo's own ``answer_generation.py`` prefers) and
``chats/100K/<n>/probing_questions/probing_questions.json``. Schema notes: ``shared/datasets/MANIFEST.md``
section 3.5. Every file is pinned by sha256 (:data:`BEAM_100K_FILES`, from the MANIFEST appendix).

Mapping decisions:

- One sample per conversation directory ``<n>`` (``1``..``20``, numeric order); ``sample_id`` is
  ``conv-<n>``. The conversation is between the user and an assistant; ``speakers`` is empty, so the
  answer prompt shows the memories as one block in the participant's order.
- A chat file is a list of **batches** ``{batch_number, time_anchor, turns}``; ``turns`` is a list of
  turns and each turn a list of messages ``{role, id, content, [index, question_type, time_anchor]}``.
  Each batch becomes one session (key ``batch_<batch_number>``), added in file order; its messages are
  the turns' messages flattened in order. ``role`` must be ``user`` or ``assistant``; ``content`` is sent
  verbatim (including the upstream ``->-> <batch>,<turn>`` markers in user messages).
- Dates: in this release every batch-level ``time_anchor`` is null and the first message of each batch
  carries one (``"March-15-2024"``). Rule: the batch's ``time_anchor`` when set, else the first
  message's; a message with its own ``time_anchor`` moves the date for itself and the messages after
  it. A batch with no date at all, or a date that is not ``<Month>-<DD>-<YYYY>`` (English month name),
  raises ``DatasetFormatError`` naming the conversation, the batch and the value; there is no fallback to the
  current time. The date has no time of day or zone: it is taken as 00:00 UTC. A message's timestamp
  is its date + its 0-based position in the batch, in ms (order stays explicit, the date stays right).
- Questions: ``probing_questions.json`` is ``{ability: [item, ...]}`` over the ten abilities of
  :data:`ABILITIES`; ``category`` is the ability name; ``question_id = f"{sample_id}:{ability}:q{i}"``
  with ``i`` the item's 0-based position in its ability list. ``rubric`` (a non-empty list of strings,
  the one field every type has and what the official judge scores) becomes ``Question.rubric``. The
  gold ``answer`` is the first present of ``answer``, ``ideal_response``, ``ideal_answer``,
  ``ideal_summary``, ``expected_compliance`` (audit and lexical metrics only; the rubric is the
  contract). ``evidence`` is the cited message ids (``source_chat_ids``, flattened when a dict) as text.
  No question is excluded (abstention questions are scored by their rubric).

The pinned release holds 20 conversations, 82 batches, 5,094 messages (2,547 user / 2,547 assistant)
and 400 questions, 40 per ability (:data:`EXPECTED_COUNTS`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from aml_ray.contract import Message
from aml_ray.datasets.dates import utc_midnight_ms
from aml_ray.datasets.base import Question, Sample, Session
from aml_ray.datasets.fetch import DatasetDownloadError, DatasetHashMismatch, fetch_to_cache, verify_sha256
from aml_ray.datasets.validate import DatasetFormatError, Where, in_file, read_json

#: Dataset name used in ids (``eval:<run>:beam:<sample>``).
DATASET = "beam"
#: The tier this adapter pins (the paper calls it 128K).
TIER = "100K"
BEAM_REPO = "mohammadtavakoli78/BEAM"
BEAM_COMMIT = "b2a3ee8ba12d68f83143dda191097dc3e028ddd3"
#: Raw-file URL of a path in the upstream repository at the pinned commit.
BEAM_URL = "https://raw.githubusercontent.com/" + BEAM_REPO + "/" + BEAM_COMMIT + "/{path}"

#: The ten BEAM ability types, in the file's key order; one is each question's ``category``.
ABILITIES = (
    "abstention", "contradiction_resolution", "event_ordering", "information_extraction",
    "instruction_following", "knowledge_update", "multi_session_reasoning", "preference_following",
    "summarization", "temporal_reasoning",
)
#: Display names of the categories.
CATEGORY_NAMES = {
    "abstention": "abstention", "contradiction_resolution": "contradiction resolution",
    "event_ordering": "event ordering", "information_extraction": "information extraction",
    "instruction_following": "instruction following", "knowledge_update": "knowledge update",
    "multi_session_reasoning": "multi-session reasoning", "preference_following": "preference following",
    "summarization": "summarization", "temporal_reasoning": "temporal reasoning",
}
#: Fields holding the reference answer, by priority (each ability uses exactly one of them).
GOLD_FIELDS = ("answer", "ideal_response", "ideal_answer", "ideal_summary", "expected_compliance")

#: Counts of the pinned release (MANIFEST.md section 1).
EXPECTED_COUNTS = {
    "conversations": 20, "batches": 82, "messages": 5094, "user_messages": 2547, "assistant_messages": 2547,
    "questions": 400, "questions_per_ability": 40,
}

#: sha256 of every file of the pinned 100K tier, path relative to the tier directory (MANIFEST appendix).
BEAM_100K_FILES: dict[str, str] = {
    "1/chat.json": "ea71efd5dcc13f7366d3737b45d532eadb3d1497f3d6f23d1fa1c4004d5ffdf2",
    "1/probing_questions.json": "047398ff1497674b11585e7b4829c3d64d2d5e63f7f3572c826b73ca1faaf898",
    "2/chat.json": "3a3bd796f4aa24e8f34e718dc2823ae942663349eb89054f03885051e2daf1c4",
    "2/probing_questions.json": "d188e929644c9ef9fcd4520e7b5a3daf2c2e069b1247a324bd13d5aadd1ed96e",
    "3/chat.json": "432d3ae5493c04a17a5b6b0ef7c012a70e70ac5cfcaef13059fca6bedb903009",
    "3/probing_questions.json": "f53030f3753b0e0a93b330bc62d597cb66375c0c794094d7e69b7646df46e324",
    "4/chat.json": "e0ef0f74b1f7ac911e8e0518722335c422cbc1112048e9909911b208c51fc027",
    "4/probing_questions.json": "f69eda522cd7325830c8f78b6f02a571c992b6cf43311fa96f28043fd3c18dae",
    "5/chat_trunecated.json": "7d4bbb737bb9fc8430500903af321ba681708f472e42a34bd6f5da8ac548dd9a",
    "5/probing_questions.json": "bdd0819a911e46951dbf998905b8eba96a0cdb103cd3dda79ae9c6831e5f195d",
    "6/chat.json": "5365cdc41da212fb7143cf9f191ff7862eed8e9ca175b3728fe593adedc87871",
    "6/probing_questions.json": "7a6f88dfdeb3f1b582209a745e7c980158dbb2829a9ceae6cdb08bb868a00035",
    "7/chat_trunecated.json": "b3e2d90a1d27970161ec2f179f2a382833bb186a1fdf19b28dfc9cc6aefdf3af",
    "7/probing_questions.json": "2c00219e839d54c7cd3e4fbb396f8a2517fd9f143d3a3b8ea1c4fb9f5c4435c7",
    "8/chat.json": "3207b8f5aa45cd1b2d1e2f37f224831b4696d0cc2352ef514af08f2092b6c239",
    "8/probing_questions.json": "d279dbd8fd293692d29f0057b3dd2468ccb97c7da6df28ae2adc8481d9970148",
    "9/chat.json": "446777f3eed114c27d62030ad86cfb8ad6610fda0fc83dfe98403b8d68b74bd4",
    "9/probing_questions.json": "b7ab1c7022c0b7ac6928f4c2efadd08e2a438dc91e1288209df066cdcd5e9573",
    "10/chat_trunecated.json": "b420ff71ac33686522b8c4f80296a5bfc123d80faf3060ce5e6e91ef730b9aaf",
    "10/probing_questions.json": "e9bf9bb545b350425a770ef65b501434ba9983c7535b4524dd6ae4d5743b5a95",
    "11/chat_trunecated.json": "f3266874081e5a6048727e3cf4ceda9884b357042293f4d57ade9558ee4b9685",
    "11/probing_questions.json": "3aa98a74a03be59472834422dd14004d3b432a0c800bbef8f316865834449c08",
    "12/chat_trunecated.json": "0229c8ad4fbdd675304bf7832fa3e48a7512493897eb3b68f41d0cf947dcc6e0",
    "12/probing_questions.json": "c36c9b1d4df0d063d1c7db81b35b5ea4743e38a804382d6e557f37ec46e1d6e3",
    "13/chat.json": "aea586c143dab53cb5a021b3fab23380d5d9628fea1c4b718f91411019166dc6",
    "13/probing_questions.json": "02dee0ba1d5576aed8ac535328a23fe4f882f6dcff3b96e039162e10d547236b",
    "14/chat.json": "43fbffd9ca235a980203faf4c5d6f636e97af4f31f6d91d9cbe42035ab4f0b0d",
    "14/probing_questions.json": "f30350303b4ccd52a36deaf57750a2bf6924fa5885da92d8230797a82dcfbe5f",
    "15/chat.json": "e758dfbdfe6d5a6bd060c6577e6f0282eb445fd7f93150208dcd56e8f8676f43",
    "15/probing_questions.json": "6d6ed59bd8cad87ce279c08f42137c2199502d09f198cfa880ef3ab04debd891",
    "16/chat_trunecated.json": "a90a86bfe313ce0f6082a69188a500fc2afad2fe86f2fdb1a21c7610ca2a3385",
    "16/probing_questions.json": "abf20d16a37322112af0fe48f5c43be0d824d54ae2bb2c5e3e069c6e84c54033",
    "17/chat_trunecated.json": "fb2067c1ee096dea1cff5cb0f9eafc88e7c6fea41014aebf9ac96ad4a30592bd",
    "17/probing_questions.json": "7948981c2e40751bfe9ace82e53497d32229245e6012a2e5d4da2e801c929451",
    "18/chat_trunecated.json": "0b6224918bb4ffa5e51f22b77d40881daeba233d664c7957fe8937a4a2d75ed2",
    "18/probing_questions.json": "d813db9e2b416e6ac7cc22841b131ea5c80e5931e690f81bb37aa16c3b9edc3a",
    "19/chat_trunecated.json": "dece8764492998bb88c2ec75597bc31c36629483ed1813a6dccdac78ce01bc34",
    "19/probing_questions.json": "b911651b2b18e835aaac58b2bc3cb018bc782e252b9161dca8174961ca498ce2",
    "20/chat_trunecated.json": "774a329b9c43eba22145aadd43203ab6d9a31c1486c70b10b1e2d40908b46758",
    "20/probing_questions.json": "46b679bffff904fd71ed247f5172e9a4a30ed7eb2fdaacc1d89aac0932e5f043",
}

#: The chat file names, in order of preference (upstream ``answer_generation.py``).
CHAT_FILES = ("chat_trunecated.json", "chat.json")
QUESTIONS_FILE = "probing_questions.json"

_DATE = re.compile(r"^\s*([A-Za-z]+)-(\d{1,2})-(\d{4})\s*$")
_ROLES = ("user", "assistant")


def parse_time_anchor(value: Any, *, where: str | Where) -> int:
    """Parse a BEAM ``time_anchor`` (``"March-15-2024"``) into UTC Unix milliseconds (00:00 UTC).

    Examples:
        >>> parse_time_anchor("March-15-2024", where="conv-1 batch 1")
        1710460800000

    Args:
        value: the field's value.
        where: the field's place (a :class:`Where`, or text naming the conversation and batch).

    Returns:
        Milliseconds since the Unix epoch of that day's midnight, UTC.

    Raises:
        DatasetFormatError: the value is not a string ``<Month>-<DD>-<YYYY>`` with an English month
            name, or not a real date; the message names ``where`` and the value.
    """
    here = where if isinstance(where, Where) else Where(f"BEAM {where}", "time_anchor")

    def bad(why: str) -> DatasetFormatError:
        return here.error(f"malformed time_anchor {value!r} ({why}); expected a date like 'March-15-2024'")

    if not isinstance(value, str):
        raise bad("not a string")
    m = _DATE.match(value)
    if not m:
        raise bad("does not match '<Month>-<DD>-<YYYY>'")
    return utc_midnight_ms(m.group(3), m.group(1), m.group(2), bad)


def _session(sample_id: str, position: int, batch: Any) -> Session:
    where = Where(f"{sample_id} " + Where.item_of(position - 1, batch, "batch_number").item)
    where.check(batch, dict, "a batch object {batch_number, time_anchor, turns}")
    number = where.get(batch, "batch_number", (int, str), required=False, default=position)
    turns = where.get(batch, "turns", list, "a list of turns (each a list of messages)")
    placed: list[tuple[Where, dict[str, Any]]] = []
    for t, turn in enumerate(turns):
        (where / "turns" / t).check(turn, list, "a turn: a list of messages")
        for k, m in enumerate(turn):
            placed.append((where / "turns" / t / k, (where / "turns" / t / k).check(m, dict, "a message object")))
    if not placed:
        raise (where / "turns").error("the batch has no messages; expected at least one")
    anchor_at = where / "time_anchor"
    anchor = batch.get("time_anchor")
    if anchor is None:
        anchor_at, anchor = placed[0][0] / "time_anchor", placed[0][1].get("time_anchor")
    if anchor is None:
        raise (where / "time_anchor").error("missing on the batch and on its first message; a session date "
                                            "is required (never the current time)")
    day_ms = parse_time_anchor(anchor, where=anchor_at)
    start = day_ms
    out = []
    for i, (here, m) in enumerate(placed):
        if m.get("time_anchor") is not None and i > 0:
            day_ms = parse_time_anchor(m["time_anchor"], where=here / "time_anchor")
        role = m.get("role")
        if role not in _ROLES:
            raise (here / "role").error(f"role {role!r} is not one of {_ROLES} (message id {m.get('id')!r})")
        content = here.get(m, "content", str, "non-empty text", nonempty=True)
        out.append(Message(role=role, content=content, timestamp=day_ms + i))
    return Session(key=f"batch_{number}", index=position, started_at_ms=start, messages=tuple(out))


def _evidence(item: dict[str, Any]) -> tuple[str, ...]:
    ids = item.get("source_chat_ids")
    if isinstance(ids, dict):
        ids = [i for v in ids.values() for i in (v if isinstance(v, list) else [v])]
    return tuple(str(i) for i in (ids if isinstance(ids, list) else [ids] if ids is not None else ()))


def _questions(sample_id: str, probing: Any) -> tuple[Question, ...]:
    Where("top level").check(probing, dict, "an object keyed by ability")
    unknown = sorted(set(probing) - set(ABILITIES))
    if unknown:
        raise Where("top level").error(f"unknown ability types {unknown}; expected {list(ABILITIES)}")
    questions = []
    for ability in ABILITIES:
        items = Where(path=ability).check(probing.get(ability, []), list, "a list of questions")
        for i, item in enumerate(items):
            qid = f"{sample_id}:{ability}:q{i}"
            where = Where(f"{sample_id} {ability}[{i}] (question_id {qid!r})")
            where.check(item, dict, "a question object {question, rubric, ...}")
            rubric = where.get(item, "rubric", list, "a non-empty list of non-empty strings", nonempty=True)
            for r, line in enumerate(rubric):
                (where / "rubric" / r).check(line, str, nonempty=True)
            text = where.get(item, "question", str, nonempty=True)
            gold = next((item[f] for f in GOLD_FIELDS if item.get(f) is not None), None)
            questions.append(Question(
                question_id=qid, sample_id=sample_id, question=text,
                answer=gold if gold is None or isinstance(gold, str) else str(gold),
                category=ability, evidence=_evidence(item), rubric=tuple(rubric),
            ))
    return tuple(questions)


def _sessions(sample_id: str, chat: Any) -> tuple[Session, ...]:
    Where("top level").check(chat, list, "a non-empty JSON list of batches", nonempty=True)
    return tuple(_session(sample_id, pos, batch) for pos, batch in enumerate(chat, start=1))


def parse_beam_conversation(sample_id: str, chat: list[dict[str, Any]], probing: dict[str, Any]) -> Sample:
    """Turn one decoded conversation (chat file + probing questions) into a sample.

    Args:
        sample_id: the sample id, ``conv-<n>``.
        chat: the chat file's top-level list of batches.
        probing: the probing-questions file's object (ability -> list of items).

    Returns:
        The sample: one session per batch in file order, the questions in :data:`ABILITIES` order.

    Raises:
        DatasetFormatError: a batch, turn or message of the wrong shape, a missing or malformed date, an
            unknown role, empty content, an unknown ability or a question without a rubric; the message
            names the batch (its position and batch_number) or the question and the field.
    """
    return Sample(sample_id=sample_id, sessions=_sessions(sample_id, chat), questions=_questions(sample_id, probing))


def tier_root(path: str | os.PathLike[str]) -> Path:
    """The 100K tier directory (the one holding ``1/``..``20/``) given it, or a folder above it.

    Accepts the tier directory itself, its parent (``beam/``, holding ``100K/``) or the datasets root
    (holding ``beam/100K/``), so ``AML_DATASETS_DIR`` or ``--data`` may name any of them.

    Raises:
        FileNotFoundError: none of these layouts is found under ``path``.
    """
    base = Path(path)
    for candidate in (base, base / TIER, base / "beam" / TIER):
        if (candidate / "1").is_dir():
            return candidate
    raise FileNotFoundError(f"BEAM {TIER} data not found under {base}: expected <dir>/1/{QUESTIONS_FILE}, "
                            f"<dir>/{TIER}/1/... or <dir>/beam/{TIER}/1/... (the layout of shared/datasets)")


def conversation_dirs(root: Path) -> list[Path]:
    """The numbered conversation directories of a tier directory, in numeric order."""
    return sorted((p for p in root.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def chat_file(conv_dir: Path) -> Path:
    """The conversation's chat file: ``chat_trunecated.json`` when present, else ``chat.json``.

    Raises:
        FileNotFoundError: neither exists.
    """
    for name in CHAT_FILES:
        if (conv_dir / name).is_file():
            return conv_dir / name
    raise FileNotFoundError(f"BEAM: {conv_dir} has neither {' nor '.join(CHAT_FILES)}")


def _verify(root: Path, allow_hash_mismatch: bool) -> None:
    """Check that every pinned file is under ``root`` with its sha256."""
    missing = [rel for rel in BEAM_100K_FILES if not (root / rel).is_file()]
    if missing:
        raise FileNotFoundError(f"BEAM {TIER} under {root} lacks {len(missing)} pinned file(s), e.g. "
                                f"{missing[:3]}; use the pinned release ({BEAM_REPO}@{BEAM_COMMIT[:12]})")
    if allow_hash_mismatch:
        return
    for rel, expected in BEAM_100K_FILES.items():
        verify_sha256(root / rel, expected)


def resolve_beam(data: Path | None, *, cache_dir: Path, allow_hash_mismatch: bool = False) -> Path:
    """Find a verified BEAM 100K tier directory (what :func:`load_beam` reads).

    The tier is ``data`` (any folder :func:`tier_root` accepts) or, without ``data``, the cache
    ``cache_dir/beam/100K``, where missing or damaged files are downloaded from :data:`BEAM_URL`. Every
    one of the 40 pinned files (:data:`BEAM_100K_FILES`) must be present with its pinned sha256.

    Args:
        data: a local copy passed by the operator, or None to use the cache.
        cache_dir: the dataset cache root.
        allow_hash_mismatch: accept files whose sha256 differs from the pin (every pinned file must
            still be present).

    Returns:
        The tier directory (the folder holding ``1/`` .. ``20/``).

    Raises:
        FileNotFoundError: ``data`` has no BEAM layout or lacks a pinned file.
        DatasetHashMismatch: a file with another sha256, unless allowed.
        DatasetDownloadError: a file is not cached and could not be downloaded; the message says to pass
            ``--data DIR``.
    """
    if data is not None:
        root = tier_root(data)
    else:
        root = Path(cache_dir) / DATASET / TIER
        for rel, sha in BEAM_100K_FILES.items():
            dest = root / rel
            if dest.is_file():
                try:
                    verify_sha256(dest, sha)
                    continue
                except DatasetHashMismatch:
                    if allow_hash_mismatch:
                        continue
            n, name = rel.split("/")
            upstream = f"chats/{TIER}/{n}/" + (f"probing_questions/{name}" if name == QUESTIONS_FILE else name)
            url = BEAM_URL.format(path=upstream)
            try:
                fetch_to_cache(url, dest, sha, allow_hash_mismatch=allow_hash_mismatch)
            except DatasetDownloadError as exc:
                raise DatasetDownloadError(url, f"{exc.reason}. Pass --data DIR to a local copy of the BEAM "
                                           f"{TIER} tier (the folder holding 1/ .. 20/)") from exc
    _verify(root, allow_hash_mismatch)
    return root


def load_beam(path: str | os.PathLike[str]) -> list[Sample]:
    """Load every conversation of a BEAM 100K tier (no hash check; see :func:`resolve_beam`).

    Args:
        path: the tier directory or a folder above it (see :func:`tier_root`).

    Returns:
        One sample per conversation directory, in numeric order; for the pinned release 20 samples,
        82 sessions, 5,094 messages and 400 questions.

    Raises:
        FileNotFoundError: the layout or a file is missing.
        DatasetFormatError: an empty file, invalid JSON or any error of :func:`parse_beam_conversation`;
            the message names the chat or questions file.
    """
    root = tier_root(path)
    samples = []
    for conv in conversation_dirs(root):
        sample_id = f"conv-{conv.name}"
        chat_path, questions_path = chat_file(conv), conv / QUESTIONS_FILE
        chat = read_json(chat_path, list, "a non-empty JSON list of batches")
        with in_file(chat_path):
            sessions = _sessions(sample_id, chat)
        probing = read_json(questions_path, dict, "an object keyed by ability")
        with in_file(questions_path):
            questions = _questions(sample_id, probing)
        samples.append(Sample(sample_id=sample_id, sessions=sessions, questions=questions))
    return samples
