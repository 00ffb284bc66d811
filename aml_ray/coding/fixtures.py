"""Offline fixture generator: tiny Python repositories with a seeded bug, tests and past trajectories.

Each generated task mirrors a SWE-bench instance on a repository small enough to test in a second:

- a package module with one seeded bug (one wrong line) next to a correct function;
- visible tests that pass before and after the fix (PASS_TO_PASS), and hidden tests in ``test_patch``
  that fail on the bug and pass with the fix (FAIL_TO_PASS), as SWE-bench keeps the tests away from
  the agent;
- a gold patch (one line) kept in the row's ``patch`` field;
- past trajectories on the repository: a **relevant** one whose turns contain the fix's clue (the
  correct line, verbatim) and **noisy** ones (same repository, another function; and another
  repository) that do not.

The seed picks the repositories, their test values, the trajectories' lengths and timestamps; the same
seed gives byte-identical files. :func:`generate_bench` also returns a :class:`FixtureKey` per task with
diffs a test can use: the fix, a plausible wrong fix, a fix that breaks a passing test, a fix that loops
forever. The key is test-side knowledge; the platform never reads it.
"""

from __future__ import annotations

import difflib
import random
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from aml_ray.coding.bench import load_bench, write_bench
from aml_ray.coding.task import CodingBench, Trajectory, Turn

FIXTURE_DATASET = "cambench-local"


@dataclass(frozen=True)
class _Template:
    name: str
    module: str
    source: str
    bug: str
    fix: str
    wrong: str
    other_old: str
    other_new: str
    visible_tests: str
    hidden_tests: str
    p2p: tuple[str, ...]
    f2p: tuple[str, ...]
    problem: str
    function: str
    other_function: str
    symptom: str


