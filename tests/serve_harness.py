"""The service on Ray Serve for end-to-end tests: loopback stand-ins for the locked models, a SQLite store, and
a wait until its routes answer (Serve answers 404 until they are ready)."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from cryptography.fernet import Fernet
from pydantic import SecretStr

from aml_ray.config import ModelEndpoint
from aml_ray.serve_app.settings import ServiceSettings
from tests.fake_openai import FakeOpenAI, Reply
from tests.servers import ThreadServer

ADMIN = "admin-token-flow-test-9f8e7d6c5b4a"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(tmp_path: Path, reply: Callable[[str], str], *, ready_s: float = 120, **settings: Any) -> Iterator[str]:
    """The service's base URL, its answer and judge models a local OpenAI-compatible server replying
    ``reply(prompt)`` as ``gpt-4o-mini`` (the suite's locked model), its store ``tmp_path/aml.sqlite3``;
    ``settings`` are the other :class:`ServiceSettings` fields. Shut down (Serve, the model server) on exit."""
    from ray import serve

    from aml_ray.serve_app.deployment import run

    fake = FakeOpenAI(lambda prompt, n: Reply(reply(prompt)))
    http = ThreadServer(fake.app).__enter__()
    models = {role: ModelEndpoint(role=role, base_url=f"{http.base_url}/v1", model="gpt-4o-mini",
                                  api_key=SecretStr("sk-test"), cache_path=None) for role in ("answer", "judge")}
    config = ServiceSettings(database_url=f"sqlite:///{tmp_path / 'aml.sqlite3'}",
                             master_keys=[SecretStr(Fernet.generate_key().decode())], admin_token=SecretStr(ADMIN),
                             allow_loopback=True, runs_dir=tmp_path / "runs", **models, **settings)
    port = free_port()
    try:
        run(config, host="127.0.0.1", port=port)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + ready_s
        while True:
            try:
                if httpx.get(f"{base}/api/leaderboard/textual", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"Serve app not ready within {ready_s:.0f} s"
            time.sleep(0.2)
        yield base
    finally:
        serve.shutdown()
        http.__exit__(None, None, None)
