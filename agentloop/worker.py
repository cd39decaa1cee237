"""``AgentLoopWorker``: runs a chunk of samples, one asyncio task per sample, on one event
loop, so a sample waiting on a tool never holds up another's generation.

Plain class (usable in-process); ``AgentLoopManager`` wraps it with ``ray.remote``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agentloop.base import (
    AgentLoopContext,
    AgentLoopOutput,
    get_agent_loop,
    load_agent_loop_config,
    registered_agent_loops,
)
from agentloop.config import RolloutConfig, from_dict
from agentloop.interactions import UserModel, load_interactions, row_interaction
from agentloop.tokenizer import load_tokenizer
from agentloop.tools import BaseTool, load_tool_config
from agentloop.tools.job_limit import JobLimiter
from agentloop.trace import TraceContext, make_tracer
from agentloop.workspace.config import WorkspaceConfig
from agentloop.workspace.loop_hook import run_loop_in_workspace
from agentloop.workspace.pool import WorkspacePool
from agentloop.workspace.task import task_of_row
from agentloop.workspace.tools import WorkspaceTool

__all__ = ["AgentLoopWorker", "prepare_row", "validate_rows"]

logger = logging.getLogger(__name__)


def prepare_row(row: Mapping[str, Any], default_agent_loop: str) -> dict[str, Any]:
    """The fields a loop receives: ``agent_name`` filled in, and verl's
    ``extra_info.tools_kwargs`` lifted to ``tools_kwargs``."""
    fields = dict(row)
    if not fields.get("agent_name"):
        fields["agent_name"] = default_agent_loop
    extra = fields.get("extra_info")
    if "tools_kwargs" not in fields and isinstance(extra, Mapping) and "tools_kwargs" in extra:
        fields["tools_kwargs"] = extra["tools_kwargs"]
    return fields


def validate_rows(
    rows: list[Mapping[str, Any]],
    tool_names: list[str],
    default_agent_loop: str,
    interaction_names: list[str] | None = None,
) -> None:
    """Start-up checks, so a bad row fails before any generation: a chat prompt, a registered
    ``agent_name``, only configured tools in ``tools_kwargs``, and (with interactions
    configured) a configured interaction named by each row whose loop talks to users."""
    for i, row in enumerate(rows):
        fields = prepare_row(row, default_agent_loop)
        prompt = fields.get("raw_prompt")
        if not isinstance(prompt, list) or not prompt:
            raise ValueError(
                f"row {i} has no 'raw_prompt' (a list of chat messages): give rows a 'prompt' "
                "column of messages and set data.return_raw_chat=True"
            )
        spec = get_agent_loop(str(fields["agent_name"]))
        if interaction_names and spec.cls.talks_to_users:
            try:
                row_interaction(fields, interaction_names)
            except ValueError as exc:
                raise ValueError(f"row {i} {exc}") from None
        if not spec.cls.uses_tools_kwargs:  # gateway agents bring their own tools
            continue
        for name in fields.get("tools_kwargs") or {}:
            if name not in tool_names:
                raise ValueError(
                    f"row {i}: tools_kwargs names tool {name!r}, which is not configured; "
                    f"configured tools: {', '.join(tool_names) or 'none'} "
                    "(actor_rollout_ref.rollout.multi_turn.tool_config_path)"
                )


def toolless_rows(rows: list[Mapping[str, Any]], default_agent_loop: str) -> dict[str, int]:
    """Rows per agent loop that offers the model no tools (``offers_tools`` False), by loop
    name: with tools configured, these rows never use them."""
    counts: dict[str, int] = {}
    for row in rows:
        name = str(row.get("agent_name") or default_agent_loop)
        if get_agent_loop(name).cls.offers_tools is False:
            counts[name] = counts.get(name, 0) + 1
    return counts


class AgentLoopWorker:
    def __init__(
        self,
        config: RolloutConfig | dict[str, Any],
        servers: Any,
        tokenizer: Any,
        *,
        tools: Mapping[str, BaseTool] | None = None,
        user_servers: Any = None,
        user_tokenizer: Any = None,
    ) -> None:
        """``servers``: a list of server handles (wrapped in an ``AsyncLLMServerManager``) or
        a ready generate client. ``tokenizer``: a tokenizer, or a ``TokenizerSource`` or folder to
        load it from. ``tools`` default to ``multi_turn.tool_config_path``.
        ``user_servers``/``user_tokenizer``: the simulated users' model (handles or a client,
        and its tokenizer or folder), given to each interaction that has ``setup``."""
        if isinstance(config, dict):
            config = from_dict(RolloutConfig, config)
        self.config = config
        if config.agent.agent_loop_config_path:
            load_agent_loop_config(config.agent.agent_loop_config_path)
        tokenizer = load_tokenizer(tokenizer)
        if tools is None:
            path = config.multi_turn.tool_config_path
            tools = load_tool_config(path) if path else {}
        if isinstance(servers, Sequence):  # handles; else a ready GenerateClient
            from servers.manager import AsyncLLMServerManager

            servers = AsyncLLMServerManager(
                list(servers), restart_wait_s=config.recovery.restart_wait_s
            )
        mt = config.multi_turn
        interactions = (
            load_interactions(mt.interaction_config_path) if mt.interaction_config_path else {}
        )
        user_model = None
        if user_servers is not None:
            if isinstance(user_servers, Sequence):
                from servers.manager import AsyncLLMServerManager

                user_servers = AsyncLLMServerManager(list(user_servers))
            user_model = UserModel(
                user_servers, load_tokenizer(user_tokenizer), mt.user_model.max_model_len
            )
        for interaction in interactions.values():
            setup = getattr(interaction, "setup", None)
            if callable(setup):
                setup(user_model)
        self.context = AgentLoopContext(
            servers, tokenizer, config, dict(tools), interactions=interactions
        )
        # Alone, the worker is the job; an AgentLoopManager replaces these with limiters
        # shared by all its workers (set_job_limiters).
        runner = self.context.tool_runner
        assert runner is not None
        runner.job_limits = {name: JobLimiter(cap) for name, cap in self.tool_job_limits().items()}
        self.tracer = make_tracer(config.trace, tokenizer)
        self.workspace_config = next(
            (t.workspace for t in self.context.tools.values() if isinstance(t, WorkspaceTool)),
            WorkspaceConfig(),
        )
        """The pool config of rows with a workspace task: the workspace tools' entry's
        ``workspace`` mapping, else the defaults."""
        self._workspaces: WorkspacePool | None = None
        self._workspaces_lock = asyncio.Lock()
        self._traced: dict[tuple[Any, Any], int] = {}  # samples traced per (step, validate)

    async def _workspace_pool(self) -> WorkspacePool:
        """The worker's pool, made at its first workspace sample (in a thread: it sweeps the
        folders crashed runs left)."""
        async with self._workspaces_lock:
            if self._workspaces is None:
                self._workspaces = await asyncio.to_thread(WorkspacePool, self.workspace_config)
            return self._workspaces

    async def close_workspaces(self) -> None:
        """Remove this worker's workspace copies and run folder, and close what its loops
        share (environment servers, the coding CLIs' workspace pools), before it is stopped."""
        if self._workspaces is not None:
            await self._workspaces.close()
            self._workspaces = None
        await self.context.close_resources()

    def flush_traces(self) -> None:
        """Wait until every trace of this worker is in the store (before it is stopped)."""
        if self.tracer is not None:
            self.tracer.flush()

    async def replace_server(self, index: int, server: Any, version: int | None = None) -> None:
        """Use a restarted server at ``index`` holding policy ``version`` (async: runs on the
        loop the turns wait on)."""
        self.context.server.replace_server(index, server, version)

    async def pause(self, abort: bool, keep: bool = False) -> int:
        """Hold new turns; abort the running ones (``abort``), keep them running in their
        engines through the update (``keep``: returns at once) or wait for them. Returns once
        the weights may change; the number aborted (or kept)."""
        pause = getattr(self.context.server, "pause", None)
        return int(await pause(abort=abort, keep=keep)) if pause is not None else 0

    async def resume(self, version: int) -> None:
        """Turns go on under policy ``version`` (aborted ones from their sampled tokens)."""
        resume = getattr(self.context.server, "resume", None)
        if resume is not None:
            resume(version)

    def resumed_turns(self) -> int:
        """Turns aborted for a weight update and continued afterwards (worker's life)."""
        return int(getattr(self.context.server, "resumed_turns", 0))

    def reprefilled_tokens(self) -> int:
        """Context tokens of those continued turns, prefilled again (worker's life)."""
        return int(getattr(self.context.server, "reprefilled_tokens", 0))

    def kept_turns(self) -> int:
        """Turns kept running in their engine through a weight update (worker's life)."""
        return int(getattr(self.context.server, "kept_turns", 0))

    def retried_requests(self) -> int:
        """Turns re-sent to another server because theirs died (over the worker's life)."""
        return int(getattr(self.context.server, "retried_requests", 0))

    def tool_names(self) -> list[str]:
        return sorted(self.context.tools)

    def interaction_names(self) -> list[str]:
        return sorted(self.context.interactions)

    def tool_job_limits(self) -> dict[str, int]:
        """Tools with a job-wide concurrency cap (``config.job_max_concurrency``)."""
        return {
            name: int(tool.config["job_max_concurrency"])
            for name, tool in self.context.tools.items()
            if tool.config.get("job_max_concurrency")
        }

    def set_job_limiters(self, limiters: dict[str, Any]) -> None:
        """Use the job's shared limiters (Ray actor handles, by tool name)."""
        assert self.context.tool_runner is not None
        self.context.tool_runner.job_limits = dict(limiters)

    def agent_loops(self) -> list[str]:
        return registered_agent_loops()

    async def generate_sequences(
        self,
        rows: list[dict[str, Any]],
        sampling_params: dict[str, Any] | None = None,
        trace: TraceContext | None = None,
        offset: int = 0,
    ) -> list[AgentLoopOutput]:
        """Run every row concurrently; outputs in row order. ``trace``: the step these rows
        belong to (traced when ``trace.backend`` is set); ``offset``: the first row's index in
        the whole batch (the traces' ``sample_index``). Without ``sampling_params``, a
        validation batch (``trace.validate``) samples with ``rollout.val_kwargs``."""
        params = sampling_params
        if params is None:
            validate = trace is not None and trace.validate
            params = self.config.sampling_params(validate=validate)
        limit = self.config.trace.max_samples_per_step_per_worker
        traced = len(rows)  # without a trace context nothing is traced at all
        if limit is not None and trace is not None:  # the cap holds over calls (async groups)
            key = (trace.step, trace.validate)
            traced = max(0, min(limit - self._traced.get(key, 0), len(rows)))
            self._traced[key] = self._traced.get(key, 0) + traced
            while len(self._traced) > 16:  # only the last few steps still take samples
                del self._traced[next(iter(self._traced))]
        context = trace if self.tracer is not None else None
        outputs = await asyncio.gather(
            *(
                self._run_one(offset + i, row, params, context if i < traced else None)
                for i, row in enumerate(rows)
            )
        )
        if self.tracer is not None:
            self.tracer.release()
        return list(outputs)

    async def _run_one(
        self,
        index: int,
        row: dict[str, Any],
        params: dict[str, Any],
        trace: TraceContext | None = None,
    ) -> AgentLoopOutput:
        fields = prepare_row(row, self.config.default_agent_loop)
        spec = get_agent_loop(str(fields["agent_name"]))
        loop = spec.cls(self.context, **spec.kwargs)
        if trace is not None and self.tracer is not None:
            loop.trace = self.tracer.start(trace, index, fields, spec.name)
        # Rows are checked at start-up, their relative workspace paths made absolute there.
        task = task_of_row(fields, index, ".") if loop.runs_in_workspace else None
        start = time.perf_counter()
        try:
            if task is None:
                out = await loop.run(dict(params), **fields)
            else:  # a fresh copy of the task's workspace for the whole sample; the check scores
                out = await run_loop_in_workspace(
                    await self._workspace_pool(),
                    task,
                    lambda: loop.run(dict(params), **fields),
                    timeout_s=self.workspace_config.sample_timeout_s,
                )
        except Exception as exc:
            if loop.trace is not None:
                loop.trace.finish(None, exc)
            raise RuntimeError(
                f"agent loop {spec.name!r} failed on sample {index} (uid {fields.get('uid')}): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        out.metrics["total_s"] = time.perf_counter() - start
        if loop.trace is not None:
            out.record.trace_id = loop.trace.finish(out)
        return out
