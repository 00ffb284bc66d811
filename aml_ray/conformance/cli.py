"""``aml-ray check``: the conformance battery against a live Add/Search endpoint (typer command function).

Registered in :mod:`aml_ray.cli` as ``app.command("check")(check_command)``. Heavy imports happen inside
the command, so ``aml-ray --help`` stays fast.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Optional

import typer

# Kept in sync with aml_ray.conformance.runner (not imported here to keep the CLI start fast).
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _usage(message: str) -> None:
    from rich.console import Console

    Console(stderr=True).print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(EXIT_USAGE)


def check_command(
    add_url: Annotated[str, typer.Option(help="Add endpoint (POST).")],
    search_url: Annotated[str, typer.Option(help="Search endpoint (POST).")],
    health_url: Annotated[Optional[str], typer.Option(help="Health endpoint (unauthenticated GET).")] = None,
    auth: Annotated[str, typer.Option(help="none | Token | Bearer | X-Api-Key")] = "none",
    secret_env: Annotated[Optional[str], typer.Option(help="Environment variable holding the Memory System "
                                                      "Key (never pass the key itself).")] = None,
    declared_max_in_flight: Annotated[int, typer.Option(min=1, max=4096, help="Your declared max in-flight "
                                                        "requests; the limits check bursts above it.")] = 8,
    timeout_s: Annotated[float, typer.Option(min=0.1, help="Per-request timeout in seconds.")] = 60.0,
    only: Annotated[Optional[list[str]], typer.Option(help="Run only this check (repeatable).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
) -> None:
    """Check an Add/Search endpoint against the AML contract before you apply (pre-flight).

    Runs, in order: health, auth, add_shape, read_your_write, top_k, isolation, idempotency,
    timestamps, limits (advisory), unknown_user, integrity (advisory). Every request uses fresh user ids
    check:<random>:<check>:..., so real data is never touched; nothing is deleted. Transient statuses
    (429, 503...) are retried as an evaluation retries them; the report says how many retries each check
    needed.

    Exit codes: 0 every required check passed (warnings allowed); 1 a required check failed;
    2 usage error (bad option, unset secret variable).
    """
    from pydantic import SecretStr, ValidationError
    from rich.console import Console

    from aml_ray.actors.participant import ParticipantSpec
    from aml_ray.conformance.probe import CheckOptions, checked_spec
    from aml_ray.conformance.report import render
    from aml_ray.conformance.runner import exit_code, run_checks_sync, summary

    if auth not in ("none", "Token", "Bearer", "X-Api-Key"):
        _usage(f"--auth {auth!r}: use none, Token, Bearer or X-Api-Key")
    secret = None
    if auth != "none":
        if not secret_env:
            _usage(f"--auth {auth} needs --secret-env VAR (the environment variable holding the key)")
        value = os.environ.get(secret_env)
        if not value:
            _usage(f"--secret-env {secret_env}: the environment variable is empty or unset")
        secret = SecretStr(value)
    try:
        spec = ParticipantSpec(add_url=add_url, search_url=search_url, health_url=health_url, auth=auth,
                               secret=secret, max_in_flight=declared_max_in_flight)
    except ValidationError as exc:
        first = exc.errors()[0]
        _usage(f"{'.'.join(map(str, first['loc'])) or 'participant'}: {first['msg']}")
    options = CheckOptions(timeout_s=timeout_s)
    try:
        results = run_checks_sync(spec, options=options, only=only)
    except ValueError as exc:
        _usage(str(exc))
    if json_output:  # the participant as the checks addressed it: the timeout they used (--timeout-s)
        print(json.dumps({"participant": checked_spec(spec, options).describe(),
                          "results": [r.to_dict() for r in results],
                          "summary": summary(results)}, ensure_ascii=False, indent=2))
    else:
        console = Console(width=None if sys.stdout.isatty() else 200, highlight=False)
        console.print(f"aml-ray check: {add_url} / {search_url} (auth {auth}, declared max in flight "
                      f"{declared_max_in_flight})", markup=False)
        render(results, console)
    raise typer.Exit(exit_code(results))
