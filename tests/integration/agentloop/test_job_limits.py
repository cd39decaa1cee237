"""verl's global rate_limit over real Ray: agent-loop workers in two processes run a verl
tool's calls through one shared ``JobLimiter`` actor (what ``AgentLoopManager`` starts for a
tool with ``rate_limit``), and the calls in flight over both never exceed it."""

from __future__ import annotations

import time

import pytest
import ray

from agentloop.tools.job_limit import JobLimiter
from tests.unit.agentloop.scripted import SleepTool

pytestmark = pytest.mark.integration


class Caller:
    """A worker process's tool runner (as an ``AgentLoopWorker`` holds one)."""

    def __init__(self, limiter) -> None:
        from agentloop.tools import ToolRunner

        self.runner = ToolRunner(
            {"sleep": SleepTool(config={"job_max_concurrency": 2})}, timeout_s=30
        )
        self.runner.job_limits = {"sleep": limiter}

    async def calls(self, n: int) -> list[bool]:
        from agentloop.parsers import ToolCall

        outcomes = await self.runner.run([ToolCall("sleep", {"s": 0.3}, "")] * n, {"sleep": "i"})
        return [o.ok for o in outcomes]


def test_calls_of_two_worker_processes_share_one_job_limit(local_ray):
    limiter = ray.remote(JobLimiter).options(num_cpus=0).remote(2)
    callers = [ray.remote(Caller).options(num_cpus=0).remote(limiter) for _ in range(2)]
    start = time.perf_counter()
    results = ray.get([c.calls.remote(4) for c in callers])
    elapsed = time.perf_counter() - start
    assert results == [[True] * 4] * 2
    stats = ray.get(limiter.stats.remote())
    assert stats == {"limit": 2, "in_flight": 0, "peak": 2, "granted": 8}
    assert elapsed >= 4 * 0.3  # 8 calls of 0.3 s, two at a time over both processes
    for handle in [*callers, limiter]:
        ray.kill(handle)
