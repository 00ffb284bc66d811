"""DNS pinning (issue 28, item 9): the participant client connects to the address that was validated.

The job runner validates a version's URLs (:func:`aml_ray.security.validate_endpoint_url` resolves each
host once and checks every address) and the participant client must connect to those checked addresses,
never resolving the name again: a second answer (DNS rebinding) could point anywhere. DNS is the outside
edge, so the name's answers are stubbed at ``socket.getaddrinfo``: the first lookup gives 127.0.0.1,
every later one 127.0.0.2. Two real loopback servers listen on the same port at both addresses; the
rogue one must never see a request.
"""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace

import pytest
from aiohttp import web

from aml_ray.actors.participant import ParticipantClient
from aml_ray.conformance.probe import RawHTTP
from aml_ray.contract import SearchRequest
from aml_ray.serve_app.worker import JobWorker
from scripts.loopback_servers import search_reply

HOST = "participant.rebind.test"


def _rebinding_dns(monkeypatch) -> list[str]:
    """Stub ``socket.getaddrinfo`` for :data:`HOST`: 127.0.0.1 first, 127.0.0.2 afterwards; returns the answers given."""
    real = socket.getaddrinfo
    answers: list[str] = []

    def getaddrinfo(host, port, *args, **kwargs):
        if host != HOST:
            return real(host, port, *args, **kwargs)
        addr = "127.0.0.1" if not answers else "127.0.0.2"
        answers.append(addr)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (addr, int(port or 0)))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers


async def _servers(hits: dict[str, list[str]]) -> tuple[list[web.AppRunner], int]:
    """A Search server at 127.0.0.1:P (the checked address) and one at 127.0.0.2:P (the rebinding target)."""
    runners, port = [], 0
    for addr in ("127.0.0.1", "127.0.0.2"):
        async def search(request, addr=addr):
            hits[addr].append(request.headers["Host"])
            return web.json_response(search_reply(await request.json(), 2))

        app = web.Application()
        app.router.add_post("/search", search)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, addr, port)
        await site.start()
        port = port or runner.addresses[0][1]
        runners.append(runner)
    return runners, port


def test_the_participant_client_connects_to_the_validated_address_not_a_rebound_one(monkeypatch):
    answers = _rebinding_dns(monkeypatch)
    hits: dict[str, list[str]] = {"127.0.0.1": [], "127.0.0.2": []}

    async def main() -> dict:
        runners, port = await _servers(hits)
        try:
            base = f"http://{HOST}:{port}"
            version = SimpleNamespace(add_url=f"{base}/add", search_url=f"{base}/search", health_url=None,
                                      add_status_url=None, credential_id=None, auth_scheme="none",
                                      max_in_flight=2, requests_per_s=None, timeout_s=10.0)
            service = SimpleNamespace(settings=SimpleNamespace(allow_loopback=True), box=None)
            spec, _ = JobWorker(service)._participant(None, version)  # the job runner's validation
            validated = list(answers)
            client = ParticipantClient(spec)
            raw = RawHTTP(10.0, 2, pins=spec.pinned_addresses)  # the conformance battery's raw requests
            try:
                out = await client.search(SearchRequest(query="where?", user_id="eval:r:d:s", top_k=2), "q1")
                probe = await raw.request("POST", spec.search_url, {"query": "q", "user_id": "eval:r:d:s", "top_k": 1})
            finally:
                await client.aclose()
                await raw.aclose()
            return {"out": out, "probe": probe.status, "validated": validated, "port": port}
        finally:
            for runner in runners:
                await runner.cleanup()

    got = asyncio.run(main())
    assert got["out"]["status"] == "ok" and len(got["out"]["memories"]) == 2 and got["probe"] == 200
    assert got["validated"][0] == "127.0.0.1"
    assert answers == got["validated"]  # no lookup after validation: the name is never resolved again
    # both requests reached the checked address, with the original name in their Host header; none the rebound one
    assert hits == {"127.0.0.1": [f"{HOST}:{got['port']}"] * 2, "127.0.0.2": []}


def test_pinned_resolver_answers_from_the_pins_only():
    from aml_ray.security import PinnedResolver, pin_map, validate_endpoint_url

    pinned = validate_endpoint_url("http://93.184.215.14/add")  # an IP literal: nothing to pin
    assert pin_map([pinned]) == {}
    resolver = PinnedResolver({"Example.ORG.": ("93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c")})

    async def main():
        v4 = await resolver.resolve("example.org", 443, socket.AF_INET)
        both = await resolver.resolve("EXAMPLE.org", 443, socket.AF_UNSPEC)
        with pytest.raises(OSError, match="was not validated"):
            await resolver.resolve("other.example", 443)
        return v4, both

    v4, both = asyncio.run(main())
    assert [(r["host"], r["port"], r["hostname"]) for r in v4] == [("93.184.215.14", 443, "example.org")]
    assert [r["family"] for r in both] == [socket.AF_INET, socket.AF_INET6]
