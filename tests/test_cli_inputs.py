"""``aml-ray run``: arguments and dataset files are checked before anything is created, and the exit
codes tell a usage error (2) from a failed run (1) (issue 24, items 7 and 9)."""

from __future__ import annotations

import copy
import doctest
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from aml_ray.cli import app
from aml_ray.datasets import registry, validate
from aml_ray.datasets.validate import DatasetFormatError

OFFLINE_ENV = {"ANSWER_API_BASE": "", "JUDGE_API_BASE": "", "AML_DATASETS_DIR": ""}


def run_cli(*args: str, env: dict[str, str] | None = None):
    """``aml-ray run ARGS`` in-process; ``output`` holds stdout and stderr."""
    return CliRunner().invoke(app, ["run", *args], env={**OFFLINE_ENV, **(env or {})})


@pytest.fixture(scope="module")
def conversation(locomo_file) -> dict:
    """The first LoCoMo conversation (conv-26), decoded."""
    return json.loads(locomo_file.read_text())[0]


def write(path: Path, value) -> Path:
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return path


def test_unknown_dataset_is_refused_before_any_directory(tmp_path):
    out = tmp_path / "run"
    res = run_cli("--dataset", "locomo11", "--out", str(out))
    assert res.exit_code == 2, res.output
    assert "unknown dataset 'locomo11'" in res.output and "'locomo'" in res.output and "'beam'" in res.output
    assert not out.exists()


def test_missing_data_is_refused_before_any_directory(tmp_path):
    out, data = tmp_path / "run", tmp_path / "nowhere" / "locomo10.json"
    res = run_cli("--data", str(data), "--out", str(out))
    assert res.exit_code == 2, res.output
    # the message is wrapped to the console's width, at a space or inside the path: compare without whitespace
    assert f"--data{data}:nosuchfileordirectory" in "".join(res.output.split())
    assert not out.exists()


def test_data_of_a_one_file_dataset_must_be_a_file(tmp_path):
    out = tmp_path / "run"
    res = run_cli("--data", str(tmp_path), "--out", str(out), "--allow-hash-mismatch")
    assert res.exit_code == 2, res.output
    flat = " ".join(res.output.split())  # rich wraps long lines (a long tmp path moves the break)
    assert "is a directory" in flat and "locomo reads one file" in flat
    assert not out.exists()


def test_unknown_suite_is_refused_before_any_directory(tmp_path):
    out = tmp_path / "run"
    res = run_cli("--suite", "textal", "--out", str(out))
    assert res.exit_code == 2, res.output
    assert "textal" in res.output
    assert not out.exists()


def test_suite_with_data_is_refused_before_any_directory(tmp_path, locomo_file):
    out = tmp_path / "run"
    res = run_cli("--suite", "textual", "--data", str(locomo_file), "--out", str(out))
    assert res.exit_code == 2, res.output
    assert "--suite fixes the dataset files" in res.output
    assert not out.exists()


def test_unknown_reference_system_is_refused_before_any_directory(tmp_path):
    out = tmp_path / "run"
    res = run_cli("--participant", "reference:faiss", "--out", str(out))
    assert res.exit_code == 2, res.output
    assert "the reference systems are reference:bm25, reference:none" in " ".join(res.output.split())
    assert not out.exists()


