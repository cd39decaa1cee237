"""One repository-task sample end to end: a fresh workspace, the agent under its time limit,
then the check under its own limit as the reward, then cleanup.

The agent is any ``async (Workspace) -> T`` (a native loop whose tools use
``current_workspace()``, a harness process run with ``ws.run``). An agent that raises or passes
``agent_timeout_s`` (it is cancelled, and its sandboxed commands killed with it) fails only its
sample: the check still scores what it left in the workspace and ``agent_error`` says what
happened. An agent loop sets ``AgentLoopOutput.reward_score = outcome.score`` (the reward
manager keeps a loop's score as the sample's ``rule`` reward) and puts ``outcome.reward()`` in
its ``extra``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from agentloop.workspace.check import CheckResult
from agentloop.workspace.pool import Workspace, WorkspacePool
from agentloop.workspace.task import WorkspaceTask

__all__ = ["SampleOutcome", "run_workspace_sample"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SampleOutcome:
    """The check's result and what went wrong with the agent, if anything."""

    check: CheckResult
    agent_error: str | None
    prepare_s: float
    warm: bool
    sandbox_errors: int = 0
    """Commands of the sample's copy the sandbox could not start."""

    @property
    def score(self) -> float:
        return self.check.score

    def reward(self) -> dict[str, Any]:
        """The reward dict: the check's fields, ``agent_error`` and the workspace's timing."""
        return {
            **self.check.as_reward(),
            "agent_error": self.agent_error,
            "prepare_s": self.prepare_s,
            "warm": self.warm,
        }


async def run_workspace_sample(
    pool: WorkspacePool,
    task: WorkspaceTask,
    agent: Callable[[Workspace], Awaitable[T]],
    *,
    agent_timeout_s: float,
) -> tuple[T | None, SampleOutcome]:
    """Run ``agent`` in a fresh copy of ``task``'s workspace, then its check; returns the
    agent's value (None if it failed) and the outcome. The copy is gone when this returns."""
    async with pool.sample(task) as ws:
        value: T | None = None
        error: str | None = None
        try:
            value = await asyncio.wait_for(agent(ws), agent_timeout_s)
        except TimeoutError:
            error = f"the agent passed its {agent_timeout_s:g} s limit and was stopped"
        except Exception as e:  # the agent's fault fails its sample only
            error = f"the agent failed: {type(e).__name__}: {e}"
        check = await ws.check()
        return value, SampleOutcome(check, error, ws.prepare_s, ws.warm, ws.sandbox_errors)
