"""The model client actor's start (:class:`aml_ray.actors.model.ModelClient`), in a process of its own as the
Ray actor is: what it has done before its first request arrives."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

CHILD = """
import threading
from aml_ray.actors.model import ModelClient
from aml_ray.config import ModelEndpoint
from aml_ray.models.tokens import encoding_for

def built(tpm):
    ModelClient(ModelEndpoint(role="answer", base_url="http://127.0.0.1:9/v1", model="gpt-4o-mini", tpm=tpm),
                in_actor=True)
    for thread in threading.enumerate():
        if thread.name == "model-client-warm-up":
            thread.join(timeout=60)
    return encoding_for.cache_info().currsize

print(built(None), built(100_000))
"""


def test_the_client_builds_its_tokenizer_before_its_first_request_when_it_counts_tokens():
    """With a tokens/minute limit each request's tokens are counted before it is sent; the actor builds the
    tokenizer as it starts (about 0.5 s of CPU), not on the first request. Without one it counts nothing."""
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["0", "1"]