def _templates(rng: random.Random) -> list[_Template]:
    price, pct = rng.choice([250, 320, 480, 640]), rng.choice([20, 25, 30, 40])
    expected = round(price * (100 - pct) / 100, 2)
    a, b = rng.choice([(1, 2), (3, 4), (5, 6)])
    lo, hi = 0, rng.choice([10, 20, 50])
    words = rng.choice([("Hello", "Memory", "World"), ("Agent", "Memory", "Board"), ("Tiny", "Repo", "Task")])
    return [
        _Template(
            name="pricing", module="pricing/core.py",
            source='"""Prices for the shop."""\n\n\ndef apply_discount(price, percent):\n'
                   '    """The price after taking ``percent`` per cent off."""\n'
                   '    return round(price * percent / 100, 2)\n\n\ndef add_tax(price, rate):\n'
                   '    """The price with ``rate`` per cent tax added."""\n'
                   '    return round(price * (1 + rate / 100), 2)\n',
            bug="    return round(price * percent / 100, 2)",
            fix="    return round(price * (100 - percent) / 100, 2)",
            wrong="    return round(price - percent, 2)",
            other_old="    return round(price * (1 + rate / 100), 2)",
            other_new="    return round(price * rate / 100, 2)",
            visible_tests="from pricing.core import add_tax\n\n\ndef test_add_tax():\n"
                          "    assert add_tax(200, 10) == 220.0\n\n\ndef test_add_tax_zero_rate():\n"
                          "    assert add_tax(50, 0) == 50.0\n",
            hidden_tests=f"from pricing.core import apply_discount\n\n\ndef test_apply_discount_takes_percent_off():\n"
                         f"    assert apply_discount({price}, {pct}) == {expected}\n\n\n"
                         f"def test_zero_discount_keeps_price():\n    assert apply_discount({price}, 0) == {price}\n",
            p2p=("tests/test_core.py::test_add_tax", "tests/test_core.py::test_add_tax_zero_rate"),
            f2p=("tests/test_regression.py::test_apply_discount_takes_percent_off",
                 "tests/test_regression.py::test_zero_discount_keeps_price"),
            problem=f"apply_discount({price}, {pct}) returns {round(price * pct / 100, 2)} at checkout, but "
                    f"customers expect to pay {expected}. The discounted price looks wrong.",
            function="apply_discount", other_function="add_tax", symptom="checkout total after a discount"),
        _Template(
            name="textkit", module="textkit/slug.py",
            source='"""Text helpers."""\n\n\ndef slugify(title):\n'
                   '    """A URL slug: lower-case words joined by the project\'s separator."""\n'
                   '    words = title.lower().split()\n    return "_".join(words)\n\n\ndef word_count(text):\n'
                   '    """Number of whitespace-separated words."""\n    return len(text.split())\n',
            bug='    return "_".join(words)',
            fix='    return "-".join(words)',
            wrong='    return "".join(words)',
            other_old="    return len(text.split())",
            other_new="    return len(text)",
            visible_tests='from textkit.slug import slugify, word_count\n\n\ndef test_word_count():\n'
                          '    assert word_count("a b  c") == 3\n\n\ndef test_slugify_single_word():\n'
                          '    assert slugify("Single") == "single"\n',
            hidden_tests=f'from textkit.slug import slugify\n\n\ndef test_slug_uses_project_separator():\n'
                         f'    assert slugify("{" ".join(words)}") == "{"-".join(w.lower() for w in words)}"\n',
            p2p=("tests/test_core.py::test_word_count", "tests/test_core.py::test_slugify_single_word"),
            f2p=("tests/test_regression.py::test_slug_uses_project_separator",),
            problem=f'slugify("{" ".join(words)}") gives "{"_".join(w.lower() for w in words)}"; the links it '
                    "makes do not match the site's URL convention and return 404.",
            function="slugify", other_function="word_count", symptom="broken links from slugs"),
        _Template(
            name="stats", module="stats/mean.py",
            source='"""Small statistics."""\n\n\ndef mean(values):\n'
                   '    """Arithmetic mean of a non-empty sequence."""\n'
                   '    return sum(values) / (len(values) + 1)\n\n\ndef total(values):\n'
                   '    """Sum of the values."""\n    return sum(values)\n',
            bug="    return sum(values) / (len(values) + 1)",
            fix="    return sum(values) / len(values)",
            wrong="    return sum(values) // len(values)",
            other_old="    return sum(values)\n",
            other_new="    return sum(values) + 1\n",
            visible_tests="from stats.mean import total\n\n\ndef test_total():\n    assert total([1, 2, 3]) == 6\n",
            hidden_tests=f"from stats.mean import mean\n\n\ndef test_mean_of_two():\n"
                         f"    assert mean([{a}, {b}]) == {(a + b) / 2}\n\n\ndef test_mean_of_equal_values():\n"
                         "    assert mean([4, 4, 4, 4]) == 4\n",
            p2p=("tests/test_core.py::test_total",),
            f2p=("tests/test_regression.py::test_mean_of_two",
                 "tests/test_regression.py::test_mean_of_equal_values"),
            problem=f"mean([{a}, {b}]) returns {round((a + b) / 3, 4)} instead of {(a + b) / 2}; every "
                    "average on the dashboard is too low.",
            function="mean", other_function="total", symptom="averages on the dashboard"),
        _Template(
            name="ranges", module="ranges/clamp.py",
            source='"""Ranges."""\n\n\ndef clamp(value, low, high):\n'
                   '    """``value`` limited to the closed range [low, high]."""\n'
                   '    return max(low, min(value, low))\n\n\ndef span(low, high):\n'
                   '    """Width of the range."""\n    return high - low\n',
            bug="    return max(low, min(value, low))",
            fix="    return max(low, min(value, high))",
            wrong="    return min(low, max(value, high))",
            other_old="    return high - low",
            other_new="    return low - high",
            visible_tests="from ranges.clamp import clamp, span\n\n\ndef test_clamp_below():\n"
                          f"    assert clamp(-3, {lo}, {hi}) == {lo}\n\n\n"
                          "def test_span():\n    assert span(2, 7) == 5\n",
            hidden_tests=f"from ranges.clamp import clamp\n\n\ndef test_clamp_inside():\n"
                         f"    assert clamp({hi // 2}, {lo}, {hi}) == {hi // 2}\n\n\ndef test_clamp_above():\n"
                         f"    assert clamp({hi + 5}, {lo}, {hi}) == {hi}\n",
            p2p=("tests/test_core.py::test_clamp_below", "tests/test_core.py::test_span"),
            f2p=("tests/test_regression.py::test_clamp_inside", "tests/test_regression.py::test_clamp_above"),
            problem=f"clamp({hi // 2}, {lo}, {hi}) returns {lo}: every value inside the range collapses to the "
                    "lower bound, so the volume slider is stuck at zero.",
            function="clamp", other_function="span", symptom="the volume slider"),
    ]