@pytest.mark.parametrize(("args", "error"), [
    (["run", "--bogus"], "Error: No such option: --bogus. 'aml-ray run --help' lists the options."),
    (["run", "--dataset-x", "locomo"], "Error: No such option: --dataset-x. Did you mean --dataset or "
                                       "--datasets-dir? 'aml-ray run --help' lists the options."),
    (["run", "--limit-sample", "1"], "Error: No such option: --limit-sample. Did you mean --limit-samples? "
                                     "'aml-ray run --help' lists the options."),
    (["compare", "--jsno", "a", "b"], "Error: No such option: --jsno. Did you mean --json? "
                                      "'aml-ray compare --help' lists the options."),
    (["datasets", "verify", "--bogus"], "Error: No such option: --bogus. 'aml-ray datasets verify --help' "
                                        "lists the options."),
])
def test_an_unknown_option_is_named_with_the_help_to_read(args, error):
    """click suggested options by likeness of the whole string, dashes included: ``--bogus`` got "(Possible
    options: --out, --verbose)". Only a close name is suggested now, and the error names the command's help."""
    res = CliRunner().invoke(app, args, env=OFFLINE_ENV, prog_name="aml-ray")
    assert res.exit_code == 2, res.output
    lines = res.output.splitlines()
    assert lines[-1] == error, res.output
    assert lines[0].startswith(f"Usage: aml-ray {' '.join(a for a in args[:2] if not a.startswith('-'))} ")
    assert "Possible options" not in res.output and "Traceback" not in res.output


def _malformed(conversation: dict, kind: str) -> tuple[str, list[str]]:
    """A malformed locomo10.json text and the phrases its error must contain (besides the file)."""
    item = json.loads(json.dumps(conversation))
    if kind == "empty":
        return "", ["empty file", "expected a JSON list of conversations"]
    if kind == "invalid_json":
        return '[{"sample_id": ', ["not JSON", "line 1 column"]
    if kind == "top_level_object":
        return json.dumps(item), ["top level", "expected a JSON list of conversations", "got an object"]
    if kind == "missing_question":
        del item["qa"][3]["question"]
        return json.dumps([item]), ["item 0 (sample_id 'conv-26')", "field 'qa[3].question': missing; "
                                    "expected a non-empty string"]
    if kind == "question_wrong_type":
        item["qa"][5]["question"] = ["When", "?"]
        return json.dumps([item]), ["item 0 (sample_id 'conv-26')", "field 'qa[5].question': expected a "
                                    "non-empty string, got a list"]
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["empty", "invalid_json", "top_level_object", "missing_question",
                                  "question_wrong_type"])
def test_malformed_dataset_file_is_named_and_creates_nothing(tmp_path, conversation, kind):
    text, phrases = _malformed(conversation, kind)
    data, out = write(tmp_path / f"{kind}.json", text), tmp_path / "run"
    res = run_cli("--data", str(data), "--allow-hash-mismatch", "--limit-samples", "1", "--out", str(out))
    assert res.exit_code == 2, res.output
    said = " ".join(res.output.split())  # rich wraps long lines
    assert "Traceback" not in said and "KeyError" not in said and "TypeError" not in said
    assert str(data) in said.replace(" ", "") or str(data) in said
    for phrase in phrases:
        assert phrase in said, (phrase, said)
    assert not out.exists()  # no run directory, so no reference server was started in it either


def test_malformed_dataset_file_leaves_an_existing_out_directory_as_it_was(tmp_path, conversation):
    text, _ = _malformed(conversation, "missing_question")
    data, out = write(tmp_path / "bad.json", text), tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    res = run_cli("--data", str(data), "--allow-hash-mismatch", "--out", str(out))
    assert res.exit_code == 2, res.output
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"


def _adversarial_only(conversation: dict) -> dict:
    """conv-26 renamed, every question made category 5 (adversarial: excluded from scoring)."""
    item = copy.deepcopy(conversation)
    item["sample_id"] = "conv-adv"
    item["qa"] = [{**qa, "category": 5} for qa in item["qa"][:4]]
    return item


