"""In-flight weight updates on a vLLM engine: new weights load between two decode steps
while the running requests stay in the engine, with no abort and no re-prefill.

``InFlight.loading()`` wraps a weight load: it pauses the scheduler in vLLM's ``keep`` mode
(the running requests are frozen where they are; the pause returns once the engine's outputs
so far have reached this process), records how many tokens each running generate call has
sampled so far, lets the load run, then either keeps the KV cache as it is or (with
``recompute_kv``) preempts the running requests so their context is recomputed under the new
weights, and resumes. Each generate call returns those counts (``TokenOutput.weight_swaps``):
the tokens before the first count were sampled by the weights it started with, the next ones
by the first update's, and so on; the caller, who knows the versions, stamps them.

Without a running request a load is a plain load plus a prefix-cache reset, as before.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

__all__ = ["InFlight"]

logger = logging.getLogger(__name__)


class InFlight:
    """The generate calls running on one engine and the weight loads they lived through."""

    def __init__(self, *, recompute_kv: bool = False) -> None:
        self.recompute_kv = recompute_kv
        self.live: dict[str, list[int]] = {}
        """Request id -> tokens it had sampled at each weight load during it."""
        self.kept = 0
        """Requests kept running through a load (over the engine's life)."""

    def start(self, request_id: str) -> list[int]:
        """Register a generate call; returns the list its weight swaps go into."""
        swaps: list[int] = []
        self.live[request_id] = swaps
        return swaps

    def end(self, request_id: str) -> None:
        self.live.pop(request_id, None)

    @asynccontextmanager
    async def loading(self, engine: Any) -> AsyncIterator[None]:
        """Around a weight load: pause with the running requests kept, count their tokens,
        load, invalidate (or recompute) the KV cache, resume."""
        if not self.live:
            yield
            await engine.reset_prefix_cache()
            return
        await engine.pause_generation(mode="keep", clear_cache=False)
        try:
            for request_id, swaps in self.live.items():
                swaps.append(sampled_so_far(engine, request_id))
            self.kept += len(self.live)
            yield
            # recompute: the kept requests are preempted and prefill again on the new weights;
            # keep: their KV stays (the cache of finished ones is freed once they end)
            await engine.reset_prefix_cache(reset_running_requests=self.recompute_kv)
        finally:
            await engine.resume_generation()


def sampled_so_far(engine: Any, request_id: str) -> int:
    """Tokens request ``request_id`` has sampled, as this process has received them (after a
    ``keep`` pause: every token the engine sampled). 0 before the engine knows it."""
    outputs = engine.output_processor
    internal = outputs.external_req_ids.get(request_id) or []
    state = outputs.request_states.get(internal[0]) if internal else None
    if state is None or state.detokenizer is None:
        return 0
    return int(state.detokenizer.num_output_tokens())
