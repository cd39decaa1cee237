"""ToolRunner limits: worker-wide and per-tool concurrency, timeouts that start when a call
starts (not while it queues), and one runner shared by every sample of a worker."""

from __future__ import annotations

import time

from agentloop import AgentLoopContext, MultiTurnConfig, RolloutConfig
from agentloop.parsers import ToolCall
from agentloop.tools import ToolRunner
from tests.unit.agentloop.scripted import SleepTool


def calls(n: int, seconds: float) -> list[ToolCall]:
    return [ToolCall("sleep", {"s": seconds}, raw="") for _ in range(n)]


async def timed(runner: ToolRunner, n: int, seconds: float) -> tuple[float, list]:
    start = time.perf_counter()
    outcomes = await runner.run(calls(n, seconds), {"sleep": "i"})
    return time.perf_counter() - start, outcomes


async def test_without_limits_calls_overlap():
    elapsed, outcomes = await timed(ToolRunner({"sleep": SleepTool()}, timeout_s=5), 4, 0.2)
    assert elapsed < 0.35 and all(o.ok for o in outcomes)


async def test_global_limit_serialises_calls_and_timeout_ignores_queueing():
    runner = ToolRunner({"sleep": SleepTool()}, timeout_s=0.3, max_concurrency=1)
    elapsed, outcomes = await timed(runner, 3, 0.2)
    assert elapsed >= 0.6
    assert [o.text for o in outcomes] == ["slept"] * 3  # each ran 0.2 s < 0.3 s timeout


async def test_per_tool_limit_from_the_tool_config():
    runner = ToolRunner({"sleep": SleepTool({"max_concurrency": 2})}, timeout_s=5)
    elapsed, _ = await timed(runner, 4, 0.2)
    assert 0.4 <= elapsed < 0.6


def test_context_builds_one_runner_with_the_configured_limit():
    config = RolloutConfig(multi_turn=MultiTurnConfig(max_concurrent_tool_calls=3))
    context = AgentLoopContext(server=None, tokenizer=None, config=config, tools={})
    assert context.tool_runner is not None
    assert context.tool_runner._all is not None and context.tool_runner._all._value == 3
