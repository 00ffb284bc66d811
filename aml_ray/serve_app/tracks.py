"""What a track's jobs run: the track's suite (:mod:`aml_ray.suite`) and where each bundle's files are.

Seed ("Evaluation & results"): a full run is the track's fixed suite. :func:`job_bundles` gives the
bundles of a job: for ``full`` every bundle the release baseline pins (a bundle marked ``substitute_for``
runs only in place of its absent primary), for ``smoke`` the suite's first bundle (the "small fixed
subset", with ``smoke_limit_samples`` samples). The Coding track has no suite file: its one bundle is the
task file of ``AML_CODING_BENCH`` (:meth:`ServiceSettings.coding_bench_path`), for smoke and full alike
(smoke runs ``smoke_limit_samples`` tasks). A bundle whose data files are absent is an operator error
(:class:`MissingBundles`): the service logs it at start (:func:`suite_problems`) and refuses the job with
503 naming the bundle, the path looked at and the setting that fixes it; it never downloads a bundle.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aml_ray.serve_app.settings import ServiceSettings


class NoSuite(LookupError):
    """The track has no evaluation suite on this deployment (a 409 for the participant)."""


class MissingBundles(RuntimeError):
    """Bundle files the track's suite needs are absent: an operator error (503), never the participant's.

    Args:
        track: the track.
        missing: ``(bundle name, path looked at)`` pairs.
    """

    def __init__(self, track: str, missing: list[tuple[str, Path]]):
        self.track, self.missing = track, missing
        names = "; ".join(f"{name} (looked at {path})" for name, path in missing)
        setting = ("AML_CODING_BENCH to the CAMBench file (cambench.jsonl) or AML_DATASETS_DIR to the folder "
                   "holding cambench/cambench.jsonl" if track == "coding" else
                   "AML_DATASETS_DIR / `aml-ray serve --datasets-dir` to the folder that holds them")
        super().__init__(f"operator error: the {track} suite's bundle files are missing: {names}. Put the files "
                         f"there, or set {setting}; bundles are never downloaded by the service")


@dataclass(frozen=True)
class JobBundle:
    """One bundle a job runs: the suite's bundle, the dataset adapter name and the data path."""

    name: str
    dataset: str
    path: Path


def track_suite(settings: ServiceSettings, track: str):
    """The :class:`aml_ray.suite.Suite` a track's jobs run.

    Raises:
        NoSuite: no suite file for the track, or the file is another track's suite.
    """
    from aml_ray.suite import load_suite

    try:
        suite = load_suite(settings.suite_for(track))
    except FileNotFoundError:
        raise NoSuite(f"track {track} has no evaluation suite on this platform yet") from None
    if suite.track != track:
        raise NoSuite(f"suite {settings.suite_for(track)!r} is for track {suite.track}, not {track}")
    return suite


def _present(bundle, path: Path) -> bool:
    return path.exists() and all(loc.exists() for f, loc in bundle.locate(path) if f.role == "data")


def job_bundles(settings: ServiceSettings, track: str, mode: str) -> list[JobBundle]:
    """The bundles a ``smoke`` or ``full`` job of ``track`` runs, in suite order.

    Raises:
        NoSuite: the track has no suite.
        MissingBundles: a needed bundle's data files are absent (every missing one is named).
    """
    if track == "coding":
        return [coding_bundle(settings)]
    suite = track_suite(settings, track)
    paths = {b.name: settings.bundle_path(b) for b in suite.bundles}
    present = {b.name for b in suite.bundles if _present(b, paths[b.name])}
    wanted = []
    for b in suite.bundles:
        if b.substitute_for is None:
            stand_in = None if b.name in present else _substitute(suite, b.name, present)
            wanted.append(stand_in or b)
    if mode == "smoke":
        wanted = wanted[:1]
    missing = [(b.name, paths[b.name]) for b in wanted if b.name not in present]
    if missing:
        raise MissingBundles(track, missing)
    return [JobBundle(b.name, b.dataset, paths[b.name]) for b in wanted]


def coding_bundle(settings: ServiceSettings) -> JobBundle:
    """The Coding track's one bundle: the task file :meth:`ServiceSettings.coding_bench_path` names.

    A folder counts when it holds ``cambench.jsonl`` or ``bench.json``.

    Raises:
        MissingBundles: no task file there (names the path and the ``AML_CODING_BENCH`` setting).
    """
    path = settings.coding_bench_path()
    present = path.is_file() or (path / "cambench.jsonl").is_file() or (path / "bench.json").is_file()
    if not present:
        raise MissingBundles("coding", [("cambench", path)])
    return JobBundle("cambench", "cambench", path)


def _substitute(suite, primary: str, present: set[str]):
    return next((b for b in suite.bundles if b.substitute_for == primary and b.name in present), None)


def suite_problems(settings: ServiceSettings) -> dict[str, str]:
    """``{track: operator error}`` for each track whose full suite cannot run here (logged at start)."""
    from aml_ray.store.results import TRACKS

    problems = {}
    for track in TRACKS:
        try:
            job_bundles(settings, track, "full")
        except NoSuite:
            continue
        except (MissingBundles, ValueError) as exc:
            problems[track] = str(exc)
    return problems
