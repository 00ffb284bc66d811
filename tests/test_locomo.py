"""LoCoMo adapter on the pinned locomo10.json, and the dataset fetch/verify helper (local HTTP only)."""

from __future__ import annotations

import functools
import http.server
import json
import socket
import threading
from collections import Counter
from pathlib import Path

import pytest

from aml_ray.datasets import locomo
from aml_ray.datasets.chunking import chunk_sample
from aml_ray.datasets.fetch import (
    DatasetDownloadError,
    DatasetHashMismatch,
    fetch_to_cache,
    sha256_file,
    verify_sha256,
)
from aml_ray.datasets.locomo import (
    LOCOMO_SHA256,
    load_locomo,
    parse_locomo,
    parse_session_datetime,
    resolve_locomo_file,
)
from aml_ray.datasets.validate import DatasetFormatError

# shared/ sits beside the repository (../shared from the repo root), in this workspace and in CI clones.
REPO_ROOT = Path(__file__).resolve().parents[1]
LOCOMO_FILE = REPO_ROOT.parent / "shared" / "datasets" / "locomo" / "locomo10.json"

# The benchmark files come from ../shared/datasets (never copied here); a missing file fails, never skips.
needs_file = pytest.mark.usefixtures("_require_needs_file")


@pytest.fixture
def _require_needs_file() -> None:
    assert LOCOMO_FILE.exists(), f"{LOCOMO_FILE} is missing: tests read the benchmarks from ../shared/datasets"


