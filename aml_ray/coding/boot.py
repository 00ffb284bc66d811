"""The sandbox's pytest launcher: the result reporter is in place before any repository code loads.

Copied by :mod:`aml_ray.coding.sandbox` into a read-only folder next to the repository copy and run as
``python BOOT RESULTS [pytest arguments]`` from the repository folder, in the repository's interpreter
(standard library and pytest only; Python 3.6+ syntax, as SWE-bench's environments go back that far).

Why a launcher and not ``python -m pytest``: ``-m`` puts the working directory first on ``sys.path``,
so a ``pytest.py`` or ``json.py`` added by the candidate diff loads in place of the real one before any
plugin can act. Run as a script, ``sys.path[0]`` is this read-only folder; pytest, its dependencies and
every module the reporter uses are imported first, and only then does the repository folder take
``sys.path[0]`` (where ``python -m pytest`` would have put it, so the repository imports as before).

``RESULTS`` is ``fd:N`` (an inherited pipe or file descriptor: the subprocess sandbox) or ``path:P``
(a file: the container sandbox). The descriptor is made close-on-exec at once, so the tests' child
processes do not inherit it, and the process is made non-dumpable, so other processes of the sandbox
cannot open it through ``/proc/<pid>/fd``. Nothing travels in the environment, and no module global
holds the writer: the reporter object lives only in pytest's plugin manager.

One JSON object per line (the host's reader, :mod:`aml_ray.coding.verdict`, checks their order):

- ``{"e": "loaded", "names": [...]}`` first: the top-level modules loaded before the repository took
  ``sys.path[0]`` (a file of the repository by one of these names can no longer replace it; the host
  flags a diff that adds one);
- ``{"e": "start", "n": nodeid}`` when a test starts;
- ``{"e": "call", "n": nodeid, "raised": name or null}``: what the test function itself raised, seen
  by a wrapper around ``pytest_runtest_call`` (independent of the report pytest builds afterwards);
- ``{"e": "report", "n": nodeid, "when": ..., "outcome": ..., "wasxfail": bool}`` per phase report;
- ``{"e": "collect", "n": nodeid, "outcome": "failed"}`` per collection error;
- ``{"e": "finish", "exitstatus": int, "replaced": [names]}`` at the end of the session, where
  ``replaced`` names the pytest internals on the reporting path (:data:`WATCHED`) that are no longer
  the objects they were before the repository loaded.
"""

import ctypes
import json
import os
import sys

import pytest

#: (module, attribute, class attribute or None): the objects between a test's execution and its report.
WATCHED = (("_pytest.runner", "call_and_report", None), ("_pytest.runner", "runtestprotocol", None),
           ("_pytest.runner", "call_runtest_hook", None), ("_pytest.runner", "pytest_runtest_makereport", None),
           ("_pytest.runner", "pytest_runtest_protocol", None), ("_pytest.runner", "pytest_runtest_call", None),
           ("_pytest.runner", "CallInfo", "from_call"), ("_pytest.reports", "TestReport", "from_item_and_call"),
           ("_pytest.python", "Function", "runtest"), ("_pytest.python", "pytest_pyfunc_call", None),
           ("_pytest.skipping", "pytest_runtest_makereport", None), ("_pytest.main", "pytest_runtestloop", None),
           ("_pytest.terminal", "TerminalReporter", "pytest_runtest_logreport"),
           ("_pytest.terminal", "TerminalReporter", "summary_stats"), ("os", "_exit", None), ("os", "write", None))


def _lookup(module, attr, member):
    obj = getattr(sys.modules.get(module), attr, None)
    if member is not None:
        obj = getattr(obj, "__dict__", {}).get(member)
    return obj


def _open(spec):
    kind, _, value = spec.partition(":")
    if kind == "fd":
        fd = int(value)
    elif kind == "path":
        fd = os.open(value, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0), 0o600)
    else:
        raise SystemExit("aml-sandbox: RESULTS must be fd:N or path:P, got " + repr(spec))
    os.set_inheritable(fd, False)
    return fd


def _not_dumpable():
    try:
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass  # not Linux: nothing to hide /proc/<pid>/fd from


class _Reporter:
    """pytest hooks that write the record lines of the module docstring to one descriptor."""

    def __init__(self, fd, write, dumps):
        self._fd, self._write, self._dumps = fd, write, dumps
        import _pytest.main  # noqa: F401 - load every watched module before the repository can
        import _pytest.python  # noqa: F401
        import _pytest.reports  # noqa: F401
        import _pytest.runner  # noqa: F401
        import _pytest.skipping  # noqa: F401
        import _pytest.terminal  # noqa: F401
        self._watched = [(w, _lookup(*w)) for w in WATCHED]

    def _emit(self, record):
        self._write(self._fd, (self._dumps(record) + "\n").encode("utf-8"))

    def pytest_runtest_logstart(self, nodeid, location):
        self._emit({"e": "start", "n": nodeid})

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        outcome = yield
        excinfo = getattr(outcome, "excinfo", None)
        self._emit({"e": "call", "n": item.nodeid, "raised": excinfo[0].__name__ if excinfo else None})

    def pytest_runtest_logreport(self, report):
        self._emit({"e": "report", "n": report.nodeid, "when": report.when, "outcome": report.outcome,
                    "wasxfail": hasattr(report, "wasxfail")})

    def pytest_collectreport(self, report):
        if report.failed:
            self._emit({"e": "collect", "n": report.nodeid, "outcome": "failed"})

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus):
        replaced = [".".join(filter(None, w)) for w, obj in self._watched if _lookup(*w) is not obj]
        self._emit({"e": "finish", "exitstatus": int(exitstatus), "replaced": replaced})


def main(argv):
    """Open the results channel, register the reporter, hand ``sys.path[0]`` to the repository, run pytest."""
    fd = _open(argv[1])
    _not_dumpable()
    reporter = _Reporter(fd, os.write, json.dumps)
    reporter._emit({"e": "loaded", "names": sorted({name.partition(".")[0] for name in sys.modules})})
    sys.argv = ["pytest", *argv[2:]]
    sys.path[0] = os.getcwd()  # where ``python -m pytest`` puts it, now that the reporter is loaded
    return pytest.main(argv[2:], plugins=[reporter])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
