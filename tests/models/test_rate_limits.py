"""The model client's token budget (:class:`aml_ray.models.rate_limits.RequestBudget`) on its own: who is
admitted first when requests of different sizes wait for the same tokens."""

from __future__ import annotations

import asyncio

from aml_ray.models.rate_limits import RequestBudget


def test_a_large_request_is_admitted_in_its_turn_while_smaller_ones_keep_arriving():
    """A full bucket (10,000 tokens/s, 1,000 held), a request of 800 tokens waiting, then a request of 200
    tokens every 10 ms behind it: the 800 goes first (it waited first), then the 200s in their order.

    A budget that lets whichever waiter fits take the freed tokens (aiolimiter's own order: smallest
    amount first) admits every 200 before the 800, which waits for the stream of small ones to stop: on
    a suite against a rate-limited answer model, the bundle with the longer prompts sat out the middle of
    the run while the other bundles' shorter prompts were answered."""
    async def main() -> list[str]:
        budget = RequestBudget(None, 600_000 / 0.95, window_s=0.1)  # drains 10,000 tokens/s, holds 1,000
        await budget.acquire(1_000)  # full
        order: list[str] = []

        async def ask(name: str, tokens: int) -> None:
            await budget.acquire(tokens)
            order.append(name)

        tasks = [asyncio.create_task(ask("large", 800))]
        for i in range(12):
            await asyncio.sleep(0.01)
            tasks.append(asyncio.create_task(ask(f"small {i}", 200)))
        await asyncio.gather(*tasks)
        return order

    order = asyncio.run(main())
    assert order == ["large"] + [f"small {i}" for i in range(12)]
