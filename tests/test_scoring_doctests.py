"""Run the Examples in the scoring modules' docstrings."""

import doctest
import importlib

import pytest

MODULES = ["normalize", "f1", "bleu", "lexical_judge", "judge_parse", "aggregate", "retrieval"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(f"aml_ray.scoring.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0