@pytest.fixture(scope="module")
def raw():
    return json.loads(LOCOMO_FILE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def samples():
    return load_locomo(LOCOMO_FILE)


def by_id(samples, sample_id):
    return next(s for s in samples if s.sample_id == sample_id)


# ---------------------------------------------------------------- real file


@needs_file
def test_pinned_file_hash_and_counts_match_manifest(samples):
    assert sha256_file(LOCOMO_FILE) == LOCOMO_SHA256
    assert len(samples) == 10
    assert sum(len(s.messages) for x in samples for s in x.sessions) == 5882
    assert sum(len(x.sessions) for x in samples) == 272
    questions = [q for x in samples for q in x.questions]
    assert len(questions) == 1986
    assert Counter(q.category for q in questions) == {"1": 282, "2": 321, "3": 96, "4": 841, "5": 446}
    assert sum(q.excluded_reason is None for q in questions) == 1540


@needs_file
def test_total_chunk_count(samples):
    chunks = [c for x in samples for c in chunk_sample(x)]
    print(f"LoCoMo chunks: {len(chunks)}")
    assert len(chunks) == 399
    for x in samples:
        assert [c.index for c in chunk_sample(x)] == list(range(len(chunk_sample(x))))


@needs_file
def test_sample_ids_and_speakers(samples):
    assert [x.sample_id for x in samples][:3] == ["conv-26", "conv-30", "conv-41"]
    conv26 = by_id(samples, "conv-26")
    assert conv26.speakers == ("Caroline", "Melanie")
    first = conv26.sessions[0].messages
    assert first[0].role == "user" and first[0].content.startswith("Caroline: ")
    assert first[1].role == "assistant" and first[1].content.startswith("Melanie: ")


@needs_file
def test_sessions_in_numeric_order(samples):
    conv41 = by_id(samples, "conv-41")
    assert len(conv41.sessions) == 32
    assert [s.key for s in conv41.sessions] == [f"session_{n}" for n in range(1, 33)]
    assert [s.index for s in conv41.sessions] == list(range(1, 33))


@needs_file
def test_conv26_skips_sessions_with_a_date_but_no_turns(samples, raw):
    conv = next(x for x in raw if x["sample_id"] == "conv-26")["conversation"]
    assert "session_35_date_time" in conv and not conv.get("session_35")
    conv26 = by_id(samples, "conv-26")
    assert [s.key for s in conv26.sessions] == [f"session_{n}" for n in range(1, 20)]


@needs_file
def test_session_timestamp_and_message_offsets(samples):
    s1 = by_id(samples, "conv-26").sessions[0]
    assert s1.started_at_ms == 1683554160000  # "1:56 pm on 8 May, 2023" as UTC
    assert [m.timestamp for m in s1.messages] == [s1.started_at_ms + i for i in range(len(s1.messages))]


@needs_file
def test_image_caption_kept_as_text(samples):
    m = by_id(samples, "conv-26").sessions[0].messages[4]  # dia_id D1:5
    assert m.content == (
        "Caroline: The transgender stories were so inspiring! I was so happy and thankful for all the "
        "support. [shares an image: a photo of a dog walking past a wall with a painting of a woman]")
    assert "i.redd.it" not in m.content


@needs_file
def test_int_answer_becomes_text_and_evidence_is_split(samples):
    qs = {q.question: q for q in by_id(samples, "conv-26").questions}
    q = qs["When did Melanie paint a sunrise?"]
    assert q.answer == "2022" and q.category == "2"
    assert qs["What did Melanie paint recently?"].evidence == ("D8:6", "D9:17")
    first = by_id(samples, "conv-26").questions[0]
    assert first.question_id == "conv-26:q0000" and first.evidence == ("D1:3",)
    assert all(not isinstance(q.answer, int) for x in samples for q in x.questions)


@needs_file
@pytest.mark.parametrize("include", [False, True])
def test_adversarial_excluded_and_never_uses_adversarial_answer(raw, include):
    samples = parse_locomo(raw, include_adversarial=include)
    for item, sample in zip(raw, samples):
        for src, q in zip(item["qa"], sample.questions):
            if src["category"] != 5:
                assert q.excluded_reason is None
                continue
            assert q.excluded_reason == (None if include else "adversarial")
            assert q.answer == src.get("answer")
            if q.answer is not None:
                assert q.answer != src["adversarial_answer"]
    answers = [q.answer for x in samples for q in x.questions if q.category == "5"]
    assert answers.count(None) == 444 and sorted(a for a in answers if a) == ["No", "No"]


# ---------------------------------------------------------------- dates


@pytest.mark.parametrize("value, iso", [
    ("1:56 pm on 8 May, 2023", "2023-05-08T13:56:00+00:00"),
    ("10:37 am on 27 June, 2023", "2023-06-27T10:37:00+00:00"),
    ("12:00 am on 1 January, 2023", "2023-01-01T00:00:00+00:00"),
    ("12:30 pm on 31 December, 2022", "2022-12-31T12:30:00+00:00"),
])
def test_parse_session_datetime(value, iso):
    from datetime import datetime
    assert parse_session_datetime(value, sample_id="s", key="k") == int(
        datetime.fromisoformat(iso).timestamp() * 1000)


@pytest.mark.parametrize("value", [
    "", None, "2023-05-08 13:56", "13:56 pm on 8 May, 2023", "1:56 pm on 31 February, 2023",
    "1:56 pm on 8 Mai, 2023", "1:61 pm on 8 May, 2023",
])
def test_malformed_date_raises_naming_sample_key_and_value(value):
    data = [{"sample_id": "conv-x", "qa": [], "conversation": {
        "speaker_a": "A", "speaker_b": "B",
        "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "hi"}],
        "session_1_date_time": value,
    }}]
    with pytest.raises(ValueError) as err:
        parse_locomo(data)
    msg = str(err.value)
    assert "conv-x" in msg and "session_1_date_time" in msg and repr(value) in msg


def test_unknown_speaker_is_refused():
    data = [{"sample_id": "conv-x", "qa": [], "conversation": {
        "speaker_a": "A", "speaker_b": "B", "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [{"speaker": "C", "dia_id": "D1:1", "text": "hi"}],
    }}]
    with pytest.raises(ValueError, match="speaker 'C'"):
        parse_locomo(data)


# ---------------------------------------------------------------- malformed files


def _small() -> dict:
    return {"sample_id": "conv-x", "conversation": {
        "speaker_a": "A", "speaker_b": "B", "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "hi"},
                      {"speaker": "B", "dia_id": "D1:2", "text": "yo"}]},
        "qa": [{"question": "Who said hi?", "answer": "A", "evidence": ["D1:1"], "category": 4},
               {"question": "When?", "answer": 2023, "evidence": ["D1:1"], "category": 2}]}


def _del(path: tuple):
    def change(item: dict) -> None:
        for k in path[:-1]:
            item = item[k]
        del item[path[-1]]
    return change


def _set(path: tuple, value):
    def change(item: dict) -> None:
        for k in path[:-1]:
            item = item[k]
        item[path[-1]] = value
    return change


