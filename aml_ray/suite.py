"""Suites: the versioned list of dataset bundles a track runs, and the release baseline a run is checked against.

A suite file (``aml_ray/suites/<name>.json``) fixes everything the platform locks (seed: "the platform
locks the answer model, prompts, evaluators, dataset suite, Top K, and aggregation rules"): each dataset
bundle (source, license, files with sha256, expected question counts per category, prompts with sha256,
scoring contract), Top K, the answer and judge models, the context budget, and the rule that turns the
dataset scores into Overall. :func:`release_baseline` is that lock as one dict; :func:`baseline_deviations`
lists where a run differs from it.

Where dataset files live is one setting: :func:`datasets_dir` (``--datasets-dir``, else the
``AML_DATASETS_DIR`` environment variable, else ``~/.aml-ray/datasets``). Bundle paths inside it follow
the layout of ``shared/datasets`` (``locomo/locomo10.json``, ``longmemeval/...``, ``beam/100K/...``), so
``AML_DATASETS_DIR=../shared/datasets`` works as is.

Secondary metrics (reported beside a dataset's score, never in Overall): ``task_averages`` (the
unweighted mean of some categories' accuracies) and ``subsets`` (the accuracy of the questions whose id
holds a marker), both computed by :func:`secondary_metrics`. Judge protocol: a bundle names the
protocol of its judge prompt (``judge_protocol``, default ``aml-ray``; :mod:`aml_ray.scoring.judge_protocols`),
so a suite can run a benchmark's own judge wording and reading (e.g. ``longmemeval-upstream``) to
reproduce published numbers; the run records it (run.json ``bundle.judge_protocol``) and a judge model
other than the protocol's is a deviation.

Refusals (DESIGN.md "Dataset bundles"): a bundle file whose sha256 differs from its pin raises
:class:`~aml_ray.datasets.fetch.DatasetHashMismatch`; a pinned file whose questions per category differ
from the suite's (an adapter that drifted) raises :class:`DatasetCountMismatch`. Both messages name the
bundle, the file and the expected and actual values; ``--allow-hash-mismatch`` runs anyway and is recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from aml_ray.datasets.fetch import DatasetError, DatasetHashMismatch, sha256_file
from aml_ray.media import MediaLimits

#: Where the shipped suite files are.
SUITES_DIR = Path(__file__).parent / "suites"
#: The suite ``aml-ray`` uses when none is named.
DEFAULT_SUITE = "textual"
#: Environment variable naming the datasets directory.
DATASETS_DIR_ENV = "AML_DATASETS_DIR"

_SHA256_CHARS = frozenset("0123456789abcdef")


class DatasetCountMismatch(DatasetError, ValueError):
    """A bundle's questions per category differ from the suite's expected counts.

    Args:
        bundle: the bundle name.
        path: the file that was loaded.
        expected: the suite's counts (``{"total": n, "by_category": {...}}``).
        actual: the counts found (same shape).
    """

    def __init__(self, bundle: str, path: str | os.PathLike[str], expected: dict[str, Any], actual: dict[str, Any]):
        self.bundle, self.path, self.expected, self.actual = bundle, str(path), expected, actual
        diffs = []
        if expected.get("total") is not None and expected["total"] != actual["total"]:
            diffs.append(f"total {actual['total']} != {expected['total']}")
        exp_cat = expected.get("by_category") or {}
        for cat in sorted(set(exp_cat) | set(actual["by_category"])) if exp_cat else []:
            e, a = exp_cat.get(cat, 0), actual["by_category"].get(cat, 0)
            if e != a:
                diffs.append(f"category {cat!r}: {a} != {e}")
        super().__init__(
            f"bundle {bundle!r}: question counts of {self.path} differ from the suite ({'; '.join(diffs)}; "
            "found != expected). The file or the adapter is not the pinned release; use the pinned file, or "
            "pass --allow-hash-mismatch to run anyway (not comparable with the release baseline).")

    def __reduce__(self):
        return (DatasetCountMismatch, (self.bundle, self.path, self.expected, self.actual))


def _relative_posix(value: str) -> str:
    p = PurePosixPath(value)
    if not value or p.is_absolute() or ".." in p.parts or "\\" in value:
        raise ValueError(f"path {value!r} must be relative to the datasets directory, without '..'")
    return str(p)


def _sha256_or_none(value: str | None) -> str | None:
    if value is None:
        return None
    if len(value) != 64 or not set(value) <= _SHA256_CHARS:
        raise ValueError(f"sha256 {value!r} must be 64 lowercase hex characters (or null when not pinned yet)")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BundleFile(_Strict):
    """One file of a bundle.

    Attributes:
        path: relative to the datasets directory (``longmemeval/longmemeval_oracle_reassembled.json``).
        sha256: the pinned hash, or None while the file is not pinned (never obtained).
        bytes: the pinned size, informational.
        url: where ``aml-ray datasets fetch`` downloads it from, or None when there is no direct download.
        role: ``data`` (read by the adapter) or ``provenance`` (kept beside it to document its origin).
    """

    path: str
    sha256: str | None
    bytes: int | None = None
    url: str | None = None
    role: Literal["data", "provenance"] = "data"

    @field_validator("path")
    @classmethod
    def _check_path(cls, v: str) -> str:
        return _relative_posix(v)

    @field_validator("sha256")
    @classmethod
    def _check_sha(cls, v: str | None) -> str | None:
        return _sha256_or_none(v)


class PromptPin(_Strict):
    """A prompt by shipped name and the sha256 of its file (None: not pinned yet)."""

    name: str
    sha256: str | None

    @field_validator("sha256")
    @classmethod
    def _check_sha(cls, v: str | None) -> str | None:
        return _sha256_or_none(v)


class ExpectedQuestions(_Strict):
    """Question counts a bundle must load to (all questions, excluded ones too).

    Attributes:
        total: number of questions, or None when unknown.
        by_category: questions per category (the adapter's category strings), or None when unknown.
        source: where the counts come from.
    """

    total: int | None
    by_category: dict[str, int] | None = None
    source: str

    @model_validator(mode="after")
    def _sum(self) -> ExpectedQuestions:
        if self.total is not None and self.by_category is not None and sum(self.by_category.values()) != self.total:
            raise ValueError(f"by_category sums to {sum(self.by_category.values())}, not total={self.total}")
        return self


class TaskAverage(_Strict):
    """A secondary metric: the unweighted mean of some categories' accuracies (e.g. LongMemEval's).

    Attributes:
        name: the metric's name in tables and suite.json.
        categories: the categories averaged (those absent from a run are left out; none present: None).
        source: where the rule comes from.
    """

    name: str
    categories: list[str] = Field(min_length=1)
    source: str


class QuestionSubset(_Strict):
    """A secondary metric: the accuracy (mean credit, errors 0) over the questions whose id holds a marker.

    Example: LongMemEval's abstention accuracy, the questions whose id holds ``"_abs"`` (upstream
    ``src/evaluation/print_qa_metrics.py``: ``if '_abs' in entry['question_id']``).

    Attributes:
        name: the metric's name in tables and suite.json.
        question_id_contains: the marker (a plain substring, case-sensitive).
        source: where the rule comes from.
    """

    name: str
    question_id_contains: str = Field(min_length=1)
    source: str


class Source(_Strict):
    """Where a bundle comes from."""

    repository: str
    commit: str | None = None
    path: str | None = None
    homepage: str | None = None
    note: str | None = None


class Bundle(_Strict):
    """One dataset bundle of a suite.

    Attributes:
        name: the bundle's name (unique in the suite); the dataset name in tables.
        dataset: the registered adapter (:data:`aml_ray.datasets.registry.DATASETS`) that loads it.
        title: a human title.
        source / license: provenance.
        path: what the adapter receives (a file or a directory), relative to the datasets directory.
        files: every file to verify, with its pin.
        expected: the question counts the adapter must produce from the pinned files.
        prompts: the answer and judge prompts with their sha256 (None: the adapter's prompt is not
            pinned yet).
        scorer: the scoring contract (:mod:`aml_ray.stages.scorers`), as the registry declares it.
        task_averages: secondary metrics reported next to the dataset's accuracy.
        subsets: secondary metrics over the questions whose id holds a marker (e.g. abstention).
        judge_protocol: the judge protocol of ``prompts["judge"]`` (:data:`aml_ray.scoring.judge_protocols.PROTOCOLS`;
            default ``aml-ray``, the platform's own). A protocol with a prompt of its own (e.g.
            ``longmemeval-upstream`` -> ``longmemeval_judge_upstream``) requires that judge prompt, and
            one written for a scorer requires that scorer.
        substitute_for: this bundle runs only when the named bundle is absent, and stands in for it in
            Overall (flagged in the tables).
        operator_inputs: files the operator must supply (unpublished parts), described.
        notes: anything a reader of a result must know.
    """

    name: str = Field(pattern=r"^[A-Za-z0-9._\-]+$")
    dataset: str
    title: str
    source: Source
    license: str
    path: str
    files: list[BundleFile] = Field(min_length=1)
    expected: ExpectedQuestions
    prompts: dict[Literal["answer", "judge"], PromptPin]
    scorer: str
    task_averages: list[TaskAverage] = Field(default_factory=list)
    subsets: list[QuestionSubset] = Field(default_factory=list)
    judge_protocol: str = "aml-ray"
    substitute_for: str | None = None
    operator_inputs: list[str] = Field(default_factory=list)
    notes: str = ""

    @field_validator("path")
    @classmethod
    def _check_path(cls, v: str) -> str:
        return _relative_posix(v)

    @model_validator(mode="after")
    def _protocol(self) -> Bundle:
        from aml_ray.scoring.judge_protocols import PROTOCOLS

        protocol = PROTOCOLS.get(self.judge_protocol)
        if protocol is None:
            raise ValueError(f"judge_protocol {self.judge_protocol!r} is unknown; known: {sorted(PROTOCOLS)}")
        judge = self.prompts.get("judge")
        if protocol.prompt is not None and (judge is None or judge.name != protocol.prompt):
            raise ValueError(f"judge_protocol {protocol.name!r} needs the judge prompt {protocol.prompt!r}, "
                             f"the bundle has {judge.name if judge else None!r}")
        if protocol.scorer is not None and protocol.scorer != self.scorer:
            raise ValueError(f"judge_protocol {protocol.name!r} is for the {protocol.scorer!r} scorer, "
                             f"the bundle's is {self.scorer!r}")
        return self

    @property
    def judge_protocol_label(self) -> str:
        """One line naming the bundle's judge protocol, for run.json and table captions."""
        from aml_ray.scoring.judge_protocols import get_protocol

        return f"judge protocol {self.judge_protocol}: {get_protocol(self.judge_protocol).label}"

    @property
    def pinned(self) -> bool:
        """Every file has a sha256 pin."""
        return all(f.sha256 for f in self.files)

    def locate(self, data_path: str | os.PathLike[str]) -> list[tuple[BundleFile, Path]]:
        """Where each bundle file is when the bundle's ``path`` is at ``data_path``.

        A file under ``path`` keeps its place below ``data_path``; a file beside ``path`` (a sibling, such
        as PersonaMem's contexts file next to its questions) is looked up beside ``data_path``.

        Args:
            data_path: where the bundle's ``path`` is (default layout: ``<datasets dir>/<path>``).

        Returns:
            ``(file, location)`` for every file of the bundle, in suite order.
        """
        data_path = Path(data_path)
        base = PurePosixPath(self.path)
        out = []
        for f in self.files:
            p = PurePosixPath(f.path)
            if p == base:
                out.append((f, data_path))
            elif base in p.parents:
                out.append((f, data_path / p.relative_to(base)))
            else:
                out.append((f, data_path.parent / p.relative_to(base.parent)))
        return out