@pytest.mark.parametrize(("kind", "extra", "phrases"), [
    ("empty_list", (), ["holds no sample", "a run would measure nothing",
                        "pass a file with at least one sample that has a scorable question"]),
    ("adversarial_only", (), ["1 sample(s) hold no scorable question", "4 question(s), every one excluded "
                              "(4 adversarial)", "a run would measure nothing",
                              "pass a file with at least one scorable question"]),
    ("nothing_in_the_limit", ("--limit-samples", "1"),
     ["the first 1 sample(s) (--limit-samples 1) hold no scorable question", "every one excluded (4 adversarial)",
      "a run would measure nothing", "the file has 152 scorable question(s) in 2 sample(s)",
      "raise --limit-samples or drop it"]),
])
def test_a_dataset_with_nothing_to_score_is_refused_before_any_directory(tmp_path, conversation, kind, extra,
                                                                        phrases):
    """A run that could measure nothing (no sample, or no scorable question in the samples it would run)
    is an input error (exit 2) naming the file and the fix, before the run directory or the reference
    system exists; it used to run and end ``completed`` with exit 0."""
    content = {"empty_list": [], "adversarial_only": [_adversarial_only(conversation)],
               "nothing_in_the_limit": [_adversarial_only(conversation), conversation]}[kind]
    data, out = write(tmp_path / f"{kind}.json", content), tmp_path / "run"
    res = run_cli("--data", str(data), "--allow-hash-mismatch", *extra, "--out", str(out))
    said = " ".join(res.output.split())  # rich wraps long lines
    assert res.exit_code == 2, said
    assert said.startswith("error: ") and f"{data}:" in said.replace(" ", ""), said
    for phrase in phrases:
        assert phrase in said, (phrase, said)
    assert "completed" not in said and "Traceback" not in said
    assert not out.exists()


def test_a_bundle_whose_counts_differ_is_refused_before_any_directory(tmp_path):
    """CL-bench has no pin yet, so its question count is the check: one task is not the release's 1,899."""
    data, out = _clbench(tmp_path), tmp_path / "run"
    res = run_cli("--dataset", "clbench", "--data", str(data), "--out", str(out))
    assert res.exit_code == 2, res.output
    assert "total 1 != 1899" in " ".join(res.output.split())
    assert not out.exists()


def test_a_usage_error_after_the_run_directory_removes_only_what_it_created(tmp_path):
    from aml_ray.cli_run import missing_top as _missing_top, remove_unused_run_dir as _remove_unused_run_dir

    out = tmp_path / "runs" / "r1"
    top = _missing_top(out)
    assert top == tmp_path / "runs"
    out.mkdir(parents=True)
    (out / "reference").mkdir()
    _remove_unused_run_dir(out, top)
    assert not (tmp_path / "runs").exists() and tmp_path.is_dir()
    out.mkdir(parents=True)  # a folder above that holds another run stays
    (tmp_path / "runs" / "r0").mkdir()
    _remove_unused_run_dir(out, top)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["r0"]
    out.mkdir()
    (out / "run.json").write_text("{}")  # a recorded run is never removed
    _remove_unused_run_dir(out, _missing_top(out))
    _remove_unused_run_dir(out, top)
    assert (out / "run.json").is_file()
    assert _missing_top(out) is None


@pytest.mark.usefixtures("ray_session")
def test_contract_stop_exits_1_and_usage_error_exits_2(tmp_path, locomo_file):
    """A participant that answers ``"success": "true"`` stops the run: exit code 1 (run failed), with
    run.json status=failed; the same command again is a usage error (a run is already there): 2."""
    from tests.bad_participants import BadParticipant

    out = tmp_path / "run"
    args = ("--data", str(locomo_file), "--limit-samples", "1", "--out", str(out))
    with BadParticipant("success_string") as bp:
        res = run_cli(*args, "--participant", bp.base_url)
        again = run_cli(*args, "--participant", bp.base_url)
    assert res.exit_code == 1, res.output
    assert "run stopped" in res.output and "success" in res.output
    assert json.loads((out / "run.json").read_text())["status"] == "failed"
    assert again.exit_code == 2 and "already there" in again.output


# ---------------------------------------------------------------- the shared check (aml_ray.datasets.validate)


