"""The Textual suite file, bundle checks on disk, the release baseline, and the suite run through Ray."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
from pydantic import ValidationError

from aml_ray.prompts import PROMPT_DIR
from aml_ray.suite import (
    Suite,
    baseline_deviations,
    check_bundle,
    datasets_dir,
    load_suite,
    path_sha256,
    release_baseline,
)
from tests.conftest import SHARED_DATASETS


def shared_sums() -> dict[str, str]:
    out = {}
    for line in (SHARED_DATASETS / "SHA256SUMS").read_text().splitlines():
        digest, path = line.split(maxsplit=1)
        out[path.lstrip("*").removeprefix("./")] = digest
    return out


@pytest.fixture(scope="module")
def suite() -> Suite:
    return load_suite("textual")


def test_textual_suite_fixes_top_k_models_budget_and_the_overall_rule(suite):
    assert suite.name == suite.track == "textual" and suite.version
    assert suite.top_k == 100 and suite.context_budget_tokens == 16_000 and suite.judge_runs == 1
    assert suite.models.answer and suite.models.judge
    assert suite.aggregation.overall == "unweighted_mean" and "unweighted mean" in suite.aggregation.rule
    assert [b.name for b in suite.bundles] == ["locomo", "locomo_refined", "longmemeval_s", "longmemeval_oracle",
                                               "beam", "scriptmem", "personamem", "clbench"]


def test_pins_are_the_manifest_hashes(suite):
    sums = shared_sums()
    pinned = [f for b in suite.bundles for f in b.files if f.sha256 and not f.path.startswith("locomo_refined/")]
    assert len(pinned) == 1 + 2 + 40 + 1
    for f in pinned:
        assert f.sha256 == sums[f.path], f.path
    assert suite.bundle("locomo").files[0].sha256.startswith("79fa87e9")
    assert suite.bundle("longmemeval_oracle").files[0].sha256.startswith("4159de08")


def test_expected_counts_come_from_the_manifest(suite):
    assert suite.bundle("locomo").expected.by_category == {"1": 282, "2": 321, "3": 96, "4": 841, "5": 446}
    assert suite.bundle("longmemeval_oracle").expected.total == 500
    assert set(suite.bundle("beam").expected.by_category.values()) == {40}
    assert suite.bundle("scriptmem").expected.by_category == {"single_choice": 298, "multi_select": 123, "ordering": 36}
    assert suite.bundle("clbench").expected.total == 1899 and suite.bundle("personamem").expected.total == 589


def test_every_prompt_pin_matches_the_shipped_file(suite):
    for b in suite.bundles:
        for role, pin in b.prompts.items():
            if pin.sha256 is not None:
                digest = hashlib.sha256((PROMPT_DIR / f"{pin.name}.j2").read_bytes()).hexdigest()
                assert digest == pin.sha256, f"{b.name} {role} prompt {pin.name}: update the pin in textual.json"


def test_bundle_prompts_and_scorer_are_the_registry_declaration(suite):
    from aml_ray.datasets.registry import DATASETS

    for b in suite.bundles:
        spec = DATASETS.get(b.dataset)
        if spec is None:  # adapter not registered yet: a suite run skips it with a line
            continue
        assert b.scorer == spec.scorer, b.name
        if "answer" in b.prompts:
            assert b.prompts["answer"].name == spec.answer_prompt, b.name
        if "judge" in b.prompts:
            assert b.prompts["judge"].name == spec.judge_prompt, b.name


def test_datasets_dir_is_one_setting(monkeypatch, tmp_path):
    monkeypatch.delenv("AML_DATASETS_DIR", raising=False)
    monkeypatch.setenv("AML_DATA_DIR", str(tmp_path / "data"))
    assert datasets_dir() == tmp_path / "data" / "datasets"
    monkeypatch.setenv("AML_DATASETS_DIR", str(SHARED_DATASETS))
    assert datasets_dir() == SHARED_DATASETS
    assert datasets_dir(tmp_path) == tmp_path


def test_bundles_on_the_shared_datasets(suite):
    status = {b.name: check_bundle(b, root=SHARED_DATASETS).status for b in suite.bundles}
    assert status == {"locomo": "ok", "locomo_refined": "missing", "longmemeval_s": "missing",
                      "longmemeval_oracle": "ok", "beam": "ok", "scriptmem": "ok", "personamem": "missing",
                      "clbench": "missing"}


def test_a_changed_or_missing_file_is_reported(suite, tmp_path):
    beam = suite.bundle("beam")
    root = tmp_path / "beam" / "100K"
    shutil.copytree(SHARED_DATASETS / "beam" / "100K", root)
    (root / "3" / "probing_questions.json").write_text("{}")
    check = check_bundle(beam, root=tmp_path)
    assert check.status == "mismatch" and "3/probing_questions.json" in check.summary()
    shutil.rmtree(root / "7")
    (root / "3" / "probing_questions.json").unlink()
    check = check_bundle(beam, root=tmp_path)
    assert check.status == "incomplete" and "3 of 40 file(s) missing" in check.summary()


@pytest.mark.parametrize(("patch", "needle"), [
    (lambda d: d["bundles"].append(dict(d["bundles"][0])), "bundle names repeat"),
    (lambda d: d["bundles"][0]["files"][0].update(sha256="ABC"), "64 lowercase hex"),
    (lambda d: d["bundles"][0].update(path="/etc/passwd"), "must be relative"),
    (lambda d: d["bundles"][0].update(path="../x"), "must be relative"),
    (lambda d: d["bundles"][0].update(substitute_for="nope"), "not a bundle of the suite"),
    (lambda d: d["bundles"][0]["expected"].update(total=1), "sums to 1986"),
    (lambda d: d.update(top_k=0), "top_k"),
    (lambda d: d.update(surprise=1), "surprise"),
])
def test_suite_file_validation_names_the_problem(patch, needle):
    data = json.loads((PROMPT_DIR.parent / "suites" / "textual.json").read_text())
    patch(data)
    with pytest.raises(ValidationError) as exc:
        Suite.model_validate(data)
    assert needle in str(exc.value)


def test_unknown_suite_lists_the_shipped_ones():
    with pytest.raises(FileNotFoundError, match="textual"):
        load_suite("nope")


def test_release_baseline_holds_what_the_platform_locks(suite):
    base = release_baseline(suite)
    assert base["top_k"] == 100 and base["models"] == suite.models.model_dump()
    assert base["bundles"]["locomo"]["files"] == {"locomo/locomo10.json": suite.bundle("locomo").files[0].sha256}
    assert base["bundles"]["longmemeval_oracle"]["questions"]["total"] == 500
    assert base["bundles"]["longmemeval_oracle"]["prompts"]["judge"]["name"] == "longmemeval_judge"
    assert "unweighted mean" in base["aggregation"]["rule"]


def test_baseline_deviations_name_each_difference(suite):
    bundle = suite.bundle("locomo")
    info = {"models": {"answer": {"model": suite.models.answer}, "judge": {"model": suite.models.judge}},
            "top_k": 100, "context_budget_tokens": 16_000, "judge_runs": 1, "limit_samples": None,
            "prompts": {r: {"sha256": p.sha256} for r, p in bundle.prompts.items()},
            "dataset": {"hash_mismatch_allowed": False}, "bundle": {"files_match": True}}
    assert baseline_deviations(suite, bundle, info) == []
    info.update(top_k=10, limit_samples=2, models={"answer": {"model": "offline"}, "judge": {"model": suite.models.judge}})
    out = baseline_deviations(suite, bundle, info)
    assert any("top_k 10" in d for d in out) and any("offline" in d for d in out) and any("2 sample" in d for d in out)


def test_directory_hash_is_the_index_of_its_files(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "a.json").write_text("1")
    (tmp_path / "b" / "c.json").write_text("2")
    index = "".join(f"{hashlib.sha256(t.encode()).hexdigest()}  {p}\n" for p, t in (("a.json", "1"), ("b/c.json", "2")))
    assert path_sha256(tmp_path) == hashlib.sha256(index.encode()).hexdigest()
    assert path_sha256(tmp_path / "a.json") == hashlib.sha256(b"1").hexdigest()
