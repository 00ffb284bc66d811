"""A job's bundle entries (:mod:`aml_ray.store.bundles`): overall progress, the running bundle, the error summary."""

import doctest

from aml_ray.serve_app.routes import evaluate_pages, question_pages
from aml_ray.store import bundles
from aml_ray.store.bundles import failure_summary, overall_progress, pending, running


def test_docstring_examples():
    for module in (bundles, evaluate_pages, question_pages):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0, module.__name__


def test_the_next_bundle_starting_never_lowers_overall_progress():
    class B:
        def __init__(self, name):
            self.name, self.dataset = name, name

    entries = pending([B("a"), B("b")])
    entries[0].update(status="running", progress=0.99)
    before = overall_progress(entries)
    entries[0].update(status="ran", progress=1.0)
    entries[1].update(status="running", progress=0.0)  # b's totals are its own: a's share stays counted
    assert (before, overall_progress(entries), running(entries)[0]) == (0.495, 0.5, 2)


def test_the_error_summary_names_each_bundle_that_did_not_run():
    entries = [{"name": "locomo", "status": "ran"},
               {"name": "beam", "status": "failed", "reason": "stopped: failure budget exceeded"},
               {"name": "scriptmem", "status": "skipped", "reason": "input missing: scripts"}]
    assert failure_summary(entries) == ("bundle beam failed: stopped: failure budget exceeded; "
                                        "bundle scriptmem skipped: input missing: scripts")
    # a one-bundle job: the cause alone, as a run's own error summary reads
    assert failure_summary([entries[1]]) == "failure budget exceeded"