def test_validate_docstring_examples():
    result = doctest.testmod(validate, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted >= 6


def test_format_error_survives_pickling_with_its_place():
    """Ray carries exceptions between processes: the file, item and field must come along."""
    import pickle

    exc = DatasetFormatError("missing; expected a string", file="/d/locomo10.json", item="item 2",
                             field="qa[0].question")
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is DatasetFormatError and str(back) == str(exc) == (
        "/d/locomo10.json: item 2: field 'qa[0].question': missing; expected a string")
    assert isinstance(back, ValueError)


@pytest.mark.parametrize(("text", "message"), [
    ("", "empty file; expected a JSON list of conversations"),
    ("  \n", "empty file; expected a JSON list of conversations"),
    ('[{"a": 1},]', "not JSON (Expecting value at line 1 column 11); expected a JSON list of conversations"),
    ('{"a": 1}', "top level: expected a JSON list of conversations, got an object"),
    ("7", "top level: expected a JSON list of conversations, got an integer 7"),
])
def test_read_json_names_the_file_and_what_was_expected(tmp_path, text, message):
    f = tmp_path / "locomo10.json"
    f.write_text(text)
    with pytest.raises(DatasetFormatError) as exc:
        validate.read_json(f, list, "a JSON list of conversations")
    assert str(exc.value) == f"{f}: {message}"


def test_read_json_refuses_bytes_that_are_not_utf8(tmp_path):
    f = tmp_path / "x.json"
    f.write_bytes(b'["caf\xe9"]')
    with pytest.raises(DatasetFormatError, match=r"x.json: not UTF-8 text \(byte 5\); expected a list"):
        validate.read_json(f, list, "a list")


# ---------------------------------------------------------------- every adapter: no other error gets out

#: Values a field is replaced by in the sweep: every JSON type.
REPLACEMENTS: tuple[Any, ...] = (None, 7, 2.5, True, "x", "", [], {}, ["x"], {"x": 1})


def _places(value: Any, path: tuple = ()) -> Iterator[tuple]:
    """Every place in a decoded JSON value (the first two elements of each list)."""
    if path:
        yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _places(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value[:2]):
            yield from _places(v, path + (i,))


def _mutants(value: Any) -> Iterator[tuple[str, Any]]:
    """``(what was changed, changed copy)``: each place deleted (from an object) or replaced by each JSON type."""
    for path in _places(value):
        parent_path, key = path[:-1], path[-1]
        if isinstance(key, str):
            changed = copy.deepcopy(value)
            parent = changed
            for k in parent_path:
                parent = parent[k]
            del parent[key]
            yield f"del {path}", changed
        for new in REPLACEMENTS:
            changed = copy.deepcopy(value)
            parent = changed
            for k in parent_path:
                parent = parent[k]
            parent[key] = new
            yield f"{path} = {new!r}", changed


def _locomo(root: Path) -> Path:
    conv = json.loads((Path(__file__).resolve().parents[2] / "shared" / "datasets" / "locomo" / "locomo10.json")
                      .read_text())[0]
    c = conv["conversation"]
    small = {"sample_id": conv["sample_id"], "qa": conv["qa"][:2] + [q for q in conv["qa"] if q["category"] == 5][:1],
             "conversation": {"speaker_a": c["speaker_a"], "speaker_b": c["speaker_b"],
                              "session_1_date_time": c["session_1_date_time"], "session_1": c["session_1"][:2]}}
    (root / "locomo10.json").write_text(json.dumps([small]))
    return root / "locomo10.json"


def _locomo_refined(root: Path) -> Path:
    from tests.test_locomo_refined import refined_layout

    (root / "locomo_refined.json").write_text(json.dumps(refined_layout()[:1]))
    return root / "locomo_refined.json"


def _longmemeval(root: Path) -> Path:
    from tests.test_longmemeval import _instance

    (root / "longmemeval_s.json").write_text(json.dumps([_instance()]))
    return root / "longmemeval_s.json"


def _beam(root: Path) -> Path:
    from tests.test_beam import PROBING, chat, msg

    conv = root / "100K" / "1"
    conv.mkdir(parents=True)
    (conv / "chat.json").write_text(json.dumps(chat([[msg("user", 0, time_anchor="May-02-2024"),
                                                      msg("assistant", 1)]])))
    (conv / "probing_questions.json").write_text(json.dumps(PROBING))
    return root / "100K"


def _personamem(root: Path) -> Path:
    from tests.test_personamem import context, row, write_split

    return write_split(root, [row("q1", "ctx", 2)], {"ctx": context(3)})


def _scriptmem(root: Path) -> Path:
    from tests.test_scriptmem import QA, script

    (root / "questions.jsonl").write_text(json.dumps(QA) + "\n")
    (root / "conversations.jsonl").write_text(json.dumps(script("angry")) + "\n")
    return root / "conversations.jsonl"


def _clbench(root: Path) -> Path:
    from tests.test_clbench import task, write

    return write(root, [task()])


def _memgallery(root: Path) -> Path:
    from tests.mm_fixtures import write_memgallery

    return write_memgallery(root / "mg")


def _atmbench(root: Path) -> Path:
    from tests.mm_fixtures import write_atmbench

    return write_atmbench(root / "atm")


#: dataset -> (builder of a valid input under a folder, returning what --data names; the JSON / JSONL files
#: to take apart, relative to the folder the builder wrote them in).
ADAPTERS: dict[str, tuple[Callable[[Path], Path], tuple[str, ...]]] = {
    "locomo": (_locomo, ("locomo10.json",)),
    "locomo_refined": (_locomo_refined, ("locomo_refined.json",)),
    "longmemeval_s": (_longmemeval, ("longmemeval_s.json",)),
    "beam": (_beam, ("100K/1/chat.json", "100K/1/probing_questions.json")),
    "personamem": (_personamem, ("personamem/shared_contexts_32k.jsonl",)),
    "scriptmem": (_scriptmem, ("questions.jsonl", "conversations.jsonl")),
    "clbench": (_clbench, ("clbench/CL-bench.jsonl",)),
    "memgallery": (_memgallery, ("mg/scenario_001.json",)),
    "atmbench": (_atmbench, ("atm/emails.json", "atm/batch_results.json", "atm/atm-bench.json")),
    "atmbench_hard": (_atmbench, ("atm/atm-bench-hard.json",)),
}


def test_every_registered_dataset_is_swept():
    assert set(ADAPTERS) | {"longmemeval_oracle"} == set(registry.DATASETS)


def _write_like(path: Path, value: Any) -> None:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(v) + "\n" for v in value))
    else:
        path.write_text(json.dumps(value))