@pytest.mark.parametrize(("change", "expected"), [
    (_del(("qa", 1, "question")), "field 'qa[1].question': missing; expected a non-empty string"),
    (_set(("qa", 1, "question"), ["When", "?"]), "field 'qa[1].question': expected a non-empty string, got a list"),
    (_set(("qa", 0, "category"), None), "field 'qa[0].category': expected a string or an integer, got null"),
    (_del(("qa", 0, "category")), "field 'qa[0].category': missing; expected a string or an integer"),
    (_set(("qa", 0, "answer"), {"text": "A"}),
     "field 'qa[0].answer': expected text, a number or a list of answers, got an object"),
    (_set(("qa", 0, "evidence"), "D1:1"), "field 'qa[0].evidence': expected a list, got a string 'D1:1'"),
    (_set(("qa", 0), "Who said hi?"), "field 'qa[0]': expected a question object {question, answer, category, "
                                      "evidence}, got a string 'Who said hi?'"),
    (_set(("qa",), {}), "field 'qa': expected a list, got an empty object"),
    (_del(("conversation", "speaker_b")), "field 'conversation.speaker_b': missing; expected a non-empty string"),
    (_set(("conversation", "session_1"), "hi"), "field 'conversation.session_1': expected a list of turns, got a "
                                               "string 'hi'"),
    (_set(("conversation", "session_1", 1), "yo"), "field 'conversation.session_1[1]': expected a turn object "
                                                   "{speaker, dia_id, text}, got a string 'yo'"),
    (_del(("conversation", "session_1", 1, "text")), "field 'conversation.session_1[1].text': missing; expected a "
                                                     "string"),
    (_del(("conversation", "session_1_date_time")), "field 'conversation.session_1_date_time': missing; session_1 "
                                                    "has turns, so its date is required"),
    (_del(("conversation",)), "field 'conversation': missing; expected an object"),
])
def test_a_malformed_item_names_the_file_item_and_field(tmp_path, change, expected):
    """Before issue 24 these were raw KeyError / TypeError tracebacks (or failed deep inside the run)."""
    items = [_small(), _small()]
    items[1]["sample_id"] = "conv-y"
    change(items[1])
    f = tmp_path / "locomo10.json"
    f.write_text(json.dumps(items))
    with pytest.raises(DatasetFormatError) as exc:
        load_locomo(f)
    assert str(exc.value) == f"{f}: item 1 (sample_id 'conv-y'): {expected}"


@pytest.mark.parametrize(("text", "expected"), [
    ("", "empty file; expected a JSON list of conversations"),
    ('[{"sample_id": ', "not JSON (Expecting value at line 1 column 16); expected a JSON list of conversations"),
    ('{"sample_id": "conv-x"}', "top level: expected a JSON list of conversations, got an object"),
    ("[7]", "item 0: expected a conversation object {sample_id, conversation, qa}, got an integer 7"),
    ('[{"conversation": {}}]', "item 0: field 'sample_id': missing; expected a non-empty string"),
])
def test_a_malformed_file_names_the_file(tmp_path, text, expected):
    f = tmp_path / "locomo10.json"
    f.write_text(text)
    with pytest.raises(DatasetFormatError) as exc:
        load_locomo(f)
    assert str(exc.value) == f"{f}: {expected}"


# ---------------------------------------------------------------- hash checks


@needs_file
def test_resolve_accepts_the_pinned_file(tmp_path):
    assert resolve_locomo_file(LOCOMO_FILE, cache_dir=tmp_path) == LOCOMO_FILE


def test_resolve_refuses_another_hash_unless_allowed(tmp_path):
    other = tmp_path / "locomo10.json"
    other.write_text("[]")
    with pytest.raises(DatasetHashMismatch) as err:
        resolve_locomo_file(other, cache_dir=tmp_path / "cache")
    msg = str(err.value)
    assert LOCOMO_SHA256 in msg and sha256_file(other) in msg and "--allow-hash-mismatch" in msg
    assert isinstance(err.value, ValueError)
    assert resolve_locomo_file(other, cache_dir=tmp_path / "cache", allow_hash_mismatch=True) == other


def test_resolve_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="--data"):
        resolve_locomo_file(tmp_path / "nope.json", cache_dir=tmp_path)


