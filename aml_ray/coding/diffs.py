"""Unified diffs: parsing, the path safety rule, and a small strict applier.

Safety rule (a diff is **refused**, nothing written, when any path it names):

- is empty, absolute (``/x``, ``\\x``, ``C:x``) or holds a NUL byte;
- has a ``..`` component or a ``.git`` component (git metadata, hooks);
- resolves outside the repository root after following symlinks already in the snapshot (a path
  through ``link -> /elsewhere`` escapes even though its text looks harmless);
- or when the diff creates a symlink (git mode ``120000``), which could point anywhere.

Applying (a diff that cannot be applied **fails to apply**, nothing written):

- Every hunk's old side (context and ``-`` lines) must match the file exactly; the hunk header's line
  number is only the first place looked, then nearby lines outward (like ``patch``'s offset, no fuzz),
  never before the previous hunk's end. Hunk line counts in headers are not trusted (models get them
  wrong); a hunk ends at the next ``@@``, file header or the end of the diff.
- New files (``--- /dev/null``) must not exist; deleted files (``+++ /dev/null``) must exist.
- Renames, copies and binary patches are not supported (apply failure, not refusal).
- All files are patched in memory first and written only when every hunk applied.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

DEV_NULL = "/dev/null"
_LOST_SPACE = "\x00blank"
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class DiffRefused(Exception):
    """The diff touches a path outside the repository (see the module's safety rule)."""


class DiffApplyError(Exception):
    """The diff is well inside the repository but does not apply (context mismatch, bad format)."""


@dataclass
class Hunk:
    """One hunk: the header's old start line (1-based) and its body lines (prefix char + text)."""

    old_start: int
    lines: list[str] = field(default_factory=list)

    def old_side(self) -> list[str]:
        return [ln[1:] for ln in self.lines if ln[:1] in (" ", "-")]

    def new_side(self) -> list[str]:
        return [ln[1:] for ln in self.lines if ln[:1] in (" ", "+")]


@dataclass
class FilePatch:
    """The changes to one file. ``old_path``/``new_path`` are repository-relative or ``/dev/null``."""

    old_path: str
    new_path: str
    hunks: list[Hunk] = field(default_factory=list)
    new_no_newline: bool = False
    symlink: bool = False
    unsupported: str | None = None

    @property
    def path(self) -> str:
        return self.new_path if self.new_path != DEV_NULL else self.old_path


def _strip_prefix(raw: str) -> str:
    path = raw.split("\t", 1)[0].strip()
    if path.startswith('"') and path.endswith('"') and len(path) >= 2:
        path = path[1:-1]
    if path == DEV_NULL:
        return path
    if path.startswith(("a/", "b/")):
        path = path[2:]
    return path


def parse_diff(text: str) -> list[FilePatch]:
    """Parse a unified diff (git or plain) into file patches.

    Args:
        text: the diff; Markdown fences around it are tolerated.

    Returns:
        The file patches in order.

    Raises:
        DiffApplyError: no file header, or a hunk before any file header.
    """
    lines = text.replace("\r\n", "\n").split("\n")
    patches: list[FilePatch] = []
    pending: dict[str, object] = {}
    current: FilePatch | None = None
    hunk: Hunk | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            current, hunk, pending = None, None, {}
        elif line.startswith(("new file mode", "deleted file mode", "new mode", "old mode")):
            if line.rstrip().endswith("120000"):
                pending["symlink"] = True
        elif line.startswith(("rename from", "rename to", "copy from", "copy to")):
            pending["unsupported"] = "renames and copies are not supported; write the file's full change"
        elif line.startswith(("GIT binary patch", "Binary files ")):
            pending["unsupported"] = "binary patches are not supported"
            if line.startswith("Binary files "):
                m = re.match(r"Binary files (.+) and (.+) differ", line)
                if m:
                    patches.append(FilePatch(_strip_prefix(m.group(1)), _strip_prefix(m.group(2)),
                                             unsupported=str(pending["unsupported"])))
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            current = FilePatch(_strip_prefix(line[4:]), _strip_prefix(lines[i + 1][4:]),
                                symlink=bool(pending.get("symlink")),
                                unsupported=pending.get("unsupported"))  # type: ignore[arg-type]
            patches.append(current)
            hunk, pending = None, {}
            i += 1
        elif (m := _HUNK.match(line)) is not None:
            if current is None:
                raise DiffApplyError(f"diff line {i + 1}: hunk '{line.strip()}' comes before any '--- a/...' / "
                                     "'+++ b/...' file header")
            hunk = Hunk(old_start=int(m.group(1)))
            current.hunks.append(hunk)
        elif hunk is not None and current is not None:
            if line.startswith("\\"):
                prev = hunk.lines[-1][:1] if hunk.lines else ""
                if prev in ("+", " "):
                    current.new_no_newline = True
            elif line[:1] in (" ", "+", "-"):
                hunk.lines.append(line)
            elif line == "":
                hunk.lines.append(_LOST_SPACE)  # a blank context line whose leading space was lost
            elif line.startswith("```"):
                hunk = None
            else:
                hunk = None
        i += 1
    for p in patches:  # empty lines at a hunk's end are the text's trailing blank lines, not context
        for h in p.hunks:
            while h.lines and h.lines[-1] == _LOST_SPACE:
                h.lines.pop()
            h.lines = [" " if ln == _LOST_SPACE else ln for ln in h.lines]
    if not patches:
        raise DiffApplyError("no file changes found: a unified diff needs '--- a/<path>' and '+++ b/<path>' "
                             "headers followed by '@@' hunks")
    return patches


def diff_paths(text: str) -> list[str]:
    """Repository-relative paths a diff changes, in order, without duplicates (``/dev/null`` left out)."""
    out: list[str] = []
    for p in parse_diff(text):
        for path in (p.old_path, p.new_path):
            if path != DEV_NULL and path not in out:
                out.append(path)
    return out


def check_path(root: Path, rel: str) -> Path:
    """Resolve a diff path inside ``root`` or refuse it (see the module's safety rule).

    Args:
        root: the repository copy.
        rel: the path as written in the diff (prefix ``a/``/``b/`` already removed).

    Returns:
        The absolute path inside ``root``.

    Raises:
        DiffRefused: naming the path and the reason.
    """
    if not rel or "\x00" in rel:
        raise DiffRefused(f"path {rel!r} is empty or holds a NUL byte")
    if rel.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", rel):
        raise DiffRefused(f"path {rel!r} is absolute; diffs may only name repository-relative paths")
    parts = re.split(r"[\\/]+", rel)
    if ".." in parts:
        raise DiffRefused(f"path {rel!r} has a '..' component and may leave the repository")
    if ".git" in parts:
        raise DiffRefused(f"path {rel!r} is inside .git; repository metadata is not patchable")
    real_root = Path(os.path.realpath(root))
    target = Path(os.path.realpath(root / rel))
    if target != real_root and real_root not in target.parents:
        raise DiffRefused(f"path {rel!r} resolves to {target}, outside the repository (a symlink in the "
                          "snapshot leads out)")
    return root / rel


def check_diff(root: Path, text: str) -> list[FilePatch]:
    """Parse ``text`` and apply the safety rule to every path it names.

    Raises:
        DiffRefused: a path outside the repository or a symlink creation.
        DiffApplyError: the text is not a diff.
    """
    patches = parse_diff(text)
    for p in patches:
        for path in (p.old_path, p.new_path):
            if path != DEV_NULL:
                check_path(root, path)
        if p.symlink:
            raise DiffRefused(f"the diff creates a symlink at {p.path!r}; symlinks may point outside the "
                              "repository")
    return patches


def _find(lines: list[str], needle: list[str], guess: int, floor: int) -> int:
    """Where ``needle`` occurs in ``lines`` at or after ``floor``, nearest to ``guess``; -1 if nowhere."""
    limit = len(lines) - len(needle)
    if limit < floor:
        return -1
    guess = min(max(guess, floor), limit)
    for delta in range(limit - floor + 1):
        for pos in (guess + delta, guess - delta):
            if floor <= pos <= limit and lines[pos:pos + len(needle)] == needle:
                return pos
    return -1


def _apply_hunks(rel: str, text: str, patch: FilePatch) -> str:
    ends_nl = text.endswith("\n") or text == ""
    lines = text.split("\n")
    if ends_nl:
        lines = lines[:-1]
    floor = 0
    offset = 0
    touched_end = False
    for n, h in enumerate(patch.hunks, start=1):
        old, new = h.old_side(), h.new_side()
        guess = max(h.old_start - 1, 0) + offset
        pos = _find(lines, old, guess, floor)
        if pos < 0:
            first = old[0] if old else ""
            raise DiffApplyError(f"{rel}: hunk {n} (@@ -{h.old_start}) does not match the file; its first "
                                 f"old line is {first!r}")
        lines[pos:pos + len(old)] = new
        offset += len(new) - len(old) + (pos - guess)
        floor = pos + len(new)
        touched_end = floor == len(lines)
    out = "\n".join(lines)
    keep_nl = not (patch.new_no_newline and touched_end)
    if lines and (keep_nl if touched_end else ends_nl):
        out += "\n"
    return out


def apply_diff(root: Path, text: str) -> list[str]:
    """Check and apply a unified diff to the repository at ``root`` (all or nothing).

    Args:
        root: the repository copy (written in place).
        text: the diff.

    Returns:
        Repository-relative paths written or deleted, in order.

    Raises:
        DiffRefused: see the safety rule; nothing is written.
        DiffApplyError: see the applying rules; nothing is written.
    """
    patches = check_diff(root, text)
    state: dict[str, str | None] = {}  # rel -> new text, None = deleted
    for p in patches:
        if p.unsupported:
            raise DiffApplyError(f"{p.path}: {p.unsupported}")
        path = p.path
        current = state[path] if path in state else None
        exists = path in state and state[path] is not None or (path not in state and (root / path).is_file())
        if p.old_path == DEV_NULL:
            if exists:
                raise DiffApplyError(f"{path}: the diff creates it, but it already exists")
            state[path] = _apply_hunks(path, "", p)
            continue
        if not exists:
            raise DiffApplyError(f"{path}: no such file in the repository")
        if current is None:
            current = (root / path).read_text(encoding="utf-8", errors="surrogateescape")
        if p.new_path == DEV_NULL:
            state[path] = None
            continue
        state[path] = _apply_hunks(path, current, p)
    for rel, content in state.items():
        target = root / rel
        if content is None:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8", errors="surrogateescape")
    return list(state)
