"""An agent loop's sample inside a workspace: the worker's hook for rows with a workspace task.

``AgentLoopWorker`` runs a row that carries a workspace task (and whose loop has
``runs_in_workspace``) through ``run_loop_in_workspace``: the loop runs inside
``run_workspace_sample``, so ``current_workspace()`` is the sample's fresh copy for the loop and
every tool or agent function it calls (the workspace tools, a LangGraph tool, a gateway agent's
Python function); then the task's check runs and its score becomes ``reward_score``. The check's
fields go to ``extra["workspace"]`` and the sample's workspace timings to its metrics
(``workspace_metrics`` folds them into the step's).
"""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentloop.workspace.pool import Workspace, WorkspacePool
from agentloop.workspace.sample import run_workspace_sample
from agentloop.workspace.task import WorkspaceTask

if TYPE_CHECKING:
    from agentloop.base import AgentLoopOutput

__all__ = ["SAMPLE_METRICS", "WorkspaceAgentError", "run_loop_in_workspace", "workspace_metrics"]

SAMPLE_METRICS = ("prepare_s", "check_s", "check_timeout", "sandbox_errors", "warm")
"""A workspace sample's own metrics (``AgentLoopOutput.metrics["workspace/<name>"]``)."""


class WorkspaceAgentError(RuntimeError):
    """The loop failed or passed ``sample_timeout_s`` in its workspace (the check still ran:
    its outcome is in the message)."""


async def run_loop_in_workspace(
    pool: WorkspacePool,
    task: WorkspaceTask,
    run: Callable[[], Awaitable[AgentLoopOutput]],
    *,
    timeout_s: float,
) -> AgentLoopOutput:
    """``run()`` (the loop's ``run``) in a fresh workspace of ``task``, then the check: the
    output with the check's score as ``reward_score``. A loop that fails raises
    ``WorkspaceAgentError`` (no tokens to train on)."""

    async def agent(_: Workspace) -> AgentLoopOutput:  # the tools find it: current_workspace()
        return await run()

    out, outcome = await run_workspace_sample(pool, task, agent, agent_timeout_s=timeout_s)
    if out is None:
        raise WorkspaceAgentError(f"{outcome.agent_error}; the check then scored {outcome.score:g}")
    check = outcome.check
    for sample in (out, *out.segments):  # a compacted sample's segments share its reward
        sample.reward_score = outcome.score
    out.extra["workspace"] = outcome.reward()
    out.metrics |= {
        "workspace/prepare_s": outcome.prepare_s,
        "workspace/check_s": check.check_s,
        "workspace/check_timeout": float(check.timed_out),
        "workspace/sandbox_errors": float(outcome.sandbox_errors),
        "workspace/warm": float(outcome.warm),
    }
    return out


def workspace_metrics(samples: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """The step's workspace metrics from its samples' ``metrics`` ({} when none ran in a
    workspace): prepare and check time (mean, max), check timeouts and sandbox errors
    (counts), the share of copies taken warm."""
    ran = [m for m in samples if "workspace/check_s" in m]
    if not ran:
        return {}
    out: dict[str, float] = {"workspace/samples": float(len(ran))}
    for name in ("prepare_s", "check_s"):
        values = [m[f"workspace/{name}"] for m in ran]
        out[f"workspace/{name}/mean"] = statistics.fmean(values)
        out[f"workspace/{name}/max"] = max(values)
    out["workspace/check_timeouts"] = sum(m["workspace/check_timeout"] for m in ran)
    out["workspace/sandbox_errors"] = sum(m["workspace/sandbox_errors"] for m in ran)
    out["workspace/warm/frac"] = statistics.fmean(m["workspace/warm"] for m in ran)
    return out