# ---------------------------------------------------------------- fetch (local HTTP server only)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def serve():
    """Serve a directory on 127.0.0.1; returns a function dir -> base URL."""
    servers = []

    def start(directory: Path) -> str:
        handler = functools.partial(_QuietHandler, directory=str(directory))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def dead_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/locomo10.json"


def _payload(tmp_path: Path) -> tuple[Path, str]:
    src = tmp_path / "www"
    src.mkdir()
    (src / "data.json").write_bytes(b'{"hello": "world"}\n' * 1000)
    return src, sha256_file(src / "data.json")


def test_fetch_good_hash_saves_atomically(tmp_path, serve):
    src, digest = _payload(tmp_path)
    dest = tmp_path / "cache" / "x" / "data.json"
    assert fetch_to_cache(serve(src) + "/data.json", dest, digest, timeout=5) == dest
    assert dest.read_bytes() == (src / "data.json").read_bytes()
    verify_sha256(dest, digest.upper())
    assert sorted(p.name for p in dest.parent.iterdir()) == ["data.json"]  # no temp file left


def test_fetch_bad_hash_refused_and_cache_left_empty(tmp_path, serve):
    src, digest = _payload(tmp_path)
    cache = tmp_path / "cache"
    with pytest.raises(DatasetHashMismatch) as err:
        fetch_to_cache(serve(src) + "/data.json", cache / "data.json", "0" * 64, timeout=5)
    assert "0" * 64 in str(err.value) and digest in str(err.value)
    assert list(cache.iterdir()) == []


def test_fetch_bad_hash_allowed_keeps_file(tmp_path, serve):
    src, _ = _payload(tmp_path)
    dest = tmp_path / "cache" / "data.json"
    fetch_to_cache(serve(src) + "/data.json", dest, "0" * 64, timeout=5, allow_hash_mismatch=True)
    assert dest.is_file()


def test_fetch_http_error_leaves_nothing(tmp_path, serve):
    src, digest = _payload(tmp_path)
    cache = tmp_path / "cache"
    with pytest.raises(DatasetDownloadError, match="HTTP 404"):
        fetch_to_cache(serve(src) + "/missing.json", cache / "data.json", digest, timeout=5)
    assert list(cache.iterdir()) == []


def test_fetch_unreachable_says_pass_data(tmp_path, dead_url):
    with pytest.raises(DatasetDownloadError, match=r"pass --data PATH"):
        fetch_to_cache(dead_url, tmp_path / "data.json", "0" * 64, timeout=2)
    assert list(tmp_path.iterdir()) == []


def test_resolve_offline_says_pass_data(tmp_path, dead_url, monkeypatch):
    monkeypatch.setattr(locomo, "LOCOMO_URL", dead_url)
    with pytest.raises(DatasetDownloadError) as err:
        resolve_locomo_file(None, cache_dir=tmp_path)
    msg = str(err.value)
    assert "--data PATH" in msg and "../shared/datasets/locomo/locomo10.json" in msg


@needs_file
def test_resolve_downloads_into_cache_then_reuses_it(tmp_path, serve, monkeypatch, dead_url):
    monkeypatch.setattr(locomo, "LOCOMO_URL", serve(LOCOMO_FILE.parent) + "/locomo10.json")
    cached = resolve_locomo_file(None, cache_dir=tmp_path)
    assert cached == tmp_path / "locomo" / "locomo10.json"
    assert sha256_file(cached) == LOCOMO_SHA256
    monkeypatch.setattr(locomo, "LOCOMO_URL", dead_url)  # a verified cache entry needs no network
    assert resolve_locomo_file(None, cache_dir=tmp_path) == cached


def test_resolve_replaces_a_damaged_cache_entry(tmp_path, serve, monkeypatch):
    src = tmp_path / "www"
    src.mkdir()
    (src / "locomo10.json").write_text("[]")
    monkeypatch.setattr(locomo, "LOCOMO_URL", serve(src) + "/locomo10.json")
    monkeypatch.setattr(locomo, "LOCOMO_SHA256", sha256_file(src / "locomo10.json"))
    cached = tmp_path / "cache" / "locomo" / "locomo10.json"
    cached.parent.mkdir(parents=True)
    cached.write_text("damaged")
    assert resolve_locomo_file(None, cache_dir=tmp_path / "cache") == cached
    assert cached.read_text() == "[]"
