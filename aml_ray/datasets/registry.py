"""Which benchmarks exist and how each is loaded, prompted and scored: one declaration per dataset.

The pipeline looks a dataset up by name here; it never branches on dataset names itself.

A command that runs a dataset checks its input before it creates anything:
:func:`check_data_path` refuses a ``--data`` that does not exist or is not what the adapter reads (a
file or a directory), and :meth:`DatasetSpec.check` resolves and loads the file, so a malformed one is
refused with the file, the item and the field named (:class:`~aml_ray.datasets.validate.DatasetFormatError`).
The samples it loaded are kept for the run's own :meth:`DatasetSpec.load` of that same file, which then
does not read it again.
"""

from __future__ import annotations

import os
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
        read: the adapter's loader, ``Path -> list[Sample]`` (raises
            :class:`~aml_ray.datasets.validate.DatasetFormatError` on a malformed file); call
            :meth:`load`, which reuses what :meth:`check` read.
        answer_prompt / judge_prompt: shipped prompt names.
        f1_rule: lexical F1 definition: ``"locomo"`` (official per-category rules) or ``"token"``.
        track: the leaderboard track (``"textual"``).
        category_names: display names of the question categories.
        scorer: the registered scoring contract (:mod:`aml_ray.stages.scorers`).
        data_kind: what ``--data`` names for this adapter: ``"file"``, ``"directory"`` or
            ``"file or directory"`` (:data:`DATA_KINDS`).
        operator_input: the data is the operator's own, not a published file a suite checks against its
            pins (ScriptMem's scripts), and :attr:`resolve` costs no more than reading small files: a suite
            resolves it while it plans, and skips the bundle there when an input is missing
            (:func:`aml_ray.run.suite_run.evaluate_suite`), starting nothing for it.
    """

    name: str
    resolve: Callable[[Path | None, Path, bool], Path]
    read: Callable[[Path], list[Sample]]
    answer_prompt: str
    judge_prompt: str
    f1_rule: str = "token"
    track: str = "textual"
    category_names: dict[str, str] = field(default_factory=dict)
    scorer: str = "binary_judge"
    data_kind: str = "file"
    operator_input: bool = False

    def __post_init__(self) -> None:
        if self.data_kind not in DATA_KINDS:
            raise ValueError(f"dataset {self.name!r}: data_kind {self.data_kind!r} is not one of {DATA_KINDS}")

    def load(self, path: Path) -> list[Sample]:
        """The samples of ``path``: those :meth:`check` loaded from this unchanged file (once), else read now.

        Raises:
            DatasetFormatError: a malformed file (see :attr:`read`).
            OSError: the file cannot be read.
        """
        key = _file_key(path)
        kept = _CHECKED.pop(self.name, None)
        if kept is not None and key is not None and kept[0] == key:
            return kept[1]
        return self.read(path)

    def check(self, data: Path | None, cache_dir: Path, allow_hash_mismatch: bool) -> tuple[Path, list[Sample]]:
        """Resolve and load the dataset before a run creates anything, keeping the samples for its :meth:`load`.

        Args:
            data: the operator's ``--data``, or None for the pinned file.
            cache_dir / allow_hash_mismatch: as for :attr:`resolve`.

        Returns:
            ``(file, samples)``: the resolved path and its samples.

        Raises:
            FileNotFoundError / DatasetHashMismatch / DatasetDownloadError: from :attr:`resolve`.
            DatasetFormatError: a malformed file, naming the file, the item and the field.
        """
        path = self.resolve(data, cache_dir, allow_hash_mismatch)
        samples = self.read(path)
        key = _file_key(path)
        if key is not None:
            _CHECKED[self.name] = (key, samples)
        return path, samples


#: What ``--data`` may name: the adapter reads one file, a directory, or either.
DATA_KINDS = ("file", "directory", "file or directory")
#: Samples loaded by :meth:`DatasetSpec.check`, by dataset name: ``(file key, samples)``, taken by the next
#: :meth:`DatasetSpec.load` of the same unchanged file (one entry per dataset, used once).
_CHECKED: dict[str, tuple[tuple[str, int, int], list[Sample]]] = {}


def _file_key(path: Path) -> tuple[str, int, int] | None:
    """``(resolved path, mtime ns, size)`` of a dataset file or directory, None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (str(Path(path).resolve()), st.st_mtime_ns, st.st_size)


def check_data_path(spec: DatasetSpec, data: Path | None) -> None:
    """Refuse a ``--data`` that does not exist or is not what the adapter reads (no file is opened).

    Raises:
        FileNotFoundError: ``data`` does not exist; the message names it as ``--data``.
        ValueError: ``data`` is a directory where the adapter reads one file, or a file where it reads a
            directory; the message says which.
    """
    if data is None:
        return
    data = Path(data)
    if not data.exists():
        raise FileNotFoundError(f"--data {data}: no such file or directory")
    if spec.data_kind == "file" and not data.is_file():
        raise ValueError(f"--data {data} is a directory: {spec.name} reads one file (--data PATH to the file)")
    if spec.data_kind == "directory" and not data.is_dir():
        raise ValueError(f"--data {data} is a file: {spec.name} reads a directory (--data DIR)")


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

    lme = dict(read=longmemeval.load_longmemeval, answer_prompt="longmemeval_answer",
               judge_prompt="longmemeval_judge", scorer="category_judge", data_kind="file or directory")
    return {
        "locomo_refined": DatasetSpec(name="locomo_refined", resolve=resolver("locomo_refined"),
                                      read=locomo_refined.load_locomo_refined, answer_prompt="locomo_answer",
                                      judge_prompt="locomo_refined_judge", f1_rule="locomo",
                                      category_names=locomo_refined.CATEGORY_NAMES),
        "longmemeval_s": DatasetSpec(name="longmemeval_s", resolve=resolver("longmemeval_s"), **lme),
        "longmemeval_oracle": DatasetSpec(name="longmemeval_oracle", resolve=resolver("longmemeval_oracle"), **lme),
        "personamem": DatasetSpec(name="personamem", resolve=resolver("personamem"), read=personamem.load_personamem,
                                  answer_prompt="personamem_answer", judge_prompt="option_match",
                                  scorer="single_choice"),
        "clbench": DatasetSpec(name="clbench", resolve=resolver("clbench"), read=clbench.load_clbench,
                               answer_prompt="clbench_answer", judge_prompt="clbench_judge",
                               scorer="rubric_all_or_nothing"),
        # Multimodal track (suites/multimodal.json): content parts, images by hash in the run's media folder
        "memgallery": DatasetSpec(name="memgallery", resolve=multimodal("memgallery"),
                                  read=memgallery.load_memgallery, answer_prompt="memgallery_answer",
                                  judge_prompt="memgallery_f1", track="multimodal", scorer="memgallery_f1",
                                  data_kind="file or directory"),
        "atmbench": DatasetSpec(name="atmbench", resolve=multimodal("atmbench"), read=atmbench.load_atmbench,
                                answer_prompt="atmbench_answer", judge_prompt="atmbench_judge",
                                track="multimodal", scorer="atmbench_qs", data_kind="directory"),
        "atmbench_hard": DatasetSpec(name="atmbench_hard", resolve=multimodal("atmbench_hard"),
                                     read=atmbench.load_atmbench_hard, answer_prompt="atmbench_answer",
                                     judge_prompt="atmbench_judge", track="multimodal", scorer="atmbench_qs",
                                     data_kind="directory"),
    }


DATASETS: dict[str, DatasetSpec] = {
    "locomo": DatasetSpec(
        name="locomo",
        resolve=lambda data, cache, allow: locomo.resolve_locomo_file(data, cache_dir=cache,
                                                                      allow_hash_mismatch=allow),
        read=locomo.load_locomo,
        answer_prompt="locomo_answer",
        judge_prompt="locomo_judge",
        f1_rule="locomo",
        category_names=locomo.CATEGORY_NAMES,
    ),
    "beam": DatasetSpec(
        name="beam",
        resolve=lambda data, cache, allow: beam.resolve_beam(data, cache_dir=cache, allow_hash_mismatch=allow),
        read=beam.load_beam,
        answer_prompt="beam_answer",
        judge_prompt="beam_rubric_judge",
        category_names=beam.CATEGORY_NAMES,
        scorer="rubric_judge",
        data_kind="directory",
    ),
    "scriptmem": DatasetSpec(
        name="scriptmem",
        resolve=lambda data, cache, allow: scriptmem.resolve_scriptmem(data, cache_dir=cache,
                                                                       allow_hash_mismatch=allow),
        read=scriptmem.load_scriptmem,
        answer_prompt="scriptmem_answer",
        judge_prompt="option_match",
        category_names=scriptmem.CATEGORY_NAMES,
        scorer="option_match",
        data_kind="file or directory",
        operator_input=True,
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
