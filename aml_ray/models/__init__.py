"""What the locked Answer and Judge models need around their client (:mod:`aml_ray.actors.model`).

- :mod:`~aml_ray.models.context`: the answer context cut to its token budget.
- :mod:`~aml_ray.models.tokens`: token counts (tiktoken's encodings).
- :mod:`~aml_ray.models.answer_cache`: the reply cache keyed by model, prompt and messages.
- :mod:`~aml_ray.models.pricing`: token prices, for the run's cost line.
- :mod:`~aml_ray.models.offline`: the offline extractive answerer (no model; not an official score).
"""
