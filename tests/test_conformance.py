"""The conformance battery (`aml-ray check`): the reference system passes, each broken rule fails one check.

Everything runs on loopback: the reference BM25 system as a subprocess, the misbehaving participant
(``tests/bad_participants.py``) in a thread. No Ray.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from pydantic import SecretStr
from rich.console import Console
from typer.testing import CliRunner

from aml_ray.actors.participant import ParticipantSpec
from aml_ray.cli import app
from aml_ray.conformance import CHECKS, CheckResult, exit_code, run_checks, summary
from aml_ray.conformance.checks import parse_created_at, percentile
from aml_ray.conformance.probe import CheckOptions, Probe, RawReply, Tally
from aml_ray.conformance.report import render
from aml_ray.reference import ReferenceServer
from aml_ray.retry import RetryPolicy
from tests.bad_participants import MODES, BadParticipant

SECRET = "conformance-s3cret-9f2c"
NAMES = ["health", "auth", "add_shape", "read_your_write", "top_k", "isolation", "idempotency", "timestamps",
         "limits", "unknown_user", "integrity"]


def by_name(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {r.name: r for r in results}


def outcomes(results: list[CheckResult]) -> dict[str, str]:
    return {r.name: r.outcome for r in results}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> ReferenceServer:
    with ReferenceServer(tmp_path_factory.mktemp("ref")) as srv:
        yield srv


@pytest.fixture(scope="module")
def reference_bearer(tmp_path_factory) -> ReferenceServer:
    with ReferenceServer(tmp_path_factory.mktemp("ref_bearer"), auth="Bearer", secret=SECRET) as srv:
        yield srv


def ref_spec(srv: ReferenceServer, **kw) -> ParticipantSpec:
    return ParticipantSpec(add_url=srv.add_url, search_url=srv.search_url, health_url=srv.health_url,
                           max_in_flight=8, **kw)


def cli_args(add_url: str, search_url: str, *extra: str) -> list[str]:
    return ["check", "--add-url", add_url, "--search-url", search_url, *extra]


# The reference system -------------------------------------------------------------------------------
async def test_reference_passes_every_required_check(reference):
    results = await run_checks(ref_spec(reference))
    assert [r.name for r in results] == NAMES
    got = by_name(results)
    # No auth declared: that is only a warning (smoke only); everything else passes.
    assert got["auth"].outcome == "warn" and got["auth"].field == "auth"
    assert {n: o for n, o in outcomes(results).items() if n != "auth"} == {n: "pass" for n in NAMES if n != "auth"}
    assert exit_code(results) == 0
    assert summary(results) == {"pass": 10, "fail": 0, "warn": 1, "total": 11, "blocking": [], "exit_code": 0,
                                "retries": 0, "retries_by_status": {}}
    assert all(r.retries == 0 and r.retries_by_status == {} for r in results)
    assert "top_k=1 -> 1, top_k=3 -> 3 items" in got["top_k"].message
    assert "'2024-01-01T00:00:00.000Z'" in got["timestamps"].message
    limits = got["limits"]
    assert limits.required is False and limits.data["burst"] == 16 and limits.data["burst_replies"] == "16x2xx"
    assert limits.data["add_ms"]["p50"] > 0 and limits.data["search_ms"]["p95"] >= limits.data["search_ms"]["p50"]
    integrity = got["integrity"]
    assert integrity.required is False and integrity.field == "data[].content"
    assert integrity.data == {"rules": ["ignore_instructions", "role_marker", "verdict_request", "addresses_model",
                                        "fence_escape"], "returned": True}
    assert "with its fence tag escaped, never dropped" in integrity.message


async def test_reference_with_bearer_passes_auth(reference_bearer):
    results = await run_checks(ref_spec(reference_bearer, auth="Bearer", secret=SecretStr(SECRET)))
    assert outcomes(results) == {n: "pass" for n in NAMES}
    assert by_name(results)["auth"].field == "Authorization"
    assert all(SECRET not in r.message + r.fix for r in results)


async def test_wrong_declared_scheme_fails_auth(reference_bearer):
    results = await run_checks(ref_spec(reference_bearer, auth="Token", secret=SecretStr(SECRET)),
                               only=["auth"])
    (auth,) = results
    assert auth.outcome == "fail" and auth.field == "Authorization"
    assert "the declared key was refused on Add (HTTP 401" in auth.message
    assert "Authorization: Token <key>" in auth.fix


# The misbehaving participant ------------------------------------------------------------------------
async def test_well_behaved_bad_participant_is_a_valid_control():
    with BadParticipant() as bp:
        results = await run_checks(bp.spec())
    assert outcomes(results) == {**{n: "pass" for n in NAMES}, "auth": "warn"}


# (modes, check, outcome, field, words in the message)
BROKEN = [
    (("wrong_echo",), "add_shape", "fail", "request_id", "trailing-space variant: must echo"),
    (("success_string",), "add_shape", "fail", "success", "must be the boolean true, got 'true'"),
    (("top_k_plus_one",), "top_k", "fail", "data", "returned 2 items for top_k=1"),
    (("unstable_ids",), "top_k", "fail", "data[0].id", "two identical Searches"),
    (("score_string",), "top_k", "fail", "data[0].score", "must be a finite number"),
    (("score_increasing",), "top_k", "warn", "data[1].score", "scores rise down the list"),
    (("leak_case",), "isolation", "fail", "user_id", "lower case"),
    (("leak_suffix",), "isolation", "fail", "user_id", "a suffix '-2'"),
    (("no_ryw",), "read_your_write", "fail", "success", "appeared in Search only"),
    (("duplicate_request",), "idempotency", "fail", "request_id", "returned 2 items with the fact (1 after"),
    (("bad_created_at",), "timestamps", "warn", "data[0].created_at", "'sometime last week' does not parse"),
    (("reject_timestamp",), "timestamps", "fail", "messages[].timestamp", "HTTP 422"),
    (("burst_5xx",), "limits", "warn", "status", "x503"),
    (("burst_429_no_retry_after",), "limits", "warn", "Retry-After", "429 without Retry-After"),
    (("unknown_user_500",), "unknown_user", "fail", "status", "HTTP 500"),
    (("unknown_user_404",), "unknown_user", "fail", "status", "HTTP 404"),
    (("health_down",), "health", "fail", "health_url", "answered 503"),
]


@pytest.mark.parametrize("modes,name,outcome,field,words", BROKEN, ids=[b[0][0] for b in BROKEN])
async def test_each_broken_rule_fails_exactly_its_check(modes, name, outcome, field, words):
    with BadParticipant(*modes) as bp:
        results = await run_checks(bp.spec())
    got = by_name(results)[name]
    assert (got.outcome, got.field) == (outcome, field), got
    assert words in got.message, got.message
    assert got.fix
    others = {n: o for n, o in outcomes(results).items() if n != name}
    assert others == {n: ("warn" if n == "auth" else "pass") for n in NAMES if n != name}
    assert exit_code(results) == (1 if outcome == "fail" and name != "limits" else 0)


async def test_ignoring_user_id_fails_isolation_and_unknown_user():
    # A Search that ignores user_id breaks both rules: the canary leaks, and a user that stored nothing
    # gets other users' memories (the unknown-user query shares the word "new" with a stored fact).
    with BadParticipant("leak_all") as bp:
        results = await run_checks(bp.spec())
    got = by_name(results)
    assert (got["isolation"].outcome, got["isolation"].field) == ("fail", "user_id")
    for label in ("an unrelated user_id", "a suffix '-2'", "a trailing space", "the last character dropped",
                  "lower case", "upper case"):
        assert label in got["isolation"].message
    assert (got["unknown_user"].outcome, got["unknown_user"].field) == ("fail", "user_id")
    assert got["unknown_user"].message == "Search for a never-used user_id returned 1 items"
    rest = {n: o for n, o in outcomes(results).items() if n not in ("isolation", "unknown_user")}
    expected = {n: ("warn" if n == "auth" else "pass") for n in NAMES}
    assert rest == {n: o for n, o in expected.items() if n not in ("isolation", "unknown_user")}


def test_every_mode_is_covered():
    covered = {m for modes, *_ in BROKEN for m in modes} | {"burst_429", "accept_any_secret", "leak_all",
                                                            "flaky_429", "flaky_503"}
    # the run-time contract stops, tested against the run's client in tests/test_participant_client.py
    covered |= {"wrong_echo_second_add", "success_false_second_add", "forbid_second_add", "overflow_one_search"}
    # contract-abiding participants for the judge panel's board and the integrity canaries
    # (tests/run/test_panel.py, tests/run/test_injection.py)
    covered |= {"forgetful", "inject_memory", "drop_injection"}
    # a participant whose LoCoMo bundle leaks, beside bundles that complete (tests/run/test_suite_run.py)
    covered |= {"leak_locomo"}
    assert covered == set(MODES)


async def test_a_system_that_drops_the_integrity_canary_gets_a_warning_not_a_failure():
    with BadParticipant("drop_injection") as bp:
        (integrity,) = await run_checks(bp.spec(), options=CheckOptions(visibility_timeout_s=0.5),
                                        only=["integrity"])
    assert (integrity.outcome, integrity.field, integrity.required) == ("warn", "data", False)
    assert integrity.message.startswith("the memory addressed to the model was never returned for its user_id")
    assert integrity.data == {"rules": [], "returned": False} and exit_code([integrity]) == 0


async def test_throttling_with_retry_after_passes_limits():
    with BadParticipant("burst_429") as bp:
        (limits,) = await run_checks(bp.spec(), only=["limits"])
    assert limits.outcome == "pass" and limits.data["burst"] == 8
    assert "4x429 with Retry-After" in limits.message and "4x2xx" in limits.message
    assert limits.retries == 0  # the burst above capacity is sent once: its 429s are what it measures


# Transient refusals (429/503): retried as the run retries them, counted, never a failure ---------------
SHORT_BACKOFF = CheckOptions(retry=RetryPolicy(max_attempts=3, backoff_base_s=0.01, backoff_max_s=0.05))


@pytest.mark.parametrize("mode,status", [("flaky_429", "429"), ("flaky_503", "503")])
async def test_transient_refusals_are_retried_and_counted_per_check(mode, status):
    with BadParticipant(mode, auth="Bearer", secret=SECRET) as bp:
        results = await run_checks(bp.spec(), options=SHORT_BACKOFF)
        refused = sum(bp.refused.values())
    assert outcomes(results) == {n: "pass" for n in NAMES}, [r for r in results if r.outcome != "pass"]
    assert exit_code(results) == 0
    assert refused > 0
    # every refusal was retried once (a retry resends the same bytes, which this server serves)
    assert sum(r.retries for r in results) == refused
    for r in results:
        assert r.retries == sum(r.retries_by_status.values())
        assert set(r.retries_by_status) <= {status}
    s = summary(results)
    assert s["retries"] == refused and s["retries_by_status"] == {status: refused}
    assert by_name(results)["limits"].data["burst_replies"] == "8x2xx"  # the burst itself is never retried


async def test_a_request_given_up_on_counts_its_retries_not_its_last_failure():
    with BadParticipant("unknown_user_500") as bp:
        (unknown,) = await run_checks(bp.spec(), options=SHORT_BACKOFF, only=["unknown_user"])
    assert (unknown.outcome, unknown.field) == ("fail", "status")  # 500 every time: retried, then a failure
    assert "gave up after 3 attempts: HTTP 500" in unknown.message
    assert (unknown.retries, unknown.retries_by_status) == (2, {"500": 2})


def test_cli_passes_a_participant_that_refuses_transiently_and_reports_its_retries():
    runner = CliRunner()
    with BadParticipant("flaky_429", auth="Bearer", secret=SECRET) as bp:
        args = cli_args(bp.base_url + "/add", bp.base_url + "/search", "--health-url", bp.base_url + "/health",
                        "--auth", "Bearer", "--secret-env", "AML_CHECK_KEY", "--declared-max-in-flight", "4")
        res = runner.invoke(app, args, env={"AML_CHECK_KEY": SECRET})
        refused_text = bp.refused[429]
        res_json = runner.invoke(app, [*args, "--json"], env={"AML_CHECK_KEY": SECRET})
        refused_json = bp.refused[429] - refused_text
    assert res.exit_code == 0, res.output
    assert refused_text > 0
    lines = res.output.splitlines()
    assert lines[-1] == (f"11 checks: 11 pass, 0 warn, 0 fail; {refused_text} retries ({refused_text}x429); "
                         "every required check passed; exit 0")
    retried = [line for line in lines if line.endswith("x429)]")]
    assert retried and all(line.startswith("PASS") for line in retried)
    assert sum(int(line.rsplit("[", 1)[1].split()[0]) for line in retried) == refused_text
    assert res_json.exit_code == 0, res_json.output
    doc = json.loads(res_json.output)
    assert doc["summary"]["retries"] == refused_json > 0
    assert doc["summary"]["retries_by_status"] == {"429": refused_json}
    assert sum(r["retries"] for r in doc["results"]) == refused_json
    assert all(r["outcome"] == "pass" for r in doc["results"])


@pytest.mark.parametrize("scheme", ["Token", "X-Api-Key"])
async def test_other_schemes_pass_auth(scheme):
    with BadParticipant(auth=scheme, secret=SECRET) as bp:
        (auth,) = await run_checks(bp.spec(), only=["auth"])
    assert (auth.outcome, auth.field) == ("pass", "X-Api-Key" if scheme == "X-Api-Key" else "Authorization")
    assert auth.message.startswith(f"{scheme} key accepted on Add and Search; wrong key refused")


async def test_key_that_is_never_compared_fails_auth():
    with BadParticipant("accept_any_secret", auth="Bearer", secret=SECRET) as bp:
        results = await run_checks(bp.spec())
    got = by_name(results)["auth"]
    assert (got.outcome, got.field) == ("fail", "Authorization")
    assert "an Add with a wrong key was accepted (HTTP 200)" in got.message
    assert "a Search with a wrong key was accepted (HTTP 200)" in got.message
    assert {n: o for n, o in outcomes(results).items() if n != "auth"} == {n: "pass" for n in NAMES if n != "auth"}


async def test_check_user_ids_are_fresh_and_never_a_prefix_of_one_another():
    probe = Probe(ParticipantSpec(add_url="http://127.0.0.1:9/add", search_url="http://127.0.0.1:9/search"),
                  CheckOptions())
    ids = [probe.user("isolation", "Ana-") for _ in range(200)]
    await probe.aclose()
    assert len(set(ids)) == 200
    assert all(i.startswith(f"check:{probe.run}:isolation:Ana-") and len(i) == len(ids[0]) for i in ids)
    assert not any(a != b and b.startswith(a) for a in ids for b in ids)


# Command line ---------------------------------------------------------------------------------------
def test_cli_passes_against_reference_with_bearer_and_never_prints_the_secret(reference_bearer):
    runner = CliRunner()
    args = cli_args(reference_bearer.add_url, reference_bearer.search_url, "--health-url",
                    reference_bearer.health_url, "--auth", "Bearer", "--secret-env", "AML_CHECK_KEY")
    res = runner.invoke(app, args, env={"AML_CHECK_KEY": SECRET})
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    for name in NAMES:
        assert sum(line.split()[1:2] == [name] for line in lines) == 1, name
    assert lines[-1] == "11 checks: 11 pass, 0 warn, 0 fail; no retries; every required check passed; exit 0"
    assert SECRET not in res.output
    res_json = runner.invoke(app, [*args, "--json"], env={"AML_CHECK_KEY": SECRET})
    assert res_json.exit_code == 0 and SECRET not in res_json.output
    doc = json.loads(res_json.output)
    assert doc["summary"]["exit_code"] == 0 and [r["name"] for r in doc["results"]] == NAMES
    assert doc["participant"]["auth"] == "Bearer" and "secret" not in doc["participant"]


def test_cli_json_reports_the_timeout_the_checks_used(reference):
    """``--json`` describes the participant as the battery addressed it: the per-request timeout is the
    ``--timeout-s`` given (else the check's default of 60 s), never the evaluation's 1,800 s."""
    args = cli_args(reference.add_url, reference.search_url, "--health-url", reference.health_url,
                    "--only", "health", "--only", "add_shape", "--json")
    given = CliRunner().invoke(app, [*args, "--timeout-s", "5"])
    default = CliRunner().invoke(app, args)
    assert given.exit_code == 0 and default.exit_code == 0, (given.output, default.output)
    assert json.loads(given.output)["participant"]["timeout_s"] == 5.0
    assert json.loads(default.output)["participant"]["timeout_s"] == CheckOptions().timeout_s == 60.0


def test_cli_exit_1_names_field_and_fix_and_redacts_a_secret_echoed_by_the_participant():
    with BadParticipant("unknown_user_404", "success_string", auth="Bearer", secret=SECRET) as bp:
        res = CliRunner().invoke(app, cli_args(bp.base_url + "/add", bp.base_url + "/search", "--auth",
                                               "Bearer", "--secret-env", "AML_CHECK_KEY"),
                                 env={"AML_CHECK_KEY": SECRET})
    assert res.exit_code == 1, res.output
    add_line = next(line for line in res.output.splitlines() if line.split()[1:2] == ["add_shape"])
    assert add_line.startswith("FAIL") and " success " in add_line
    assert "-> fix: return the JSON boolean true" in add_line
    unknown = next(line for line in res.output.splitlines() if line.split()[1:2] == ["unknown_user"])
    assert "HTTP 404" in unknown and "Bearer ***" in unknown  # the participant echoed the header; redacted
    assert SECRET not in res.output
    assert res.output.splitlines()[-1].endswith("required checks failed: add_shape, unknown_user; exit 1")


@pytest.mark.parametrize("extra,env,words", [
    (["--auth", "Bearer"], {}, "needs --secret-env"),
    (["--auth", "Bearer", "--secret-env", "AML_CHECK_UNSET"], {"AML_CHECK_UNSET": ""}, "empty or unset"),
    (["--auth", "Basic"], {}, "use none, Token, Bearer or X-Api-Key"),
    (["--only", "nope"], {}, "unknown check(s) ['nope']"),
])
def test_cli_usage_errors_exit_2(extra, env, words):
    res = CliRunner().invoke(app, cli_args("http://127.0.0.1:9/add", "http://127.0.0.1:9/search", *extra), env=env)
    assert res.exit_code == 2
    assert words in res.output


def test_cli_unreachable_endpoint_fails_with_exit_1():
    with socket.socket() as s:  # a port that was free a moment ago: connections are refused
        s.bind(("127.0.0.1", 0))
        base = f"http://127.0.0.1:{s.getsockname()[1]}"
    res = CliRunner().invoke(app, cli_args(base + "/add", base + "/search", "--health-url", base + "/health",
                                           "--only", "health", "--only", "add_shape", "--timeout-s", "2"))
    assert res.exit_code == 1, res.output
    lines = res.output.splitlines()
    # httpx-aiohttp names a refused connection ConnectTimeout; the health line adds the real message.
    port = base.rsplit(":", 1)[1]
    assert lines[1].startswith("FAIL  health") and f"Cannot connect to host 127.0.0.1:{port}" in lines[1]
    assert lines[2].startswith("FAIL  add_shape")
    assert "the Add was not accepted: gave up after 3 attempts" in lines[2]


# Pieces ---------------------------------------------------------------------------------------------
def test_battery_order_and_required_flags():
    assert [c.name for c in CHECKS] == NAMES
    assert [c.name for c in CHECKS if not c.required] == ["limits", "integrity"]
    assert all(c.sends and c.fn.__doc__ and "Source: AML seed" in c.fn.__doc__ for c in CHECKS)


@pytest.mark.parametrize("value,ok", [
    ("2024-01-01T00:00:00Z", True), ("2024-01-01T00:00:00.000+02:00", True), ("2024-01-01", True),
    (1704067200, True), (1704067200000, True), ("1704067200000", True), ("sometime last week", False),
    (True, False), (42, False), (float("nan"), False), ("", False),
])
def test_parse_created_at(value, ok):
    assert (parse_created_at(value) is not None) is ok


def test_percentile_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([30.0, 10.0, 20.0], 50) == 20.0
    assert percentile([float(i) for i in range(1, 21)], 95) == 19.0
    assert percentile([5.0], 95) == 5.0


def test_tally_describes_burst_replies():
    t = Tally()
    for r in [RawReply(200), RawReply(200), RawReply(429, retry_after="1"), RawReply(429), RawReply(503),
              RawReply(None, error="ReadTimeout"), RawReply(400)]:
        t.count(r)
    assert t.describe() == ("2x2xx, 1x429 with Retry-After, 1x429 without Retry-After, 1x400, 1x503, "
                            "1 dropped (ReadTimeout)")


def test_exit_code_ignores_warnings_and_advisory_failures():
    ok = CheckResult("a", "pass", "f", "m")
    assert exit_code([ok, CheckResult("b", "warn", "f", "m", "fix")]) == 0
    assert exit_code([ok, CheckResult("limits", "fail", "f", "m", "fix", required=False)]) == 0
    assert exit_code([ok, CheckResult("c", "fail", "f", "m", "fix")]) == 1
    with pytest.raises(ValueError, match="outcome must be one of"):
        CheckResult("x", "ok", "f", "m")  # type: ignore[arg-type]


def test_report_prints_markup_like_text_verbatim(tmp_path: Path):
    console = Console(file=(tmp_path / "out.txt").open("w"), width=300, color_system=None)
    render([CheckResult("top_k", "fail", "data[3].score", "got [bold]x[/bold]", "return a number")], console)
    console.file.close()
    text = (tmp_path / "out.txt").read_text().splitlines()
    assert text[0].split() == ["FAIL", "top_k", "data[3].score", "got", "[bold]x[/bold]", "->", "fix:",
                               "return", "a", "number"]
    assert text[-1] == "1 checks: 0 pass, 0 warn, 1 fail; no retries; required checks failed: top_k; exit 1"
