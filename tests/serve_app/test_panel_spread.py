"""The judge panel's figures of a job, read from the panel.json files under its run directories."""

from __future__ import annotations

import json

from aml_ray.serve_app.panel_spread import job_panel


def _panel(path, accuracies, finished_at, offline=False):
    path.mkdir(parents=True)
    (path / "panel.json").write_text(json.dumps({
        "offline": offline, "finished_at": finished_at, "spread": None,
        "protocols": [{"name": n, "accuracy": a} for n, a in accuracies.items()]}))


def test_overall_is_the_mean_over_datasets_and_only_when_each_has_a_panel(tmp_path):
    assert job_panel(None, ["locomo"]) is None and job_panel(tmp_path / "nowhere", ["locomo"]) is None
    _panel(tmp_path / "locomo" / "rejudge" / "old", {"suite": 0.9, "strict": 0.1}, "2026-12-01T00:00:00+00:00")
    _panel(tmp_path / "locomo" / "rejudge" / "new", {"suite": 0.6, "strict": 0.2}, "2026-12-02T00:00:00+00:00")
    (tmp_path / "locomo" / "rejudge" / "torn").mkdir()
    (tmp_path / "locomo" / "rejudge" / "torn" / "panel.json").write_text("{")  # unreadable: skipped
    one = job_panel(tmp_path, ["locomo", "longmemeval_oracle"])
    assert one["overall"] is None and one["offline"] is False
    assert one["datasets"]["locomo"]["protocols"] == {"suite": 0.6, "strict": 0.2}
    assert abs(one["datasets"]["locomo"]["spread"] - 0.4) < 1e-12
    (tmp_path / "lme").mkdir()
    (tmp_path / "lme" / "run.json").write_text(json.dumps({"dataset": {"name": "longmemeval_oracle"}}))
    _panel(tmp_path / "lme" / "rejudge" / "p", {"suite": 0.4, "strict": 0.3}, "2026-12-02T00:00:00+00:00",
           offline=True)
    both = job_panel(tmp_path, ["locomo", "longmemeval_oracle"])
    assert both["offline"] is True and set(both["datasets"]) == {"locomo", "longmemeval_oracle"}
    assert both["overall"]["protocols"] == {"suite": 0.5, "strict": 0.25} and both["overall"]["spread"] == 0.25