def _read_like(path: Path) -> Any:
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().split("\n") if line.strip()]
    return json.loads(path.read_text())


@pytest.mark.parametrize("dataset", sorted(ADAPTERS))
def test_a_malformed_file_raises_only_the_format_error_naming_the_file(tmp_path, dataset):
    """Each field of a valid input deleted, or replaced by each JSON type, in turn: the adapter either
    loads it or raises DatasetFormatError naming the file (never KeyError, TypeError, AttributeError...);
    an empty file and text that is not JSON are refused the same way."""
    build, targets = ADAPTERS[dataset]
    data = build(tmp_path)
    read = registry.get_dataset(dataset).read
    assert read(data)  # the valid input loads
    refused = 0
    for rel in targets:
        target = tmp_path / rel
        original = _read_like(target)
        for what, changed in _mutants(original):
            _write_like(target, changed)
            try:
                read(data)
            except DatasetFormatError as exc:
                refused += 1
                assert str(exc).startswith(str(tmp_path)), (rel, what, str(exc))
            except Exception as exc:  # noqa: BLE001 - the point: nothing else may get out
                pytest.fail(f"{dataset} {rel} {what}: {type(exc).__name__}: {exc}")
        for text, message in (("", "empty file"), ("\n", "empty file"), ('{"x": [', "not JSON")):
            target.write_text(text)
            with pytest.raises(DatasetFormatError) as exc:
                read(data)
            assert str(exc.value).startswith(f"{target}: ") and message in str(exc.value), (rel, text)
        _write_like(target, original)
    assert refused > 10