@dataclass(frozen=True)
class FixtureKey:
    """Test-side knowledge about one generated task (never read by the platform).

    Attributes:
        instance_id: the task.
        module: the repository path holding the bug.
        clue: the text whose presence in retrieved memories reveals the fix (the correct line).
        fix_diff: the gold patch.
        wrong_diff: a plausible fix that leaves the FAIL_TO_PASS tests failing.
        breaking_diff: the fix plus a change that breaks a PASS_TO_PASS test.
        looping_diff: replaces the buggy line with an endless loop.
        relevant / noisy: the memory sets' trajectory ids.
    """

    instance_id: str
    module: str
    clue: str
    fix_diff: str
    wrong_diff: str
    breaking_diff: str
    looping_diff: str
    relevant: tuple[str, ...]
    noisy: tuple[str, ...]


def _diff(path: str, old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}"))


def _ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def _turns(rng: random.Random, start: datetime, script: list[tuple[str, str]], filler: int,
           t: _Template) -> tuple[Turn, ...]:
    """The scripted turns with ``filler`` exploration turns (tool call + result pairs) after the first."""
    explore: list[tuple[str, str]] = []
    for i in range(filler):
        if i % 2 == 0:
            explore.append(("assistant", f'[tool_use list_files] {{"path": "{t.name}"}}'))
        else:
            explore.append(("tool", f"{t.module}\n{t.name}/__init__.py\ntests/test_core.py"))
    turns = [script[0], *explore, *script[1:]]
    clock = start
    out = []
    for role, content in turns:
        out.append(Turn(role=role, content=content, timestamp_ms=_ms(clock)))  # type: ignore[arg-type]
        clock = datetime.fromtimestamp(clock.timestamp() + rng.randint(20, 90), tz=timezone.utc)
    return tuple(out)


def _trajectories(rng: random.Random, t: _Template, others: list[_Template], idx: int
                  ) -> tuple[Trajectory, list[Trajectory]]:
    repo = f"fixtures/{t.name}"
    day = datetime(2025, 1, 1, 9, 0, tzinfo=timezone.utc)
    start = datetime.fromtimestamp(day.timestamp() + rng.randint(0, 60) * 86400, tz=timezone.utc)
    relevant = Trajectory(
        trajectory_id=f"past-{t.name}-{idx}-regression", repo=repo, files_touched=(t.module,),
        title=f"Regression in {t.function}",
        turns=_turns(rng, start, [
            ("user", f"In {repo}, {t.function} misbehaves again ({t.symptom}). Please find the cause and fix it."),
            ("assistant", f'[tool_use read_file] {{"path": "{t.module}"}}'),
            ("tool", t.source),
            ("assistant", f"Found it: {t.function} in {t.module} has the wrong expression. The correct line "
                          f"is:\n{t.fix}\nI restored it; remember this line if {t.function} regresses."),
            ("tool", "pytest: all tests passed"),
            ("user", f"Thanks, {t.symptom} works again."),
        ], rng.randint(16, 24), t))  # more than 20 turns: at least two Add chunks
    other = others[0]
    noisy = [
        Trajectory(
            trajectory_id=f"past-{t.name}-{idx}-{t.other_function}", repo=repo, files_touched=(t.module,),
            title=f"Docs for {t.other_function}",
            turns=_turns(rng, datetime.fromtimestamp(start.timestamp() + 86400 * 3, tz=timezone.utc), [
                ("user", f"In {repo}, please document {t.other_function} next to {t.function} in {t.module}."),
                ("assistant", f'[tool_use read_file] {{"path": "{t.module}"}}'),
                ("tool", t.source),
                ("assistant", f"I added a docstring to {t.other_function}; {t.function} was not changed."),
                ("user", "Good, thanks."),
            ], rng.randint(2, 6), t)),
        Trajectory(
            trajectory_id=f"past-{t.name}-{idx}-ci", repo=f"fixtures/{other.name}", files_touched=(other.module,),
            title="CI cache",
            turns=_turns(rng, datetime.fromtimestamp(start.timestamp() + 86400 * 5, tz=timezone.utc), [
                ("user", f"The CI of fixtures/{other.name} is slow; can you speed it up?"),
                ("assistant", "I enabled the pip cache in the CI workflow; tests take 40 s less."),
                ("user", "Great."),
            ], rng.randint(0, 4), other)),
    ]
    return relevant, noisy


