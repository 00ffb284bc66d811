"""``aml-ray datasets``: fetch a suite's dataset bundles into the datasets directory and verify them.

- ``aml-ray datasets fetch NAME``: download every file of bundle NAME that has a URL into
  ``<datasets dir>/<file path>`` with :func:`aml_ray.datasets.fetch.fetch_to_cache` (atomic, sha256
  checked before the file is moved into place; a file already present with its pin is kept), then
  check the bundle. A file with no pin yet is downloaded and its sha256 printed, to be pinned in the
  suite. A file with no URL (the reassembled LongMemEval oracle, the operator's ScriptMem scripts) is
  named with where it comes from.
- ``aml-ray datasets verify``: one line per bundle: its files against their pins (``ok``, ``absent``,
  ``incomplete``, ``SHA256 MISMATCH``, ``not pinned``), and for a present bundle whose adapter is
  registered, its question counts against the suite's.

The datasets directory is ``--datasets-dir``, else ``$AML_DATASETS_DIR``, else ``~/.aml-ray/datasets``.
Exit codes: 0 when nothing is wrong (absent bundles are not an error for ``verify``), 1 when a file or
a count differs, a download fails, or a fetched bundle is still incomplete; 2 for a usage error.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

datasets_app = typer.Typer(help="Dataset bundles of a suite: fetch them into the datasets directory, verify them.",
                           no_args_is_help=True, pretty_exceptions_enable=False)
console = Console(width=None if sys.stdout.isatty() else 120, highlight=False)

SuiteOpt = Annotated[str, typer.Option(help="Suite name or suite file.")]
DirOpt = Annotated[Optional[Path], typer.Option(help="Datasets directory (default $AML_DATASETS_DIR, else "
                                                "~/.aml-ray/datasets).")]


def fetch_bundle(bundle, root: Path, *, allow_hash_mismatch: bool = False, timeout: float = 60.0) -> tuple[bool, list[str]]:
    """Download a bundle's files into ``root`` and check it.

    Args:
        bundle: the :class:`~aml_ray.suite.Bundle`.
        root: the datasets directory.
        allow_hash_mismatch: keep a downloaded file whose sha256 differs from its pin.
        timeout: per-download timeout in seconds.

    Returns:
        ``(ok, lines)``: ok when every data file is present afterwards and no pinned file differs; one
        line per file and a last line with the bundle check.
    """
    from aml_ray.datasets.fetch import DatasetError, fetch_to_cache, sha256_file
    from aml_ray.suite import check_bundle

    lines, ok = [], True
    for f in bundle.files:
        dest = root / f.path
        if dest.is_file() and f.sha256 and sha256_file(dest) == f.sha256:
            lines.append(f"present  {f.path} (sha256 matches the pin)")
            continue
        if not f.url:
            where = bundle.source.repository + (f": {bundle.source.note}" if bundle.source.note else "")
            lines.append(f"no URL   {f.path}: no direct download ({where}); put the file there by hand")
            ok = ok and (f.role != "data" or dest.is_file())
            continue
        fetch_log = logging.getLogger("aml_ray.datasets.fetch")
        level = fetch_log.level
        if f.sha256 is None:  # nothing to compare with: the hash is printed below, not warned about
            fetch_log.setLevel(logging.ERROR)
        try:
            fetch_to_cache(f.url, dest, f.sha256 or "unpinned", timeout,
                           allow_hash_mismatch=allow_hash_mismatch or f.sha256 is None)
        except DatasetError as exc:
            lines.append(f"FAILED   {f.path}: {exc}")
            ok = False
            continue
        finally:
            fetch_log.setLevel(level)
        if f.sha256 is None:
            lines.append(f"fetched  {f.path}: sha256 {sha256_file(dest)} is NOT PINNED in the suite yet")
        else:
            lines.append(f"fetched  {f.path} (sha256 verified)")
    check = check_bundle(bundle, root=root)
    for need in bundle.operator_inputs:
        lines.append(f"operator input needed: {need}")
    lines.append(f"{bundle.name}: {check.summary()}")
    return ok and check.status in ("ok", "unpinned"), lines


def verify_bundle(bundle, root: Path, *, counts: bool = True) -> tuple[bool, str]:
    """Check one bundle on disk (hashes, then counts when it is present and has an adapter).

    Args:
        bundle: the :class:`~aml_ray.suite.Bundle`.
        root: the datasets directory.
        counts: also load the bundle through its adapter and compare the question counts.

    Returns:
        ``(ok, line)``: ok is False for a mismatch, an incomplete bundle or differing counts.
    """
    from aml_ray.config import cache_dir
    from aml_ray.datasets.registry import DATASETS
    from aml_ray.suite import check_bundle, check_counts

    check = check_bundle(bundle, root=root)
    line = f"{bundle.name:<20} {check.status:<10} {check.summary()}"
    if not check.present:
        return check.status == "missing", line
    spec = DATASETS.get(bundle.dataset)
    if not counts:
        return True, line
    if spec is None:
        return True, line + f"; counts not checked: no adapter registered for {bundle.dataset!r}"
    try:
        samples = spec.load(spec.resolve(check.data_path, cache_dir(), False))
    except FileNotFoundError as exc:
        return True, line + f"; counts not checked: {exc}"
    except ValueError as exc:
        return False, line + f"; LOAD FAILED: {exc}"
    try:
        actual = check_counts(bundle, samples, check.data_path)
    except ValueError as exc:
        return False, line + f"; COUNTS DIFFER: {exc}"
    return True, line + f"; counts ok ({actual['total']} questions)"


@datasets_app.command("fetch")
def fetch_command(
    name: Annotated[str, typer.Argument(help="The bundle to download (see `aml-ray datasets verify`).")],
    suite: SuiteOpt = "textual",
    datasets_dir: DirOpt = None,
    allow_hash_mismatch: Annotated[bool, typer.Option(help="Keep files whose sha256 differs from the pin.")] = False,
    timeout: Annotated[float, typer.Option(help="Per-download timeout in seconds.")] = 60.0,
) -> None:
    """Download bundle NAME into the datasets directory and verify it."""
    from aml_ray.suite import datasets_dir as resolve_dir
    from aml_ray.suite import load_suite

    try:
        bundle = load_suite(suite).bundle(name)
    except (FileNotFoundError, ValueError) as exc:
        console.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(2) from None
    root = resolve_dir(datasets_dir)
    console.print(f"fetching {bundle.name} ({bundle.title}; license: {bundle.license}) into {root}", soft_wrap=True)
    ok, lines = fetch_bundle(bundle, root, allow_hash_mismatch=allow_hash_mismatch, timeout=timeout)
    for line in lines:
        console.print(line, soft_wrap=True)
    raise typer.Exit(0 if ok else 1)


@datasets_app.command("verify")
def verify_command(
    suite: SuiteOpt = "textual",
    datasets_dir: DirOpt = None,
    counts: Annotated[bool, typer.Option(help="Also load present bundles and check their question counts.")] = True,
) -> None:
    """Re-check every bundle of the suite under the datasets directory, one line per bundle."""
    from aml_ray.suite import datasets_dir as resolve_dir
    from aml_ray.suite import load_suite

    try:
        s = load_suite(suite)
    except (FileNotFoundError, ValueError) as exc:
        console.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(2) from None
    root = resolve_dir(datasets_dir)
    console.print(f"suite {s.name} {s.version}: {len(s.bundles)} bundles under {root}", soft_wrap=True)
    all_ok = True
    for bundle in s.bundles:
        ok, line = verify_bundle(bundle, root, counts=counts)
        all_ok = all_ok and ok
        console.print(line, soft_wrap=True)
    raise typer.Exit(0 if all_ok else 1)
