"""SWE-ContextBench Lite rows and past-experience transcripts, read from ../shared/datasets (never copied)."""

from __future__ import annotations

from collections import Counter

import pytest

from aml_ray.actors.participant import ParticipantClient, ParticipantSpec
from aml_ray.coding.bench import parse_test_list
from aml_ray.coding.swecontextbench import LITE_REPOS, LITE_TASKS, lite_bench, load_lite, load_transcripts, memory_sets
from aml_ray.coding.task import Trajectory, Turn
from aml_ray.coding.trajectories import add_requests, sample_id, search_request
from aml_ray.contract import FORMAL_TOP_K
from aml_ray.ids import IdScheme
from aml_ray.reference.server import ReferenceServer
from tests.conftest import SHARED_DATASETS

SWECB = SHARED_DATASETS / "swecontextbench"
LITE, EXPERIENCE = SWECB / "lite", SWECB / "lite_past_experience_sample"


@pytest.fixture(scope="module")
def lite():
    assert LITE.is_dir(), f"{LITE} is missing: tests read the benchmarks from ../shared/datasets"
    return load_lite(LITE)


def test_lite_rows_load_99_tasks_from_12_repositories(lite):
    assert len(lite) == LITE_TASKS == 99
    repos = Counter(t.repo for t in lite)
    assert len(repos) == LITE_REPOS == 12
    # MANIFEST.md: django 36, sympy 26, matplotlib 12, scikit-learn 10, requests 3, then 2s and 1s
    assert repos["django/django"] == 36 and repos["sympy/sympy"] == 26 and repos["matplotlib/matplotlib"] == 12
    assert repos["scikit-learn/scikit-learn"] == 10 and repos["psf/requests"] == 3
    assert repos["pallets/flask"] == 1 and repos["pylint-dev/pylint"] == 1
    for task in lite:
        assert task.fail_to_pass and all("::" in t for t in task.fail_to_pass)  # pytest node ids
        assert task.gold_patch.startswith("diff --git") and task.test_patch
        assert task.snapshot is None and task.source == "swecontextbench-lite"
        dumped = str(task.model_dump())
        assert task.gold_patch not in dumped and task.test_patch not in dumped


def test_stringified_test_lists_are_accepted():
    assert parse_test_list('["a.py::x", "b.py::y"]') == ("a.py::x", "b.py::y")
    assert parse_test_list("['a.py::x']") == ("a.py::x",)
    assert parse_test_list(["a.py::x"]) == ("a.py::x",)
    with pytest.raises(ValueError, match="FAIL_TO_PASS"):
        parse_test_list("not a list", "FAIL_TO_PASS")


def test_experience_transcripts_map_to_trajectories():
    trajectories = load_transcripts(EXPERIENCE)
    assert [t.trajectory_id for t in trajectories] == ["24bd9016", "2c83fc86", "8755d4c0"]
    first = trajectories[0]
    assert first.repo == "django/django" and first.source_instance_id == "django__django-11905"
    assert first.files_touched == ("django/db/models/lookups.py",)
    roles = Counter(t.role for t in first.turns)
    assert roles["user"] == 1 and roles["tool"] == 46 and roles["assistant"] > 0
    assert first.turns[0].content.startswith("Fix this bug") and first.turns[0].timestamp_ms > 1.7e12
    assert any(t.content.startswith("[tool_use Bash]") for t in first.turns)
    assert all("signature" not in t.content for t in first.turns)  # thinking blocks are dropped
    stamps = [t.timestamp_ms for t in first.turns]
    assert stamps == sorted(stamps)
    assert trajectories[2].repo == "sphinx-doc/sphinx" and "sphinx/util/rst.py" in trajectories[2].files_touched


async def test_an_experience_transcript_adds_to_the_reference_system(tmp_path):
    trajectory = load_transcripts(EXPERIENCE)[0]
    ids = IdScheme("run_swecb", "swecontextbench-lite")
    sid = sample_id("django__django-18166", "relevant")
    requests, meta = add_requests(ids, sid, [trajectory])
    assert len(requests) >= 2 and all(len(r.messages) <= 20 for r in requests)
    assert all(m["n_words"] <= 2000 or len(r.messages) == 1 for r, m in zip(requests, meta))
    assert [r.request_id for r in requests] == [ids.request_id(sid, i) for i in range(len(requests))]
    assert {r.session_id for r in requests} == {ids.session_id(sid, "24bd9016")}
    assert requests[0].messages[0].content.startswith("[trajectory 24bd9016 on django/django]")
    with ReferenceServer(tmp_path / "ref") as ref:
        client = ParticipantClient(ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url))
        try:
            outcomes = await client.add_in_order(requests)
            assert [o["status"] for o in outcomes] == ["ok"] * len(requests)
            query = "__isnull lookup should not allow non-boolean values"
            found = await client.search_many([(search_request(ids, sid, query, FORMAL_TOP_K), "q")])
        finally:
            await client.aclose()
    memories = found[0]["memories"]
    assert found[0]["status"] == "ok" and memories
    assert any("isnull" in m["content"].lower() for m in memories[:5])


def test_memory_sets_by_gold_patch_file_overlap(lite):
    task = next(t for t in lite if t.repo == "django/django")
    gold_file = task.gold_patch.split("diff --git a/", 1)[1].split(" ", 1)[0]
    turn = (Turn(role="user", content="past work"),)
    candidates = [Trajectory("same-file", "django/django", turn, files_touched=(gold_file,)),
                  Trajectory("same-repo", "django/django", turn, files_touched=("django/other.py",)),
                  Trajectory("other-repo", "sympy/sympy", turn, files_touched=(gold_file,))]
    relevant, noisy = memory_sets(task, candidates, noisy_per_task=2)
    assert relevant == ("same-file",) and noisy == ("same-repo", "other-repo")
    bench = lite_bench(LITE, experience_dir=EXPERIENCE)
    assert len(bench.tasks) == 99 and len(bench.trajectories) == 3
    assert all(len(t.noisy) == 3 for t in bench.tasks)
