"""The verdict of one sandbox run, read on the host and cross-checked.

The launcher (:mod:`aml_ray.coding.boot`) sends one record per pytest event through a channel the host
reads after the run. Everything inside the sandbox is participant-influenced, so the host:

- reads the results file with ``O_NOFOLLOW | O_NONBLOCK``, only when it is a regular file, and at most
  :data:`RESULTS_CAP` bytes (:func:`read_capped`): a symlink, a FIFO or a device is refused without
  opening its target;
- takes per-test outcomes from the records (:func:`outcomes`, rules below), and
- cross-checks them (:func:`cross_check`) against what pytest itself did: its exit status as the
  operating system reports it, the exit status pytest handed to ``pytest_sessionfinish``, the counts of
  its own summary line (``2 failed, 2 passed in 0.12s``), the record order, what each test function
  raised (a test reported ``passed`` whose function raised, or never ran, is a forged report), and the
  identity of pytest's reporting functions. Any disagreement is a **flag**; an attempt with a flag is
  unresolved (:func:`aml_ray.coding.scoring.report_resolved`) and the flags are kept in its evidence.

Outcome rules (per node id): ``skipped`` (``xfail`` when the report carries ``wasxfail``); a failed
setup is ``error``; the call phase decides ``passed`` / ``failed`` (an xpass reports ``passed``); a
failing teardown after a pass is ``error``. A test that started and never finished is ``timeout`` when
the wall clock stopped the run, else ``error``; a test never started is ``not_run``.

A collection error counts as an error and implies exit status 2 (pytest stops the session).
Summary counts follow pytest's ``pytest_report_teststatus`` (``_pytest/terminal.py``,
``_pytest/skipping.py``): each call report counts as passed, failed, skipped, xfailed or xpassed; a
failed setup or teardown report counts as an error; a skipped setup as skipped (xfailed with
``wasxfail``).

What the checks cannot see: code under test that returns what the tests expect (the bug left in place
but special-cased for the test) passes honestly, as in any test harness; code that rewrites the
reporter's own objects in memory could forge a consistent stream. The diff and the output tail stay in
the evidence for review.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

#: Largest results file read, in bytes (about 40,000 tests' records); larger is refused and flagged.
RESULTS_CAP = 8 * 1024 * 1024
_SUMMARY = re.compile(r"^=*\s*((?:\d+ [a-z]+(?:, )?)+) in [\d.]+\s*s(?:econds)?\b.*?=*\s*$")
_COUNT = re.compile(r"(\d+) ([a-z]+)")
_PLURAL = {"errors": "error", "warnings": "warning"}
_COUNTED = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")


class UnsafeOutput(Exception):
    """An output path is not a regular file, is a symlink, or is larger than its cap."""


def read_capped(path: Path, cap: int = RESULTS_CAP) -> bytes | None:
    """The bytes of ``path``, refusing anything but a regular file of at most ``cap`` bytes.

    Args:
        path: the file (its last component is never followed when it is a symlink).
        cap: the most bytes accepted.

    Returns:
        The content, or None when the file does not exist.

    Raises:
        UnsafeOutput: the path is a symlink, a FIFO, a device or a folder, or holds more than ``cap`` bytes.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):
            raise UnsafeOutput(f"{path.name} is a symlink; not followed") from None
        raise UnsafeOutput(f"{path.name} cannot be opened: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeOutput(f"{path.name} is not a regular file (mode {stat.filemode(st.st_mode)})")
        data = os.read(fd, cap + 1)
        if len(data) > cap:
            raise UnsafeOutput(f"{path.name} holds more than {cap} bytes")
        return data
    finally:
        os.close(fd)


def unsafe_entries(folder: Path) -> list[str]:
    """Entries under ``folder`` (walked without following links) that are not regular files or folders."""
    bad: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for name in (*dirnames, *filenames):
            mode = os.lstat(os.path.join(dirpath, name)).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                bad.append(os.path.relpath(os.path.join(dirpath, name), folder))
    return sorted(bad)


@dataclass
class Records:
    """The parsed records of one run (see :mod:`aml_ray.coding.boot`)."""

    reports: list[dict] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    calls: dict[str, str | None] = field(default_factory=dict)
    collect_errors: int = 0
    loaded: frozenset[str] = frozenset()
    finish: dict | None = None
    problems: list[str] = field(default_factory=list)


def parse_records(data: bytes) -> Records:
    """Records from the results bytes; a line out of protocol order becomes a problem (never an outcome).

    The protocol per test, one test at a time: ``start``, then its reports and at most one ``call``
    before the call report; ``finish`` last. A line that is not JSON, a record for another node id than
    the running test, a second ``start`` or a record after ``finish`` is out of order.
    """
    rec = Records()
    current: str | None = None
    for i, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        try:
            r = json.loads(line)
        except ValueError:
            rec.problems.append(f"results line {i} is not JSON")
            continue
        e, node = r.get("e") if isinstance(r, dict) else None, r.get("n") if isinstance(r, dict) else None
        if rec.finish is not None:
            rec.problems.append(f"results line {i} comes after the session finished")
        elif e == "loaded" and not rec.started and not rec.loaded:
            rec.loaded = frozenset(n for n in r.get("names") or [] if isinstance(n, str))
        elif e == "collect":
            rec.collect_errors += 1
        elif e == "start":
            if node in rec.started:
                rec.problems.append(f"results line {i} starts {node} a second time")
            rec.started.append(node)
            current = node
        elif e in ("call", "report") and node != current:
            rec.problems.append(f"results line {i} reports {node} while {current} runs")
        elif e == "call":
            rec.calls[node] = r.get("raised")
        elif e == "report":
            rec.reports.append(r)
        elif e == "finish":
            rec.finish = r
        else:
            rec.problems.append(f"results line {i} has an unknown event {e!r}")
    return rec


def outcomes(rec: Records, tests: tuple[str, ...], timed_out: bool) -> dict[str, str]:
    """Node id -> outcome for every named test (rules in the module docstring)."""
    final: dict[str, str] = {}
    for r in rec.reports:
        node, when, outcome = r.get("n"), r.get("when"), r.get("outcome")
        if outcome == "skipped":
            final[node] = "xfail" if r.get("wasxfail") else "skipped"
        elif when == "setup" and outcome == "failed":
            final[node] = "error"
        elif when == "call":
            final[node] = "passed" if outcome == "passed" else "failed"
        elif when == "teardown" and outcome == "failed" and final.get(node) in (None, "passed"):
            final[node] = "error"
    out: dict[str, str] = {}
    for t in tests:
        if t in final:
            out[t] = final[t]
        elif t in rec.started:
            out[t] = "timeout" if timed_out else "error"
        else:
            out[t] = "not_run"
    return out


def report_counts(rec: Records) -> Counter:
    """pytest's summary counts implied by the reports (rules in the module docstring)."""
    counts: Counter = Counter({"error": rec.collect_errors})
    for r in rec.reports:
        when, outcome, xf = r.get("when"), r.get("outcome"), bool(r.get("wasxfail"))
        if when == "call":
            if outcome == "passed":
                counts["xpassed" if xf else "passed"] += 1
            elif outcome == "failed":
                counts["failed"] += 1
            else:
                counts["xfailed" if xf else "skipped"] += 1
        elif outcome == "failed":
            counts["error"] += 1
        elif outcome == "skipped":
            counts["xfailed" if xf else "skipped"] += 1
    return counts


def summary_line(output: str) -> tuple[str | None, Counter]:
    """pytest's last summary line in ``output`` and its counts of :data:`_COUNTED` (None when absent)."""
    for line in reversed(output.splitlines()):
        m = _SUMMARY.match(line.strip())
        if m:
            counts: Counter = Counter()
            for n, word in _COUNT.findall(m.group(1)):
                word = _PLURAL.get(word, word)
                if word in _COUNTED:
                    counts[word] += int(n)
            return line.strip(), counts
    return None, Counter()


def shadowing(rec: Records, files_changed: list[str]) -> list[str]:
    """Flags for files the diff wrote at the repository's top level that are named like a module the launcher
    loaded before the repository (``pytest.py``, ``json.py``, ``_pytest/__init__.py``): a forgery attempt,
    harmless now but never part of a fix."""
    flags = []
    for path in files_changed:
        parts = path.split("/")
        name = parts[0][:-3] if len(parts) == 1 and parts[0].endswith(".py") else (
            parts[0] if len(parts) == 2 and parts[1] == "__init__.py" else None)
        if name in rec.loaded:
            flags.append(f"the diff writes {path}, named like the module {name} loaded before the repository")
    return flags


def cross_check(rec: Records, returncode: int | None, output: str, timed_out: bool) -> tuple[str | None, list[str]]:
    """The summary line and the flags: every way pytest's own behaviour disagrees with the records.

    Args:
        rec: the parsed records.
        returncode: the test process's exit status as the host saw it (None when killed).
        output: the tail of the test output (the summary line is its last lines).
        timed_out: the wall clock stopped the run (then no summary and no finish are expected).

    Returns:
        ``(summary_line, flags)``; an empty list means everything agreed.
    """
    flags = list(rec.problems)
    for r in rec.reports:
        node = r.get("n")
        if r.get("when") == "call" and r.get("outcome") == "passed":
            if node not in rec.calls:
                flags.append(f"{node} reported passed but its test function never ran (pytest_runtest_call)")
            elif rec.calls[node] is not None:
                flags.append(f"{node} reported passed but its test function raised {rec.calls[node]}")
    line, counts = summary_line(output)
    if timed_out:
        return line, flags
    implied = report_counts(rec)
    # pytest's ExitCode: 2 interrupted (collection errors stop the session), 1 tests failed, 5 none collected
    expected_status = (2 if rec.collect_errors else 1 if implied["failed"] or implied["error"]
                       else 0 if rec.reports else 5)
    if rec.finish is None:
        flags.append("pytest's session never finished (no finish record)")
    else:
        for name in rec.finish.get("replaced") or []:
            flags.append(f"pytest internals replaced during the run: {name}")
        if rec.finish.get("exitstatus") != expected_status:
            flags.append(f"pytest_sessionfinish saw exit status {rec.finish.get('exitstatus')} but the reports "
                         f"imply {expected_status}")
    if returncode != expected_status:
        flags.append(f"pytest exited with {returncode} but the reports imply {expected_status}")
    if line is None:
        flags.append("pytest printed no summary line")
    else:
        got = {k: counts[k] for k in _COUNTED if counts[k]}
        want = {k: implied[k] for k in _COUNTED if implied[k]}
        if got != want:
            flags.append(f"pytest's summary {line!r} disagrees with the reports {want}")
    return line, flags
