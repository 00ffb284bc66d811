"""What every ``aml-ray`` command shares: the consoles, the exit codes, ``fail`` and the participant options.

Both :mod:`aml_ray.cli` and :mod:`aml_ray.coding.cli` import these from here, so neither imports the other
back (the cli <-> coding/cli import circle).
"""

from __future__ import annotations

import contextlib
import difflib
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

import typer
from pydantic import SecretStr, ValidationError
from rich.console import Console
from typer.core import TyperGroup

try:  # typer (pinned in pyproject.toml) carries its own click: its parser raises this class
    from typer._click.exceptions import NoSuchOption
except ImportError:  # a typer that uses click itself
    from click.exceptions import NoSuchOption

#: Columns of output to a file, a pipe or a CI log when ``COLUMNS`` does not say: wide enough for the score
#: table (rich would use 80 there).
PIPE_WIDTH = 120


def console_width(stream: TextIO) -> int | None:
    """The width the command line renders at on ``stream``: ``COLUMNS`` when it is set to a positive number
    (the user's width, also when the output is a pipe or a file), else None on a terminal (rich measures
    it), else :data:`PIPE_WIDTH`. Rich itself reads ``COLUMNS`` only when given no width, so a fixed width
    for pipes used to hide it (``COLUMNS=80 aml-ray run ... | tee log`` printed 120-column tables).
    """
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return None if stream.isatty() else PIPE_WIDTH


def make_console(*, stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr) at :func:`console_width`: every table of the command line fits it."""
    return Console(stderr=stderr, width=console_width(sys.stderr if stderr else sys.stdout))


console = make_console()
err = make_console(stderr=True)

REFERENCE_PREFIX = "reference:"
#: Exit codes of ``aml-ray run`` (README, "Exit codes"): the run completed; the run failed (the participant
#: or the contract stopped it, it ended partial, or a bundle of the suite failed); a usage or input error
#: (bad arguments or a bad dataset file, found before anything is created; click's own usage errors are 2 too).
EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE = 0, 1, 2
#: Ctrl-C: 128 + SIGINT, as a shell reports a command a signal ended.
EXIT_INTERRUPTED = 130


def fail(message: str, code: int = EXIT_USAGE) -> None:
    """Print ``error: message`` to stderr and exit with ``code`` (default: a usage or input error)."""
    err.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code)


def close_options(name: str, options: Iterable[str], *, cutoff: float = 0.75) -> list[str]:
    """The long options of ``options`` whose names are like ``name``, best first (at most 3).

    Likeness is difflib's ratio of the names without their dashes (click compares them with the dashes,
    so ``--bogus`` was "like" ``--out``).

    Examples:
        >>> close_options("--dataset-x", ["--data", "--dataset", "--datasets-dir", "--out"])
        ['--dataset', '--datasets-dir']
        >>> close_options("--bogus", ["--out", "--verbose", "--auth"])
        []
    """
    bare = {o.lstrip("-"): o for o in options if o.startswith("--")}
    return [bare[m] for m in difflib.get_close_matches(name.lstrip("-"), list(bare), n=3, cutoff=cutoff)]


def unknown_option_message(name: str, ctx: typer.Context) -> str:
    """``No such option: --bogus. 'aml-ray run --help' lists the options.``, with ``Did you mean --x?`` before
    the help when an option of the command is close (:func:`close_options`)."""
    options = [o for p in ctx.command.get_params(ctx) for o in (*p.opts, *p.secondary_opts)]
    close = close_options(name, options)
    suggest = f" Did you mean {', '.join(close[:-1])} or {close[-1]}?" if len(close) > 1 else (
        f" Did you mean {close[0]}?" if close else "")
    return f"No such option: {name}.{suggest} '{ctx.command_path} --help' lists the options."


class _UnknownOption(NoSuchOption):
    """An unknown option, said by :func:`unknown_option_message`."""


def _said_plainly(exc: NoSuchOption) -> NoSuchOption:
    if isinstance(exc, _UnknownOption) or exc.ctx is None:
        return exc
    return _UnknownOption(exc.option_name, unknown_option_message(exc.option_name, exc.ctx), ctx=exc.ctx)


class CommandGroup(TyperGroup):
    """The ``aml-ray`` group: an unknown option, its own or any subcommand's, names the option, suggests only
    close ones and points at the command's ``--help`` (:func:`unknown_option_message`); click suggested the
    likest options whatever they were (``--bogus``: "Possible options: --out, --verbose")."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        """Parse the group's own options (an unknown one is said plainly)."""
        try:
            return super().parse_args(ctx, args)
        except NoSuchOption as exc:
            raise _said_plainly(exc) from None

    def invoke(self, ctx: typer.Context):
        """Run the subcommand (an unknown option of it, or of a nested group's command, is said plainly)."""
        try:
            return super().invoke(ctx)
        except NoSuchOption as exc:
            raise _said_plainly(exc) from None


