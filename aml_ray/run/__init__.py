"""One evaluation run, in the order the data goes through it.

- :mod:`~aml_ray.run.evaluation`: ``evaluate()``, the entry point of one dataset: pre-flight, pipeline,
  scoring, run.json and results.json.
- :mod:`~aml_ray.run.suite_run`: ``evaluate_suite()``, every present bundle of a suite, each bundle's
  outcome its own, then Overall.
- :mod:`~aml_ray.run.preflight`: one health check and one Add/Search round trip before any Add.
- :mod:`~aml_ray.run.inputs`: the samples as one Arrow file each, the pipeline's input.
- :mod:`~aml_ray.run.pipeline`: the Ray Data pipeline Ingest -> Answer -> Judge and its options.
- :mod:`~aml_ray.run.ray_runtime`: starting Ray, quiet consoles, Arrow IPC between processes.
- :mod:`~aml_ray.run.progress`: the progress tracker actor and failure counters.
- :mod:`~aml_ray.run.evidence`: the run directory, its schemas and Parquet/JSONL writers, resume.
- :mod:`~aml_ray.run.outcome` and :mod:`~aml_ray.run.isolation`: the failure budget and the run's
  status; the cross-user leak check.
- :mod:`~aml_ray.run.rejudge`: re-scoring a finished run with another judge.

docs/architecture.md follows one run through these modules.
"""
