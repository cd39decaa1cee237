"""Job-wide tool concurrency: one limiter per tool shared by every agent-loop worker of a run
(verl's global ``rate_limit``: at most that many calls of the tool in flight over the whole
job, e.g. a sandbox service's quota), where ``max_concurrency`` limits one worker.

The limiter is a small async Ray actor (``JobLimiter``) the ``AgentLoopManager`` starts for
each tool whose config has ``job_max_concurrency`` and hands to its workers; a call holds one
of its slots while it runs (queueing does not count against the call's timeout). A call that
is cancelled while its slot is being granted gives the slot back once granted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

__all__ = ["JobLimiter", "job_slot"]


class JobLimiter:
    """Plain class (``ray.remote`` by the manager): ``limit`` slots, and the most ever held."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._slots = asyncio.Semaphore(limit)
        self.in_flight = 0
        self.peak = 0
        self.granted = 0

    async def acquire(self) -> None:
        await self._slots.acquire()
        self.in_flight += 1
        self.granted += 1
        self.peak = max(self.peak, self.in_flight)

    async def release(self) -> None:
        self.in_flight -= 1
        self._slots.release()

    async def stats(self) -> dict[str, int]:
        return {
            "limit": self.limit,
            "in_flight": self.in_flight,
            "peak": self.peak,
            "granted": self.granted,
        }


@contextlib.asynccontextmanager
async def job_slot(limiter: Any) -> AsyncIterator[None]:
    """Hold one slot of ``limiter`` (a Ray actor handle, or an in-process ``JobLimiter``)."""
    granted = asyncio.ensure_future(_call(limiter, "acquire"))  # outlives our cancellation
    try:
        await asyncio.shield(granted)
    except asyncio.CancelledError:
        granted.add_done_callback(lambda done: _give_back(limiter, done))
        raise
    try:
        yield
    finally:
        await _call(limiter, "release")


async def _call(limiter: Any, method: str) -> None:
    bound = getattr(limiter, method)
    await (bound.remote() if hasattr(bound, "remote") else bound())


def _give_back(limiter: Any, granted: asyncio.Future[None]) -> None:
    """A slot granted to a call cancelled while it waited goes back."""
    if not granted.cancelled() and granted.exception() is None:
        asyncio.ensure_future(_call(limiter, "release"))
