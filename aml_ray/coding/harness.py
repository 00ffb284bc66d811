"""Which repository files belong to the test harness, so that a candidate diff cannot change how it is judged.

A candidate diff is untrusted input (the participant's memories steer the agent). SWE-bench's harness
(``swebench/harness``: it checks out the files of ``test_patch`` at ``base_commit`` before applying
the test patch) keeps the candidate's edits of the test files from counting; this module widens that
to every file through which a diff could change the verdict without fixing the bug. Before the tests
run, each of these the diff touched is put back to the snapshot's bytes (or removed when the diff
created it):

- pytest configuration and plugins: any ``conftest.py`` (hooks such as ``pytest_runtest_makereport``
  rewrite outcomes), ``pytest.ini``, ``.pytest.ini``, ``pytest.toml``, ``.pytest.toml``, ``tox.ini``,
  ``setup.cfg``, ``pyproject.toml`` (``addopts = -p plugin``, ``python_files``, ``--deselect``), at any
  depth, restored whole;
- interpreter start-up hooks: ``sitecustomize.py``, ``usercustomize.py`` and ``*.pth`` files;
- test files: ``test_*.py``, ``*_test.py``, ``tests.py`` and every file under a directory named
  ``tests``; the files of the scored node ids and of the hidden ``test_patch``.

Left out on purpose: directories named ``test`` or ``testing`` (``django/test/`` and ``numpy/testing``
are library code a real fix may change). What this cannot stop: the code under test runs inside the
pytest process, so a diff to library code could still patch pytest's internals at import time; the
diff is kept in the evidence for review.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path, PurePosixPath

CONFIG_NAMES = frozenset({"conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini",
                          "setup.cfg", "pyproject.toml", "sitecustomize.py", "usercustomize.py", "tests.py"})
TEST_DIRS = frozenset({"tests"})


def is_harness_path(rel: str) -> bool:
    """Whether a repository-relative path is a harness file (rules in the module docstring).

    Examples:
        >>> [is_harness_path(p) for p in ("conftest.py", "pkg/sub/conftest.py", "tests/data/x.json",
        ...                               "pkg/test_mod.py", "pkg/mod_test.py", "setup.cfg", "a.pth")]
        [True, True, True, True, True, True, True]
        >>> [is_harness_path(p) for p in ("pkg/mod.py", "django/test/utils.py", "numpy/testing/api.py")]
        [False, False, False]
    """
    path = PurePosixPath(rel)
    name = path.name
    return (name in CONFIG_NAMES or name.endswith(".pth") or (name.startswith("test_") and name.endswith(".py"))
            or name.endswith("_test.py") or any(part in TEST_DIRS for part in path.parts[:-1]))


def protected_paths(diff_paths: Iterable[str], node_ids: Iterable[str], hidden: Iterable[str]) -> list[str]:
    """The paths to restore: the diff's harness files, the scored tests' files and the hidden tests' files.

    Args:
        diff_paths: paths the candidate diff touches.
        node_ids: pytest node ids scored (``path::name``).
        hidden: paths the hidden ``test_patch`` touches.

    Returns:
        Sorted repository-relative paths, without duplicates.
    """
    out = {p for p in diff_paths if is_harness_path(p)}
    out.update(n.split("::", 1)[0] for n in node_ids)
    out.update(hidden)
    return sorted(out)


def snapshot_bytes(repo: Path, paths: Iterable[str]) -> dict[str, bytes | None]:
    """Each path's bytes in ``repo`` before the diff (None when the file does not exist); a path that is a
    symlink in the snapshot is left out (the diff cannot write through it: :mod:`aml_ray.coding.diffs`)."""
    return {p: (repo / p).read_bytes() if (repo / p).is_file() else None for p in paths
            if not (repo / p).is_symlink()}


def restore(repo: Path, originals: dict[str, bytes | None], touched: Iterable[str]) -> list[str]:
    """Put every path of ``originals`` back; returns those of them the diff had touched (sorted).

    A path that did not exist is removed; one that did is rewritten with its original bytes.
    """
    for rel, data in originals.items():
        target = repo / rel
        if data is None:
            if target.is_file() or target.is_symlink():
                target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    touched = set(touched)
    return sorted(p for p in originals if p in touched)