class Models(_Strict):
    """The locked models, by the name the endpoint serves."""

    answer: str
    judge: str


class Aggregation(_Strict):
    """How dataset scores and Overall are computed (the rule text is the contract; the fields drive code).

    Attributes:
        dataset_score: the per-dataset score; ``accuracy`` = the ``overall`` row of
            :func:`aml_ray.scoring.aggregate` (mean credit over non-excluded questions, errors count 0).
        overall: ``unweighted_mean`` of the dataset scores of the bundles that ran.
        rule: the rule in words, shown with every Overall table.
    """

    dataset_score: Literal["accuracy"]
    overall: Literal["unweighted_mean"]
    rule: str


class Suite(_Strict):
    """A versioned suite file (see the module docstring).

    ``media`` (Multimodal suites): the :class:`aml_ray.media.MediaLimits` every Add, Search and returned
    memory is checked against, and the answer context's image token rule.

    ``answer_cap_tokens``: the answer-length cap, in the answer model's tokens (an integer of at least 1;
    absent or null: no cap). An answer over it is recorded whole in the evidence and cut to the cap before it
    is judged (:func:`aml_ray.stages.answer.cap_answers`); results report the share of capped answers.
    """

    schema_version: Literal[1]
    name: str
    version: str
    track: str
    description: str
    top_k: int = Field(ge=1)
    models: Models
    context_budget_tokens: int = Field(ge=1)
    answer_cap_tokens: int | None = Field(default=None, ge=1)
    judge_runs: int = Field(ge=1)
    aggregation: Aggregation
    bundles: list[Bundle] = Field(min_length=1)
    media: MediaLimits | None = None

    @model_validator(mode="after")
    def _unique(self) -> Suite:
        names = [b.name for b in self.bundles]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"bundle names repeat: {dup}")
        for b in self.bundles:
            if b.substitute_for is not None and b.substitute_for not in names:
                raise ValueError(f"bundle {b.name!r}: substitute_for={b.substitute_for!r} is not a bundle of the suite")
        return self

    def bundle(self, name: str) -> Bundle:
        """The bundle called ``name``.

        Raises:
            ValueError: no such bundle; the message lists the suite's bundles.
        """
        for b in self.bundles:
            if b.name == name:
                return b
        raise ValueError(f"suite {self.name!r} has no bundle {name!r}; bundles: {[b.name for b in self.bundles]}")

    def bundle_for_dataset(self, dataset: str) -> Bundle | None:
        """The bundle whose adapter is ``dataset``, or None."""
        return next((b for b in self.bundles if b.dataset == dataset), None)


