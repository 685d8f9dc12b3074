"""asyncio support of the awaitable-dispatch tests: a bounded ``run`` and a ticker that shows
whether the event loop stayed responsive."""

from __future__ import annotations

import asyncio
import contextlib
import time

__all__ = ["run", "ticking"]


def run(coro, timeout: float = 30):
    """asyncio.run with a bound: a waiter that never wakes fails the test instead of hanging it."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


@contextlib.asynccontextmanager
async def ticking(interval: float = 0.001):
    """A task appending ``time.perf_counter()`` to the yielded list every ``interval`` seconds
    while the block runs (a blocked loop ticks once or twice, a free one every interval)."""
    ticks: list[float] = []

    async def tick():
        while True:
            ticks.append(time.perf_counter())
            await asyncio.sleep(interval)

    task = asyncio.ensure_future(tick())
    try:
        yield ticks
    finally:
        task.cancel()
