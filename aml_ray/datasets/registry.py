"""Which benchmarks exist and how each is loaded, prompted and scored: one declaration per dataset.

The pipeline looks a dataset up by name here; it never branches on dataset names itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aml_ray.datasets import beam, locomo, scriptmem
from aml_ray.datasets.base import Sample


@dataclass(frozen=True)
class DatasetSpec:
    """A benchmark's declaration.

    Attributes:
        name: the dataset name used in ids and tables (``"locomo"``).
        resolve: ``(data_path | None, cache_dir, allow_hash_mismatch) -> Path`` of a verified file.
        load: ``Path -> list[Sample]``.
        answer_prompt / judge_prompt: shipped prompt names.
        f1_rule: lexical F1 definition: ``"locomo"`` (official per-category rules) or ``"token"``.
        track: the leaderboard track (``"textual"``).
        category_names: display names of the question categories.
        scorer: the registered scoring contract (:mod:`aml_ray.stages.scorers`).
    """

    name: str
    resolve: Callable[[Path | None, Path, bool], Path]
    load: Callable[[Path], list[Sample]]
    answer_prompt: str
    judge_prompt: str
    f1_rule: str = "token"
    track: str = "textual"
    category_names: dict[str, str] = field(default_factory=dict)
    scorer: str = "binary_judge"


def _bundle_datasets() -> dict[str, DatasetSpec]:
    """Datasets read from the datasets directory and verified against their suite bundle.

    Their ``resolve`` is :func:`aml_ray.suite.resolve_bundle_path` (``--data`` or
    ``$AML_DATASETS_DIR/<bundle path>``, sha256 checked against the suite's pin; no download: use
    ``aml-ray datasets fetch``). The cache directory argument is not used.
    """
    from aml_ray.datasets import atmbench, clbench, locomo_refined, longmemeval, memgallery, personamem
    from aml_ray.suite import resolve_bundle_path

    def resolver(bundle: str, suite: str = "textual") -> Callable[[Path | None, Path, bool], Path]:
        return lambda data, cache, allow: resolve_bundle_path(bundle, data, allow, suite=suite)

    def multimodal(bundle: str) -> Callable[[Path | None, Path, bool], Path]:
        return resolver(bundle, "multimodal")

    lme = dict(load=longmemeval.load_longmemeval, answer_prompt="longmemeval_answer",
               judge_prompt="longmemeval_judge", scorer="category_judge")
    return {
        "locomo_refined": DatasetSpec(name="locomo_refined", resolve=resolver("locomo_refined"),
                                      load=locomo_refined.load_locomo_refined, answer_prompt="locomo_answer",
                                      judge_prompt="locomo_refined_judge", f1_rule="locomo",
                                      category_names=locomo_refined.CATEGORY_NAMES),
        "longmemeval_s": DatasetSpec(name="longmemeval_s", resolve=resolver("longmemeval_s"), **lme),
        "longmemeval_oracle": DatasetSpec(name="longmemeval_oracle", resolve=resolver("longmemeval_oracle"), **lme),
        "personamem": DatasetSpec(name="personamem", resolve=resolver("personamem"), load=personamem.load_personamem,
                                  answer_prompt="personamem_answer", judge_prompt="option_match",
                                  scorer="single_choice"),
        "clbench": DatasetSpec(name="clbench", resolve=resolver("clbench"), load=clbench.load_clbench,
                               answer_prompt="clbench_answer", judge_prompt="clbench_judge",
                               scorer="rubric_all_or_nothing"),
        # Multimodal track (suites/multimodal.json): content parts, images by hash in the run's media folder
        "memgallery": DatasetSpec(name="memgallery", resolve=multimodal("memgallery"),
                                  load=memgallery.load_memgallery, answer_prompt="memgallery_answer",
                                  judge_prompt="memgallery_f1", track="multimodal", scorer="memgallery_f1"),
        "atmbench": DatasetSpec(name="atmbench", resolve=multimodal("atmbench"), load=atmbench.load_atmbench,
                                answer_prompt="atmbench_answer", judge_prompt="atmbench_judge",
                                track="multimodal", scorer="atmbench_qs"),
        "atmbench_hard": DatasetSpec(name="atmbench_hard", resolve=multimodal("atmbench_hard"),
                                     load=atmbench.load_atmbench_hard, answer_prompt="atmbench_answer",
                                     judge_prompt="atmbench_judge", track="multimodal", scorer="atmbench_qs"),
    }


DATASETS: dict[str, DatasetSpec] = {
    "locomo": DatasetSpec(
        name="locomo",
        resolve=lambda data, cache, allow: locomo.resolve_locomo_file(data, cache_dir=cache,
                                                                      allow_hash_mismatch=allow),
        load=locomo.load_locomo,
        answer_prompt="locomo_answer",
        judge_prompt="locomo_judge",
        f1_rule="locomo",
        category_names=locomo.CATEGORY_NAMES,
    ),
    "beam": DatasetSpec(
        name="beam",
        resolve=lambda data, cache, allow: beam.resolve_beam(data, cache_dir=cache, allow_hash_mismatch=allow),
        load=beam.load_beam,
        answer_prompt="beam_answer",
        judge_prompt="beam_rubric_judge",
        category_names=beam.CATEGORY_NAMES,
        scorer="rubric_judge",
    ),
    "scriptmem": DatasetSpec(
        name="scriptmem",
        resolve=lambda data, cache, allow: scriptmem.resolve_scriptmem(data, cache_dir=cache,
                                                                       allow_hash_mismatch=allow),
        load=scriptmem.load_scriptmem,
        answer_prompt="scriptmem_answer",
        judge_prompt="option_match",
        category_names=scriptmem.CATEGORY_NAMES,
        scorer="option_match",
    ),
    **_bundle_datasets(),
}


def get_dataset(name: str) -> DatasetSpec:
    """The declaration of ``name``.

    Raises:
        ValueError: unknown name; the message lists the known ones.
    """
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; choose one of {sorted(DATASETS)}") from None