def participant_spec(participant: str, add_url, search_url, auth: str, secret_env: str | None,
                     max_in_flight: int, rps: float | None):
    """The participant options, checked before anything is created: ``(label, spec)``, with spec None for
    a reference system, ``reference:bm25`` or a baseline (:data:`aml_ray.reference.baselines.REFERENCE_SYSTEMS`;
    its URLs exist once it runs). Exits 2 naming the option that is wrong."""
    from aml_ray.actors.participant import ParticipantSpec
    from aml_ray.reference.baselines import REFERENCE_SYSTEMS

    secret = None
    if secret_env:
        value = os.environ.get(secret_env)
        if not value:
            fail(f"--secret-env {secret_env}: the environment variable is empty or unset; export it with "
                  "the Memory System Key")
        secret = SecretStr(value)
    if participant.startswith(REFERENCE_PREFIX):
        if participant[len(REFERENCE_PREFIX):] not in REFERENCE_SYSTEMS:
            fail(f"--participant {participant!r}: the reference systems are "
                 f"{', '.join(REFERENCE_PREFIX + n for n in REFERENCE_SYSTEMS)}")
        return participant, None
    base = participant.rstrip("/")
    try:
        spec = ParticipantSpec(add_url=add_url or f"{base}/add", search_url=search_url or f"{base}/search",
                               auth=auth, secret=secret, max_in_flight=max_in_flight, requests_per_s=rps)
    except ValidationError as exc:
        first = exc.errors()[0]
        fail(f"participant: {'.'.join(map(str, first['loc'])) or 'spec'}: {first['msg']}")
    return base, spec


@contextlib.contextmanager
def open_participant(participant: str, add_url, search_url, auth: str, secret_env: str | None, workdir: Path,
                 max_in_flight: int, rps: float | None, multimodal: bool = False, baseline: dict | None = None):
    """The participant to evaluate; ``reference:bm25`` starts the reference system (accepting content
    parts when ``multimodal``: the run's track is the Multimodal one), ``reference:<baseline>`` the reference
    server serving that baseline with ``baseline``'s options (:class:`~aml_ray.reference.server.ReferenceServer`).

    Raises:
        typer.Exit: :data:`EXIT_RUN_FAILED` when the reference system does not start (one line naming its
            log file: :class:`~aml_ray.reference.server.ReferenceStartError`).
    """
    from aml_ray.actors.participant import ParticipantSpec

    label, spec = participant_spec(participant, add_url, search_url, auth, secret_env, max_in_flight, rps)
    if spec is not None:
        yield label, spec
        return
    from aml_ray.reference.server import ReferenceServer, ReferenceStartError

    name = label[len(REFERENCE_PREFIX):]
    server = ReferenceServer(workdir / "reference", multimodal=multimodal,
                             baseline=None if name == "bm25" else {**(baseline or {}), "baseline": name})
    try:
        server.start()
    except ReferenceStartError as exc:
        fail(str(exc), EXIT_RUN_FAILED)
    try:
        yield label, ParticipantSpec(add_url=server.add_url, search_url=server.search_url,
                                     health_url=server.health_url, max_in_flight=max_in_flight, requests_per_s=rps)
    finally:
        server.stop()
