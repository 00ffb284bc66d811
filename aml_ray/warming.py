"""One-time work (imports, tokenizer tables) started early in a thread of its own, so that the first call
that needs it finds it done: a stage actor's while it waits for its first batch, the model client's while
it waits for its first request, the run's tail while the pipeline runs."""

from __future__ import annotations

import threading
from collections.abc import Callable


def warm_in_background(warm: Callable[[], None], name: str) -> threading.Thread:
    """Run ``warm`` in a daemon thread named ``name``, started now; an error in it is left for the first
    use, which does the same work and raises it there."""
    def run() -> None:
        try:
            warm()
        except Exception:  # noqa: BLE001 - the first use repeats the work and raises
            pass

    thread = threading.Thread(target=run, daemon=True, name=name)
    thread.start()
    return thread
