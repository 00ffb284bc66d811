"""Console rendering of a conformance report: one line per check, then a summary line.

Line format (the retries only when the check needed some, the fix only for ``fail`` and ``warn``)::

    PASS  health           health_url   GET http://.../health without credentials answered 200 in 2 ms
    PASS  top_k            data         top_k=1 -> 1, top_k=3 -> 3 items; ...  [2 retries (1x429, 1x503)]
    FAIL  add_shape        request_id   trailing-space variant: must echo ...  -> fix: echo request_id ...

The summary line ends with the battery's retries (``; 3 retries (3x429)`` or ``; no retries``).

Text from the participant is printed as plain text (never as rich markup).
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from aml_ray.conformance.result import CheckResult
from aml_ray.conformance.retries import describe_retries
from aml_ray.conformance.runner import summary

_STYLE = {"pass": "bold green", "fail": "bold red", "warn": "bold yellow"}


def result_line(r: CheckResult) -> Text:
    """One report line for a result."""
    label = r.outcome.upper() + ("" if r.required else "*")
    line = Text.assemble((f"{label:<6}", _STYLE[r.outcome]), (f"{r.name:<16}", "bold"),
                         (f"{r.field or '-':<22}", "cyan"), " ", r.message)
    if r.retries:
        line.append(f"  [{describe_retries(r.retries_by_status)}]", style="dim")
    if r.outcome != "pass" and r.fix:
        line.append("  -> fix: ", style="bold")
        line.append(r.fix)
    return line


def summary_line(results: list[CheckResult]) -> Text:
    """``11 checks: 10 pass, 1 warn, 0 fail; 2 retries (2x429); every required check passed; exit 0``
    (with the blocking checks when there are some)."""
    s = summary(results)
    text = Text(f"{s['total']} checks: {s['pass']} pass, {s['warn']} warn, {s['fail']} fail; "
                f"{describe_retries(s['retries_by_status'])}")
    if s["blocking"]:
        text.append(f"; required checks failed: {', '.join(s['blocking'])}", style="bold red")
    else:
        text.append("; every required check passed", style="bold green")
    text.append(f"; exit {s['exit_code']}")
    return text


def render(results: list[CheckResult], console: Console) -> None:
    """Print one line per result, then the summary (``*`` marks checks that never block)."""
    for r in results:
        console.print(result_line(r), soft_wrap=True)
    if any(not r.required for r in results):
        console.print(Text("* advisory: never changes the exit code", style="dim"))
    console.print(summary_line(results))
