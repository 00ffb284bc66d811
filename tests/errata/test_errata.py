"""Errata (aml_ray.errata): the file's checks, the shipped LoCoMo errata, and ``aml-ray rejudge --errata`` then
``aml-ray compare`` on a real run (Ray, offline answerer and judge) of the planted dataset (tests.planted)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from aml_ray.cli import app
from aml_ray.datasets.registry import get_dataset
from aml_ray.errata import apply_errata, load_errata, shipped
from aml_ray.suite import path_sha256
from tests.planted import gold_only_app, planted_run, write_dataset
OFFLINE_ENV = {"ANSWER_API_BASE": "", "JUDGE_API_BASE": "", "AML_DATASETS_DIR": ""}
SOURCE = "https://github.com/snap-research/locomo/issues/1"


def _write(tmp_path, entries, **top):
    path = tmp_path / "errata.json"
    path.write_text(json.dumps({"bundle": "locomo", "version": "t1", "entries": entries, **top}))
    return path


@pytest.mark.parametrize("entry,field", [
    ({"question_id": "a:q0", "answer": "x"}, "entries.0.source"),
    ({"question_id": "a:q0", "source": SOURCE}, "entries.0"),
    ({"question_id": "a:q0", "answer": "x", "exclude": True, "source": SOURCE}, "entries.0"),
    ({"question_id": "a:q0", "answer": "x", "source": "not a url"}, "entries.0.source"),
    ({"question_id": "a:q0", "answer": "x", "source": SOURCE, "typo": 1}, "entries.0.typo"),
])
def test_a_bad_entry_names_its_field(tmp_path, entry, field):
    with pytest.raises(ValueError, match=rf"errata.json: {field}"):
        load_errata(_write(tmp_path, [entry]))


def test_a_question_listed_twice_is_refused(tmp_path):
    entry = {"question_id": "a:q0", "answer": "x", "source": SOURCE}
    with pytest.raises(ValueError, match="listed twice"):
        load_errata(_write(tmp_path, [entry, entry]))


def test_another_bundles_errata_are_refused(tmp_path):
    errata = load_errata(_write(tmp_path, [{"question_id": "a:q0", "answer": "x", "source": SOURCE}]))
    with pytest.raises(ValueError, match="'locomo'.*'beam'"):
        apply_errata([], errata, dataset="beam")
    with pytest.raises(ValueError, match="sha256"):
        apply_errata([], errata.model_copy(update={"dataset_sha256": "0" * 64}), dataset="locomo",
                     dataset_sha256="1" * 64)


def test_the_shipped_locomo_errata_correct_questions_of_the_pinned_file(locomo_file):
    errata = load_errata(shipped("locomo"))
    assert errata.dataset_sha256 == path_sha256(locomo_file)
    questions = {q.question_id: q for s in get_dataset("locomo").read(locomo_file) for q in s.questions}
    for e in errata.entries:
        q = questions[e.question_id]
        assert q.excluded_reason is None  # a scored question
        assert e.exclude or e.answer != q.answer
    assert questions["conv-26:q0005"].answer == "The sunday before 25 May 2023"
    assert questions["conv-42:q0000"].answer == "Yesteammates on hisvideo game team."


@pytest.fixture(scope="module")
def correct_run(tmp_path_factory, ray_session):
    """The planted dataset against a participant that returns each gold turn: all 3 answers correct."""
    tmp = tmp_path_factory.mktemp("errata")
    data = write_dataset(tmp)
    return planted_run(tmp, data, gold_only_app(), "run")


def test_one_corrected_label_flips_exactly_that_question_and_compare_shows_it(correct_run, tmp_path):
    errata = _write(tmp_path, [{"question_id": "planted:q0001", "answer": "Max", "source": SOURCE},
                               {"question_id": "planted:q0009", "exclude": True, "source": SOURCE}])
    res = CliRunner().invoke(app, ["rejudge", str(correct_run), "--errata", str(errata), "--label", "fixed"],
                             env=OFFLINE_ENV)
    assert res.exit_code == 0, res.output
    done = json.loads((correct_run / "rejudge" / "fixed" / "rejudge.json").read_text())
    assert done["errata"] == {"bundle": "locomo", "version": "t1", "sha256": load_errata(errata).sha256, "entries": 2,
                              "corrected": 1, "excluded": 0, "not_in_run": 1}
    results = json.loads((correct_run / "rejudge" / "fixed" / "results.json").read_text())
    assert results["errata"]["version"] == "t1"
    overall = next(r for r in results["table"] if r["category"] == "overall")
    assert overall["accuracy"] == pytest.approx(2 / 3)
    res = CliRunner().invoke(app, ["compare", str(correct_run), str(correct_run / "rejudge" / "fixed"), "--json"],
                             env=OFFLINE_ENV)
    assert res.exit_code == 0, res.output
    c = json.loads(res.output)["comparisons"][0]
    assert c["other"]["errata"]["version"] == "t1" and "with errata locomo t1" in c["other"]["label"]
    assert [q["question_id"] for q in c["flipped"]["lost"]] == ["planted:q0001"] and c["flipped"]["gained"] == []
    overall = next(r for r in c["rows"] if r["category"] == "overall")
    assert (overall["accuracy_base"], overall["difference"]) == (1.0, pytest.approx(-1 / 3))


def test_an_excluded_question_leaves_the_comparison(correct_run, tmp_path):
    errata = _write(tmp_path, [{"question_id": "planted:q0002", "exclude": True, "source": SOURCE}])
    res = CliRunner().invoke(app, ["rejudge", str(correct_run), "--errata", str(errata), "--label", "drop"],
                             env=OFFLINE_ENV)
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, ["compare", str(correct_run), str(correct_run / "rejudge" / "drop"), "--json"],
                             env=OFFLINE_ENV)
    c = json.loads(res.output)["comparisons"][0]
    assert (c["matched"], c["only_in_base"], c["flipped"]) == (2, 1, {"gained": [], "lost": []})


def test_rejudge_with_a_bad_errata_file_is_a_usage_error(correct_run, tmp_path):
    errata = _write(tmp_path, [{"question_id": "planted:q0001", "answer": "Max"}])
    res = CliRunner().invoke(app, ["rejudge", str(correct_run), "--errata", str(errata)], env=OFFLINE_ENV)
    assert res.exit_code == 2
    assert "entries.0.source" in res.output
