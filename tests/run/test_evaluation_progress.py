"""A run's progress as :func:`aml_ray.run.evaluation.evaluate` hands it on: done counts never go down."""

from __future__ import annotations

import threading

import pytest

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.config import model_endpoint_from_env
from aml_ray.reference.server import ReferenceServer
from aml_ray.run.evaluation import EvaluationConfig, evaluate

pytestmark = pytest.mark.usefixtures("ray_session")


def test_a_snapshot_that_arrives_late_never_lowers_the_counts_handed_on(tmp_path, locomo_file, monkeypatch):
    """The poller's first tracker snapshot is held until the run's last one has been handed on, then handed on
    itself (a Ray call slowed by a loaded machine): the done counts the caller sees never drop, and end at the
    run's own."""
    import aml_ray.run.pipeline as pipeline

    real = pipeline._snapshot
    monkeypatch.setattr(pipeline, "PROGRESS_POLL_S", 0.05)
    final_seen, held = threading.Event(), []

    def late(tracker):
        snapshot = real(tracker)
        if threading.current_thread() is not threading.main_thread() and not held:
            held.append(snapshot)
            held.append(final_seen.wait(120))  # True: this early snapshot arrives after the run's last one
        return snapshot

    monkeypatch.setattr(pipeline, "_snapshot", late)
    seen: list[dict[str, int]] = []

    def on_progress(kind: str, values: dict[str, int]) -> None:
        if kind == "done":
            seen.append(dict(values))
            if values.get("judge") == 152:
                final_seen.set()

    with ReferenceServer(tmp_path / "ref") as ref:
        result = evaluate(EvaluationConfig(
            dataset="locomo", participant=ParticipantSpec(add_url=ref.add_url, search_url=ref.search_url),
            answer=model_endpoint_from_env("answer", {}), judge=model_endpoint_from_env("judge", {}),
            out_dir=tmp_path / "run", data_path=locomo_file, limit_samples=1), on_progress=on_progress)
    assert result.run_info["dataset"]["scorable_questions"] == 152
    assert held[1] is True and held[0].get("judge", 0) < 152  # an early snapshot, handed on after the last
    for stage in ("add", "search", "judge"):
        counts = [s.get(stage, 0) for s in seen]
        assert counts == sorted(counts), (stage, counts)
    assert (seen[-1].get("search"), seen[-1].get("judge")) == (152, 152)


def test_counts_from_two_threads_are_handed_on_in_order_and_never_lower():
    from aml_ray.run.progress import NeverLower

    handed: list[tuple[str, dict[str, int]]] = []
    progress = NeverLower(lambda kind, values: handed.append((kind, values)))
    progress("totals", {"add": 10, "search": 4})
    progress("done", {"add": 3})  # the head start's Adds
    progress("done", {"add": 1, "search": 2})  # a snapshot taken before them
    workers = [threading.Thread(target=progress, args=("done", {"add": n})) for n in range(10)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert handed[:3] == [("totals", {"add": 10, "search": 4}), ("done", {"add": 3}), ("done", {"add": 3, "search": 2})]
    assert all(values["search"] == 2 for _, values in handed[3:])  # every stage counted so far, each time
    adds = [values["add"] for kind, values in handed[3:]]
    assert adds == sorted(adds) and adds[-1] == 9
