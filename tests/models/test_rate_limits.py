"""The model client's token budget (:class:`aml_ray.models.rate_limits.RequestBudget`) on its own: who is
admitted first when requests of different sizes wait for the same tokens, and how refusals widen its margin."""

from __future__ import annotations

import asyncio

import time

from aml_ray.models.rate_limits import MOST_FACTOR, NARROW_AFTER_S, REFUSAL_STEP, WIDEN_EVERY_S, RequestBudget


def test_a_large_request_is_admitted_in_its_turn_while_smaller_ones_keep_arriving():
    """A full bucket (10,000 tokens/s, 1,000 held), a request of 800 tokens waiting, then a request of 200
    tokens every 10 ms behind it: the 800 goes first (it waited first), then the 200s in their order.

    A budget that lets whichever waiter fits take the freed tokens (aiolimiter's own order: smallest
    amount first) admits every 200 before the 800, which waits for the stream of small ones to stop: on
    a suite against a rate-limited answer model, the bundle with the longer prompts sat out the middle of
    the run while the other bundles' shorter prompts were answered."""
    async def main() -> list[str]:
        budget = RequestBudget(None, 600_000 / 0.95, window_s=0.1, headroom=0.05)  # drains 10,000 tokens/s, holds 1,000
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


def test_refusals_widen_the_margin_a_step_a_second_up_to_its_most_and_a_quiet_minute_narrows_it():
    now = [100.0]
    budget = RequestBudget(600, 60_000, clock=lambda: now[0])
    assert budget.factor == 1.0
    for _ in range(5):  # a burst of refusals within a second: one step
        budget.refused()
    assert budget.factor == 1 + REFUSAL_STEP
    now[0] += WIDEN_EVERY_S
    budget.refused()
    assert budget.factor == 1 + 2 * REFUSAL_STEP
    for _ in range(100):
        now[0] += WIDEN_EVERY_S
        budget.refused()
    assert budget.factor == MOST_FACTOR

    async def factors_after_quiet_spells() -> list[float]:
        seen = []
        for quiet in (NARROW_AFTER_S - 1, 1, 0):
            now[0] += quiet
            await budget.acquire(10)
            seen.append(budget.factor)
        return seen

    # refused less than a minute ago; then a minute: a step; then a step a quiet minute, not a request
    assert asyncio.run(factors_after_quiet_spells()) == [MOST_FACTOR, MOST_FACTOR - REFUSAL_STEP,
                                                        MOST_FACTOR - REFUSAL_STEP]


def test_a_widened_margin_admits_fewer_tokens_a_second_by_its_factor():
    """20,000 tokens through a bucket draining 10,000 tokens/s (holding 1,000): about 1.9 s at the declared
    margin, about 1.2 x that once refusals widened it by 20 %."""
    def seconds(refusals: int) -> float:
        now = [0.0]
        budget = RequestBudget(None, 600_000 / 0.95, window_s=0.1, headroom=0.05, clock=lambda: now[0])
        for _ in range(refusals):
            now[0] += WIDEN_EVERY_S
            budget.refused()

        async def main() -> float:
            await budget.acquire(1_000)  # full
            t0 = time.perf_counter()
            for _ in range(100):
                await budget.acquire(200)
            return time.perf_counter() - t0

        return asyncio.run(main())

    plain, widened = seconds(0), seconds(round(0.2 / REFUSAL_STEP))
    assert 1.8 <= plain <= 2.6, plain
    assert 1.12 <= widened / plain <= 1.3, (plain, widened)
