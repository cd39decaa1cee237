"""Job-wide tool concurrency (verl's global rate_limit): runners that share one limiter never
hold more than its slots over all of them, a cancelled call gives its slot back, and a worker
on its own is the job."""

from __future__ import annotations

import asyncio

from agentloop import RolloutConfig
from agentloop.parsers import ToolCall
from agentloop.tools import ToolRunner
from agentloop.tools.job_limit import JobLimiter, job_slot
from agentloop.worker import AgentLoopWorker
from tests.unit.agentloop.scripted import ScriptedServer, SleepTool


def sleepy(**config) -> dict:
    return {"sleep": SleepTool(config={"job_max_concurrency": 2, **config})}


async def test_two_runners_sharing_a_limiter_hold_at_most_its_slots():
    limiter = JobLimiter(2)
    runners = [ToolRunner(sleepy(), timeout_s=5) for _ in range(2)]  # two "workers"
    for runner in runners:
        runner.job_limits = {"sleep": limiter}
    calls = [ToolCall("sleep", {"s": 0.05}, "")] * 3
    outcomes = await asyncio.gather(*(r.run(calls, {"sleep": "i"}) for r in runners))
    assert all(o.ok for batch in outcomes for o in batch)
    assert await limiter.stats() == {"limit": 2, "in_flight": 0, "peak": 2, "granted": 6}


async def test_a_call_cancelled_while_it_waits_gives_its_slot_back():
    limiter = JobLimiter(1)
    async with job_slot(limiter):
        waiting = asyncio.ensure_future(_hold(limiter))
        await asyncio.sleep(0.01)
        waiting.cancel()
    await asyncio.sleep(0.01)
    assert (await limiter.stats())["in_flight"] == 0
    async with job_slot(limiter):  # the slot is free again
        pass


async def _hold(limiter: JobLimiter) -> None:
    async with job_slot(limiter):
        await asyncio.sleep(10)


def test_a_worker_alone_limits_its_own_calls(tokenizer):
    worker = AgentLoopWorker(
        RolloutConfig(), ScriptedServer(tokenizer, []), tokenizer, tools=sleepy()
    )
    assert worker.tool_job_limits() == {"sleep": 2}
    runner = worker.context.tool_runner
    assert isinstance(runner.job_limits["sleep"], JobLimiter)
    worker.set_job_limiters({"sleep": "shared"})
    assert runner.job_limits == {"sleep": "shared"}
