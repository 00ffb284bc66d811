"""Unified diffs: parsing, the path safety rule and the strict applier (no Ray, milliseconds)."""

from __future__ import annotations

import difflib
import os

import pytest

from aml_ray.coding.diffs import DiffApplyError, DiffRefused, apply_diff, diff_paths, parse_diff


def _diff(path: str, old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}"))


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("".join(f"line{i}\n" for i in range(40)))
    return root


def test_apply_diff_writes_the_change(repo):
    old = (repo / "pkg" / "a.py").read_text()
    new = old.replace("line5\n", "FIVE\n").replace("line30\n", "THIRTY\nextra\n")
    assert apply_diff(repo, _diff("pkg/a.py", old, new)) == ["pkg/a.py"]
    assert (repo / "pkg" / "a.py").read_text() == new


def test_hunk_line_numbers_are_only_a_hint(repo):
    old = (repo / "pkg" / "a.py").read_text()
    diff = _diff("pkg/a.py", old, old.replace("line20\n", "TWENTY\n"))
    shifted = diff.replace("@@ -18,7 +18,7 @@", "@@ -3,9 +3,2 @@")  # wrong start and wrong counts
    assert shifted != diff
    apply_diff(repo, "Here is the fix:\n```diff\n" + shifted + "```\n")
    assert "TWENTY\n" in (repo / "pkg" / "a.py").read_text()


def test_context_mismatch_fails_and_writes_nothing(repo):
    before = (repo / "pkg" / "a.py").read_text()
    good = _diff("pkg/a.py", before, before.replace("line1\n", "ONE\n"))
    bad = "--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -30,1 +30,1 @@\n-not in the file\n+x\n"
    with pytest.raises(DiffApplyError, match="hunk 1"):
        apply_diff(repo, good + bad)
    assert (repo / "pkg" / "a.py").read_text() == before


def test_new_and_deleted_files(repo):
    created = "--- /dev/null\n+++ b/pkg/new.py\n@@ -0,0 +1,2 @@\n+x = 1\n+y = 2\n"
    assert apply_diff(repo, created) == ["pkg/new.py"]
    assert (repo / "pkg" / "new.py").read_text() == "x = 1\ny = 2\n"
    with pytest.raises(DiffApplyError, match="already exists"):
        apply_diff(repo, created)
    deleted = "--- a/pkg/new.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-x = 1\n-y = 2\n"
    apply_diff(repo, deleted)
    assert not (repo / "pkg" / "new.py").exists()


def test_no_newline_at_end_of_file(repo):
    (repo / "f.txt").write_text("a\nb")
    diff = ("--- a/f.txt\n+++ b/f.txt\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n"
            "\\ No newline at end of file\n")
    apply_diff(repo, diff)
    assert (repo / "f.txt").read_text() == "a\nc"


@pytest.mark.parametrize("path", ["../outside.py", "pkg/../../outside.py", "/etc/passwd", ".git/hooks/pre-commit",
                                  "C:/x.py"])
def test_paths_outside_the_repository_are_refused(repo, path):
    diff = f"--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-a\n+b\n".replace("a//", "/").replace("b//", "/")
    with pytest.raises(DiffRefused):
        apply_diff(repo, diff)


def test_a_symlink_leading_out_is_refused(repo, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.py").write_text("a\n")
    os.symlink(outside, repo / "link")
    with pytest.raises(DiffRefused, match="outside the repository"):
        apply_diff(repo, "--- a/link/x.py\n+++ b/link/x.py\n@@ -1 +1 @@\n-a\n+b\n")
    assert (outside / "x.py").read_text() == "a\n"


def test_creating_a_symlink_is_refused(repo):
    diff = ("diff --git a/ln b/ln\nnew file mode 120000\n--- /dev/null\n+++ b/ln\n@@ -0,0 +1 @@\n+/etc/passwd\n"
            "\\ No newline at end of file\n")
    with pytest.raises(DiffRefused, match="symlink"):
        apply_diff(repo, diff)


def test_text_without_a_diff_is_an_apply_error(repo):
    with pytest.raises(DiffApplyError, match="no file changes"):
        parse_diff("I could not find the bug.")
    with pytest.raises(DiffApplyError, match="binary"):
        apply_diff(repo, "diff --git a/x.png b/x.png\nBinary files a/x.png and b/x.png differ\n")


def test_diff_paths_lists_changed_files():
    diff = _diff("a.py", "x\n", "y\n") + _diff("b/c.py", "x\n", "y\n")
    assert diff_paths(diff) == ["a.py", "b/c.py"]