@lru_cache(maxsize=8)
def _load_suite_file(path: str, mtime_ns: int) -> Suite:
    with open(path, encoding="utf-8") as fh:
        return Suite.model_validate(json.load(fh))


def load_suite(name_or_path: str | os.PathLike[str] = DEFAULT_SUITE) -> Suite:
    """Load and validate a suite by shipped name (``"textual"``) or by path.

    Args:
        name_or_path: a shipped suite name, or a path ending in ``.json``.

    Returns:
        The validated :class:`Suite` (cached until the file changes).

    Raises:
        FileNotFoundError: no such suite; the message lists the shipped ones.
        pydantic.ValidationError: the file does not follow the suite schema.
    """
    ref = str(name_or_path)
    path = Path(ref) if ref.endswith(".json") else SUITES_DIR / f"{ref}.json"
    if not path.is_file():
        shipped = sorted(p.stem for p in SUITES_DIR.glob("*.json"))
        raise FileNotFoundError(f"suite {ref!r} not found; shipped suites: {shipped}")
    return _load_suite_file(str(path.resolve()), path.stat().st_mtime_ns)


def datasets_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """The datasets directory (the one setting for where dataset files live).

    Args:
        override: ``--datasets-dir``; wins when given.

    Returns:
        ``override``, else ``$AML_DATASETS_DIR``, else ``<AML_DATA_DIR or ~/.aml-ray>/datasets``.
    """
    if override is not None:
        return Path(override).expanduser()
    env = os.environ.get(DATASETS_DIR_ENV)
    if env:
        return Path(env).expanduser()
    from aml_ray.config import data_dir

    return data_dir() / "datasets"