def generate_bench(root: Path, *, n_repos: int = 3, seed: int = 0, name: str = FIXTURE_DATASET,
                   n_tasks: int | None = None) -> tuple[CodingBench, list[FixtureKey]]:
    """Write a bench of generated repositories under ``root`` and load it back.

    Args:
        root: an empty or new folder.
        n_repos: how many repositories, one task each, 1 to 4 (used when ``n_tasks`` is None).
        seed: the random seed (same seed, same bytes).
        name: the bench's dataset name.
        n_tasks: how many tasks, 1 to 1,000 (CAMBench's shape is 150): the four repositories are
            cycled, each round with fresh random values, so repositories hold several tasks, each with
            its own snapshot folder and trajectories.

    Returns:
        ``(bench, keys)``: the loaded bench and a :class:`FixtureKey` per task, in task order.

    Raises:
        ValueError: ``n_repos`` outside 1..4 or ``n_tasks`` outside 1..1,000.
    """
    rng = random.Random(seed)
    templates = _templates(rng)
    if not 1 <= n_repos <= len(templates):
        raise ValueError(f"n_repos must be 1..{len(templates)}, got {n_repos}")
    if n_tasks is not None and not 1 <= n_tasks <= 1000:
        raise ValueError(f"n_tasks must be 1..1000, got {n_tasks}")
    rng.shuffle(templates)
    chosen = templates[:n_repos] if n_tasks is None else templates[:n_tasks]
    while n_tasks is not None and len(chosen) < n_tasks:  # another round, fresh values
        more = _templates(rng)
        rng.shuffle(more)
        chosen += more[: n_tasks - len(chosen)]
    root = Path(root)
    rows, trajectories, keys = [], [], []
    for i, t in enumerate(chosen):
        instance_id = f"fixtures__{t.name}-{100 + i}"
        folder = t.name if i < len(templates) else f"{t.name}-{i}"
        snap = root / "repos" / folder
        pkg = t.module.split("/")[0]
        files = {t.module: t.source, f"{pkg}/__init__.py": "", "conftest.py": "",
                 "tests/test_core.py": t.visible_tests,
                 "README.md": f"# {t.name}\n\nA tiny fixture repository generated by aml-ray (seed {seed}).\n"}
        for rel, text in files.items():
            (snap / rel).parent.mkdir(parents=True, exist_ok=True)
            (snap / rel).write_text(text, encoding="utf-8")
        relevant, noisy = _trajectories(rng, t, [c for c in templates if c.name != t.name], i)
        trajectories += [relevant, *noisy]
        fixed = t.source.replace(t.bug, t.fix)
        rows.append({
            "instance_id": instance_id, "repo": f"fixtures/{t.name}", "base_commit": f"seed-{seed}",
            "problem_statement": t.problem, "patch": _diff(t.module, t.source, fixed),
            "test_patch": _diff("tests/test_regression.py", "", t.hidden_tests).replace(
                "--- a/tests/test_regression.py", "--- /dev/null"),
            "FAIL_TO_PASS": list(t.f2p), "PASS_TO_PASS": list(t.p2p), "hints_text": "",
            "snapshot": f"repos/{folder}", "relevant_trajectories": [relevant.trajectory_id],
            "noisy_trajectories": [n.trajectory_id for n in noisy], "source": "fixture"})
        keys.append(FixtureKey(
            instance_id=instance_id, module=t.module, clue=t.fix.strip(),
            fix_diff=_diff(t.module, t.source, fixed),
            wrong_diff=_diff(t.module, t.source, t.source.replace(t.bug, t.wrong)),
            breaking_diff=_diff(t.module, t.source, fixed.replace(t.other_old, t.other_new)),
            looping_diff=_diff(t.module, t.source, t.source.replace(t.bug, "    while True:\n        pass")),
            relevant=(relevant.trajectory_id,), noisy=tuple(n.trajectory_id for n in noisy)))
    write_bench(root, name, rows, trajectories)
    return load_bench(root), keys
