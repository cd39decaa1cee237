"""Rewards verified by running tools: a ``verify`` hook per environment or recipe,

    async def verify(sample: RewardSample, tools: ToolBox) -> float | dict

(a plain ``def`` runs in a thread and calls ``tools.run``), loaded from
``reward_model.verify.path/name``. ``tools`` reaches the registered tools of the rollout
(``multi_turn.tool_config_path``) with fresh instances created from the row's
``tools_kwargs`` (the same database, sandbox or fixture the model used), released after the
sample. Samples are verified concurrently, at most ``max_concurrency`` at once, each within
``timeout_s``; a hook that raises or times out scores 0 and is counted.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Mapping
from typing import Any

from agentloop.parsers import ToolCall
from agentloop.tools import BaseTool, CallOutcome, ToolRunner
from trainer.config.reward import VerifyConfig
from trainer.rewards.rules import describe_function, load_reward_function
from trainer.rewards.types import RewardSample

__all__ = ["ToolBox", "VerifyReward"]


class ToolBox:
    """The registered tools, as one sample's verification sees them."""

    def __init__(
        self,
        tools: Mapping[str, BaseTool],
        runner: ToolRunner,
        tools_kwargs: Mapping[str, Any],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.tools = tools
        self._runner = runner
        self._kwargs = tools_kwargs
        self._loop = loop
        self._instances: dict[str, str] = {}
        self.outcomes: list[CallOutcome] = []

    @property
    def names(self) -> list[str]:
        return sorted(self.tools)

    async def call(self, name: str, arguments: dict[str, Any]) -> CallOutcome:
        """Run tool ``name``; a tool error comes back as an outcome with ``ok=False``."""
        if name not in self.tools:
            raise ValueError(
                f"verify called tool {name!r}; registered tools: {', '.join(self.names) or 'none'}"
                " (set actor_rollout_ref.rollout.multi_turn.tool_config_path)"
            )
        if name not in self._instances:
            create = (self._kwargs.get(name) or {}).get("create_kwargs") or {}
            self._instances[name] = await self.tools[name].create(
                f"verify-{uuid.uuid4().hex[:12]}-{name}", **create
            )
        call = ToolCall(name, dict(arguments), raw="")
        (outcome,) = await self._runner.run([call], self._instances)
        self.outcomes.append(outcome)
        return outcome

    def run(self, name: str, arguments: dict[str, Any]) -> CallOutcome:
        """``call`` from a plain (threaded) verify function."""
        return asyncio.run_coroutine_threadsafe(self.call(name, arguments), self._loop).result()

    async def release(self) -> None:
        for name, instance in self._instances.items():
            await self.tools[name].release(instance)
        self._instances.clear()


class VerifyReward:
    name = "verify"
    COUNTERS = ("tool_calls", "tool_errors")

    def __init__(self, config: VerifyConfig, tools: Mapping[str, BaseTool]) -> None:
        self.config = config
        self.fn = load_reward_function(config.path, config.name, "reward_model.verify")
        self.describe = describe_function(config.path, config.name)
        self.tools = tools
        self.runner = ToolRunner(tools, timeout_s=config.timeout_s)
        self._counters = dict.fromkeys(self.COUNTERS, 0.0)

    async def score(self, samples: list[RewardSample]) -> list[Any]:
        self._counters = dict.fromkeys(self.COUNTERS, 0.0)
        slots = asyncio.Semaphore(self.config.max_concurrency)
        return list(await asyncio.gather(*(self._one(s, slots) for s in samples)))

    async def _one(self, sample: RewardSample, slots: asyncio.Semaphore) -> Any:
        async with slots:
            loop = asyncio.get_running_loop()
            kwargs = sample.row.get("tools_kwargs") or sample.extra_info.get("tools_kwargs") or {}
            box = ToolBox(self.tools, self.runner, kwargs, loop)
            try:
                if inspect.iscoroutinefunction(self.fn):
                    work = self.fn(sample, box)
                else:
                    work = asyncio.to_thread(self.fn, sample, box)
                return await asyncio.wait_for(work, self.config.timeout_s)
            except TimeoutError:
                return TimeoutError(f"timed out after {self.config.timeout_s:g} s")
            except Exception as exc:  # noqa: BLE001 - this sample's verification; counted
                return exc
            finally:
                self._counters["tool_calls"] += len(box.outcomes)
                self._counters["tool_errors"] += sum(not o.ok for o in box.outcomes)
                await box.release()

    def metrics(self) -> dict[str, float]:
        return dict(self._counters)

    def close(self) -> None:
        pass