def path_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 of a file's bytes, or of a directory as the index of its files.

    A directory's hash is the sha256 of the UTF-8 text holding one line ``"<sha256>  <relative path>\\n"``
    per regular file below it (``sha256sum`` format, POSIX paths, sorted by path), so it names the exact
    set of bytes an adapter read from a directory (e.g. LongMemEval's per-instance files).

    Raises:
        OSError: the path cannot be read.
    """
    p = Path(path)
    if not p.is_dir():
        return sha256_file(p)
    lines = [f"{sha256_file(f)}  {f.relative_to(p).as_posix()}\n"
             for f in sorted((f for f in p.rglob("*") if f.is_file()), key=lambda f: f.relative_to(p).as_posix())]
    return hashlib.sha256("".join(lines).encode()).hexdigest()


@dataclass
class FileCheck:
    """One bundle file on disk: ``status`` is ``ok``, ``missing``, ``mismatch`` or ``unpinned``."""

    file: BundleFile
    path: Path
    status: str
    sha256: str | None = None


@dataclass
class BundleCheck:
    """A bundle on disk.

    Attributes:
        bundle: the bundle.
        data_path: where its ``path`` was looked for.
        status: ``ok`` (every data file present with its pin), ``unpinned`` (present, some file has no
            pin yet), ``missing`` (no data file present), ``incomplete`` (some data files missing) or
            ``mismatch`` (a present file has another sha256).
        files: per-file results.
    """

    bundle: Bundle
    data_path: Path
    status: str
    files: list[FileCheck] = field(default_factory=list)

    @property
    def present(self) -> bool:
        return self.status in ("ok", "unpinned")

    def summary(self) -> str:
        """One line for ``aml-ray datasets verify`` and skip messages."""
        by = Counter(fc.status for fc in self.files)
        n = len(self.files)
        if self.status == "ok":
            return f"ok: {n} file(s) match their sha256 pins ({self.data_path})"
        if self.status == "unpinned":
            todo = [f"{fc.file.path} sha256 {fc.sha256}" for fc in self.files if fc.status == "unpinned"]
            return f"present but not pinned in the suite yet: {'; '.join(todo)}"
        if self.status == "missing":
            return f"absent: {self.data_path} not found"
        if self.status == "incomplete":
            miss = [fc.file.path for fc in self.files if fc.status == "missing" and fc.file.role == "data"]
            return f"incomplete: {by['missing']} of {n} file(s) missing ({', '.join(miss[:3])}{' ...' if len(miss) > 3 else ''})"
        bad = [fc for fc in self.files if fc.status == "mismatch"]
        return (f"SHA256 MISMATCH in {len(bad)} file(s): " + "; ".join(
            f"{fc.path}: expected {fc.file.sha256}, got {fc.sha256}" for fc in bad[:3]))


def check_bundle(bundle: Bundle, data_path: str | os.PathLike[str] | None = None, *,
                 root: str | os.PathLike[str] | None = None) -> BundleCheck:
    """Check a bundle's files on disk against their pins.

    Args:
        bundle: the bundle.
        data_path: where the bundle's ``path`` is (default ``<root>/<bundle.path>``).
        root: the datasets directory (default :func:`datasets_dir`).

    A data file found as a directory (the same data as one file per item, the layout of LongMemEval's
    ``s_sample/``) is hashed as the index of its files (:func:`path_sha256`).

    Returns:
        The :class:`BundleCheck`; nothing raises for a missing or mismatched file.
    """
    data_path = Path(data_path) if data_path is not None else datasets_dir(root) / bundle.path
    files = []
    for f, p in bundle.locate(data_path):
        if not (p.is_file() or p.is_dir()):
            files.append(FileCheck(f, p, "missing"))
            continue
        actual = path_sha256(p)
        status = "unpinned" if f.sha256 is None else "ok" if actual == f.sha256 else "mismatch"
        files.append(FileCheck(f, p, status, actual))
    data = [fc for fc in files if fc.file.role == "data"]
    if any(fc.status == "mismatch" for fc in files):
        status = "mismatch"
    elif all(fc.status == "missing" for fc in data):
        status = "missing"
    elif any(fc.status == "missing" for fc in data):
        status = "incomplete"
    elif any(fc.status == "unpinned" for fc in files):
        status = "unpinned"
    else:
        status = "ok"
    return BundleCheck(bundle, data_path, status, files)


def question_counts(samples) -> dict[str, Any]:
    """Question counts of loaded samples.

    Args:
        samples: an adapter's samples.

    Returns:
        ``{"total": n, "by_category": {category: n}}`` over every question, excluded ones too.
    """
    by = Counter(q.category for s in samples for q in s.questions)
    return {"total": sum(by.values()), "by_category": dict(sorted(by.items()))}


def check_counts(bundle: Bundle, samples, path: str | os.PathLike[str] = "") -> dict[str, Any]:
    """Compare the loaded questions with the bundle's expected counts.

    Args:
        bundle: the bundle.
        samples: what the adapter loaded from the bundle (before any ``limit_samples``).
        path: the loaded file, for the message.

    Returns:
        The actual counts (see :func:`question_counts`).

    Raises:
        DatasetCountMismatch: the total or a category differs (unknown expectations are not checked).
    """
    actual = question_counts(samples)
    exp = bundle.expected
    if (exp.total is not None and exp.total != actual["total"]) or (
            exp.by_category is not None and exp.by_category != actual["by_category"]):
        raise DatasetCountMismatch(bundle.name, path, exp.model_dump(exclude={"source"}), actual)
    return actual


def resolve_bundle_path(bundle_name: str, data: str | os.PathLike[str] | None, allow_hash_mismatch: bool = False,
                        *, suite: str = DEFAULT_SUITE) -> Path:
    """Find and verify a bundle's data: ``data`` if given, else ``<datasets dir>/<bundle.path>``.

    This is the ``resolve`` of the adapters that read bundles from the datasets directory.

    Args:
        bundle_name: the bundle.
        data: a path given by the operator (``--data``) standing for the bundle's ``path``, or None.
        allow_hash_mismatch: accept files whose sha256 differs from the pin (recorded by the caller).
        suite: the suite that declares the bundle.

    Returns:
        The path to give the adapter.

    Raises:
        FileNotFoundError: the path does not exist or a data file of the bundle is missing; the message
            says how to get it (``aml-ray datasets fetch``, ``AML_DATASETS_DIR``, ``--data``).
        DatasetHashMismatch: a file's sha256 differs from its pin, unless allowed.
    """
    bundle = load_suite(suite).bundle(bundle_name)
    path = Path(data) if data is not None else datasets_dir() / bundle.path
    if not path.exists():
        where = "--data" if data is not None else f"the datasets directory ({DATASETS_DIR_ENV} or --datasets-dir)"
        raise FileNotFoundError(f"bundle {bundle.name!r}: {path} does not exist ({where}); run `aml-ray datasets "
                                f"fetch {bundle.name}`, set {DATASETS_DIR_ENV}, or pass --data PATH")
    check = check_bundle(bundle, path)
    missing = [fc for fc in check.files if fc.status == "missing" and fc.file.role == "data"]
    if missing:
        raise FileNotFoundError(f"bundle {bundle.name!r}: {len(missing)} data file(s) missing beside {path}: "
                                + ", ".join(str(fc.path) for fc in missing[:3]))
    bad = [fc for fc in check.files if fc.status == "mismatch"]
    if bad and not allow_hash_mismatch:
        raise DatasetHashMismatch(bad[0].path, bad[0].file.sha256, bad[0].sha256)
    return path


def verify_loaded_bundle(dataset: str, data_path: str | os.PathLike[str], samples, *,
                         allow_hash_mismatch: bool = False, suite: str = DEFAULT_SUITE) -> dict[str, Any]:
    """The count check of an evaluation: refuse a bundle whose questions differ from the suite.

    Rule: counts are checked when hash mismatches are not allowed and either every file of the bundle
    matches its pin (then a difference means the adapter drifted), or the bundle has no pin yet (then
    the counts are the only check there is). A pinned bundle read from other files is left to its
    ``resolve``, which refuses it.

    Args:
        dataset: the adapter name.
        data_path: the path the adapter loaded.
        samples: the loaded samples (before ``limit_samples``).
        allow_hash_mismatch: the operator's override.
        suite: the suite to look the dataset up in.

    Returns:
        What to record in run.json: ``{"suite", "suite_version", "bundle", "pinned", "files_match",
        "counts_checked", "counts", "judge_protocol": {"name", "label"}}``; ``{"bundle": None}`` for a
        dataset the suite does not list.

    Raises:
        DatasetCountMismatch: when checked and the counts differ.
    """
    try:
        s = load_suite(suite)
    except FileNotFoundError:
        return {"bundle": None}
    bundle = s.bundle_for_dataset(dataset)
    if bundle is None:
        return {"bundle": None}
    check = check_bundle(bundle, data_path)
    files_match = check.status == "ok"
    checked = not allow_hash_mismatch and (files_match or not bundle.pinned)
    counts = check_counts(bundle, samples, data_path) if checked else question_counts(samples)
    return {"suite": s.name, "suite_version": s.version, "bundle": bundle.name, "pinned": bundle.pinned,
            "files_match": files_match, "counts_checked": checked, "counts": counts,
            "judge_protocol": {"name": bundle.judge_protocol, "label": bundle.judge_protocol_label}}


def secondary_metrics(bundle: Bundle, questions) -> dict[str, float | None]:
    """A bundle's secondary metrics from its run's question rows: task averages, then subsets.

    Rules: each task average is the unweighted mean of the accuracies (:func:`aml_ray.scoring.aggregate`:
    mean credit over non-excluded questions, errors 0) of its categories present in the run; each subset
    is the accuracy of the non-excluded questions whose id holds its marker. None when nothing applies.

    Examples:
        >>> import polars as pl
        >>> b = load_suite().bundle("longmemeval_oracle")
        >>> rows = pl.DataFrame({"dataset": ["lme"] * 3, "question_id": ["a", "b_abs", "c"],
        ...     "category": ["multi-session", "multi-session", "knowledge-update"], "excluded": [False] * 3,
        ...     "status": ["scored"] * 3, "verdict": ["CORRECT", "WRONG", "CORRECT"], "f1": [None] * 3,
        ...     "bleu1": [None] * 3})
        >>> secondary_metrics(b, rows)
        {'task-averaged accuracy': 0.75, 'abstention accuracy': 0.0}

    Args:
        bundle: the bundle whose ``task_averages`` and ``subsets`` to compute.
        questions: the run's question rows (polars), with ``question_id`` and the columns
            :func:`aml_ray.scoring.aggregate` reads (``dataset`` is added when absent).

    Returns:
        ``{metric name: value in [0, 1] or None}``, in suite order.

    Raises:
        ValueError: a column :func:`aml_ray.scoring.aggregate` needs is missing.
    """
    import polars as pl

    from aml_ray.scoring.aggregate import aggregate

    if "dataset" not in questions.columns:
        questions = questions.with_columns(pl.lit(bundle.dataset).alias("dataset"))
    accuracy = {r["category"]: r["accuracy"] for r in aggregate(questions).to_dicts()}
    out: dict[str, float | None] = {}
    for avg in bundle.task_averages:
        values = [accuracy[c] for c in avg.categories if accuracy.get(c) is not None]
        out[avg.name] = sum(values) / len(values) if values else None
    for sub in bundle.subsets:
        rows = questions.filter(pl.col("question_id").str.contains(sub.question_id_contains, literal=True))
        overall = aggregate(rows).filter(pl.col("category") == "overall")["accuracy"].to_list()
        out[sub.name] = overall[0] if overall else None
    return out


def release_baseline(suite: Suite | str = DEFAULT_SUITE) -> dict[str, Any]:
    """The release baseline: what a publishable run of the suite must match.

    Returns:
        ``{"suite", "version", "top_k", "models", "context_budget_tokens", "answer_cap_tokens", "judge_runs",
        "aggregation",
        "bundles": {name: {"dataset", "files": {path: sha256}, "questions", "prompts": {role: sha256},
        "scorer", "judge_protocol"}}}``.
    """
    s = load_suite(suite) if isinstance(suite, str) else suite
    return {
        "suite": s.name, "version": s.version, "top_k": s.top_k, "models": s.models.model_dump(),
        "context_budget_tokens": s.context_budget_tokens, "answer_cap_tokens": s.answer_cap_tokens,
        "judge_runs": s.judge_runs, "aggregation": s.aggregation.model_dump(),
        "bundles": {b.name: {"dataset": b.dataset, "files": {f.path: f.sha256 for f in b.files},
                             "questions": b.expected.model_dump(exclude={"source"}),
                             "prompts": {role: {"name": p.name, "sha256": p.sha256} for role, p in b.prompts.items()},
                             "scorer": b.scorer, "judge_protocol": b.judge_protocol} for b in s.bundles},
    }


def baseline_deviations(suite: Suite, bundle: Bundle, run_info: dict[str, Any]) -> list[str]:
    """Where one dataset's run differs from the release baseline (empty: it matches).

    Args:
        suite: the suite.
        bundle: the bundle the run evaluated.
        run_info: the run's run.json.

    Returns:
        One short sentence per difference: models, offline models, Top K, context budget, answer cap, judge runs,
        prompts, dataset hash or counts, a sample limit; and, for a bundle whose judge protocol names
        upstream's judge model, a run judged by another model (it does not reproduce upstream's numbers).
    """
    from aml_ray.scoring.judge_protocols import get_protocol

    out = []
    models = run_info.get("models", {})
    for role in ("answer", "judge"):
        got = models.get(role, {}).get("model")
        want = getattr(suite.models, role)
        if got != want:
            out.append(f"{role} model {got!r} is not the suite's {want!r}")
    protocol = get_protocol(bundle.judge_protocol)
    judged_by = models.get("judge", {}).get("model")
    if protocol.judge_model is not None and judged_by != protocol.judge_model:
        out.append(f"judge protocol {protocol.name!r} is upstream's with judge model {protocol.judge_model!r}; "
                   f"judged by {judged_by!r}, so not upstream's published setting")
    if run_info.get("top_k") != suite.top_k:
        out.append(f"top_k {run_info.get('top_k')} != {suite.top_k}")
    if run_info.get("context_budget_tokens") != suite.context_budget_tokens:
        out.append(f"context budget {run_info.get('context_budget_tokens')} != {suite.context_budget_tokens}")
    if run_info.get("answer_cap_tokens") != suite.answer_cap_tokens:
        out.append(f"answer cap {run_info.get('answer_cap_tokens')} tokens != {suite.answer_cap_tokens}")
    if run_info.get("judge_runs") != suite.judge_runs:
        out.append(f"judge runs {run_info.get('judge_runs')} != {suite.judge_runs}")
    prompts = run_info.get("prompts", {})
    for role, pin in bundle.prompts.items():
        got = prompts.get(role, {}).get("sha256")
        if pin.sha256 is None:
            out.append(f"{role} prompt {pin.name!r} is not pinned in the suite")
        elif got != pin.sha256:
            out.append(f"{role} prompt sha256 {str(got)[:12]} != pin {pin.sha256[:12]}")
    ds = run_info.get("dataset", {})
    if ds.get("hash_mismatch_allowed"):
        out.append("hash mismatches were allowed")
    b = run_info.get("bundle") or {}
    if not b.get("files_match"):
        out.append("dataset files do not match the pins" if bundle.pinned else "dataset files are not pinned")
    if run_info.get("limit_samples") is not None:
        out.append(f"limited to {run_info['limit_samples']} sample(s)")
    return out