def test_check_loads_the_file_once_for_the_run(tmp_path):
    """DatasetSpec.check reads and keeps the samples; the run's load of the same unchanged file takes them
    without reading again, once; a changed file is read again."""
    data = _clbench(tmp_path)
    spec = registry.get_dataset("clbench")
    reads: list[Path] = []
    real = spec.read
    object.__setattr__(spec, "read", lambda path: reads.append(path) or real(path))  # a frozen declaration
    try:
        path, samples = spec.check(data, tmp_path / "cache", True)
        assert path == data and reads == [data]
        assert spec.load(data) is samples and reads == [data]
        assert spec.load(data) is not samples and reads == [data, data]  # used once
        spec.check(data, tmp_path / "cache", True)
        data.write_text(data.read_text() + "\n\n")
        assert spec.load(data) is not samples and len(reads) == 4  # changed since the check: read again
    finally:
        object.__setattr__(spec, "read", real)


def test_resuming_a_completed_run_is_refused_before_the_participant_hears_of_it(tmp_path, locomo_file):
    """``--resume`` of a completed run is a usage error (exit 2) found before the pre-flight, which the command
    starts early (beside the evaluation's imports): not one request reaches the participant."""
    from scripts.loopback_servers import ServerProcess

    with ServerProcess("participant", "--latency-ms", "1") as server:
        out = tmp_path / "run"
        out.mkdir()
        run_json = {"run_id": "run_done", "status": "completed", "top_k": 10, "limit_samples": 1, "judge_runs": 1,
                    "context_budget_tokens": 16000, "retrieval_only": False,
                    "dataset": {"name": "locomo", "file": str(locomo_file), "hash_mismatch_allowed": False},
                    "participant": {"label": server.base_url, "auth": "none", "add_url": f"{server.base_url}/add",
                                    "search_url": f"{server.base_url}/search"},
                    "prompts": {"answer": {"source": "locomo_answer", "sha256": None},
                                "judge": {"source": "locomo_judge", "sha256": None}}}
        write(out / "run.json", run_json)
        res = run_cli("--resume", str(out))
        time.sleep(0.5)  # a probe sent from a thread would have arrived by now
        arrivals = server.stats()["n"]
    assert arrivals == {}, res.output
    said = "".join(res.output.split())
    assert res.exit_code == 2 and "runrun_doneisalreadycompleted;nothingtoresume" in said, res.output
    assert json.loads((out / "run.json").read_text()) == run_json  # nothing was changed


def test_a_text_only_answer_model_for_the_multimodal_track_is_refused_before_the_participant_hears_of_it(tmp_path):
    """A usage error that ``evaluate`` also refuses (:func:`aml_ray.stages.answer.require_vision`) is found by the
    command before its early pre-flight: exit 2, no request at the participant, no run directory."""
    from scripts.loopback_servers import ServerProcess
    from tests.mm_fixtures import write_memgallery_release

    data = write_memgallery_release(tmp_path / "memgallery")  # the release's layout: dialog/ and image/
    text_only = {"ANSWER_API_BASE": "http://127.0.0.1:9/v1", "ANSWER_MODEL": "text-only", "ANSWER_API_KEY": "k"}
    with ServerProcess("participant", "--latency-ms", "1") as server:
        res = run_cli("--dataset", "memgallery", "--data", str(data), "--participant", server.base_url,
                      "--out", str(tmp_path / "run"), env=text_only)
        time.sleep(0.5)  # a probe sent from a thread would have arrived by now
        arrivals = server.stats()["n"]
    assert arrivals == {}, res.output
    said = "".join(res.output.split())
    assert res.exit_code == 2 and "answermodel'text-only'istext-only" in said and "ANSWER_VISION=1" in said, res.output
    assert not (tmp_path / "run").exists()
