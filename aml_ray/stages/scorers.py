"""Scoring contracts by name: the dataset declaration names one, the Judge stage looks it up here.

Every scorer is ``async def scorer(rows, *, endpoint, model, prompt, f1_rule, max_parse_retries,
judge_runs) -> None`` and fills, in place, each row's ``verdict``/``score``/``score_detail`` (where it
applies), the lexical metrics and the final ``status`` (``scored`` or the error that kept it from
being scored; the row always stays in the denominator). Register a new contract with
:func:`register_scorer`; no stage or pipeline code branches on dataset names.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aml_ray.stages.judge import judge_rows

Scorer = Callable[..., Awaitable[None]]

SCORERS: dict[str, Scorer] = {"binary_judge": judge_rows}


def register_scorer(name: str) -> Callable[[Scorer], Scorer]:
    """Decorator registering a scorer under ``name``.

    Raises:
        ValueError: ``name`` is already registered.
    """

    def wrap(fn: Scorer) -> Scorer:
        if name in SCORERS and SCORERS[name] is not fn:
            raise ValueError(f"scorer {name!r} is already registered")
        SCORERS[name] = fn
        return fn

    return wrap


def get_scorer(name: str) -> Scorer:
    """The scorer registered as ``name``.

    Raises:
        ValueError: unknown name; the message lists the registered ones.
    """
    _load_builtin()
    try:
        return SCORERS[name]
    except KeyError:
        raise ValueError(f"unknown scorer {name!r}; registered: {sorted(SCORERS)}") from None


def _load_builtin() -> None:
    """Import the modules that register the shipped scorers (kept lazy to avoid import cycles)."""
    import importlib

    for module in BUILTIN_SCORER_MODULES:
        importlib.import_module(module)


#: Modules whose import registers more scorers (rubric, option match ...).
BUILTIN_SCORER_MODULES: list[str] = [
    "aml_ray.stages.category_judge",
    "aml_ray.stages.single_choice",
    "aml_ray.stages.rubric_all_or_nothing",
    "aml_ray.stages.rubric",
    "aml_ray.stages.options",
    "aml_ray.stages.memgallery_scorer",
    "aml_ray.stages.atmbench_scorer",
]
