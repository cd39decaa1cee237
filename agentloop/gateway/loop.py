"""``GatewayAgentLoop``: a dataset row rolled out by an agent written elsewhere.

The agent talks to the session gateway as to any OpenAI endpoint. Three ways to run it, one
per loop entry of the agent-loop YAML (``agent.agent_loop_config_path``)::

    - {name: calc_openai, _target_: agentloop.gateway.GatewayAgentLoop,
       agent: examples.gateway.openai_sdk_agent:agent}       # async def agent(row, llm)
    - {name: calc_cli, _target_: agentloop.gateway.GatewayAgentLoop,
       command: "python my_agent.py"}                         # one process per sample
    - {name: calc_remote, _target_: agentloop.gateway.GatewayAgentLoop, external: true}
    - {name: fix_cc, _target_: agentloop.gateway.GatewayAgentLoop,
       harness: {name: claude-code, timeout_s: 600}}        # a coding CLI per workspace task

A ``harness:`` loop (``claude-code`` or ``codex``, docs/harnesses.md) runs the CLI on the row's
workspace task in the sandbox; the task's check is the reward.

The session's reward is the agent's return value (a number, or a dict with ``reward``), a
``POST /sessions/{sid}/reward``, or else the configured reward function over the sample.
Each segment of the session is one training sample of the row's group, weighing 1/k of the
session (``gateway.segment_weight``). An agent that raises, exits non-zero or runs past
``gateway.agent_timeout_s`` fails its sample only (``gateway.on_agent_error``), and so does a
session that ends with no completed model call (every call refused, e.g. a first prompt over
``rollout.prompt_length``): the reason, with the last call's error, is in the sample's
``extra["agent_error"]`` and its trace; the batch goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from typing import Any

from agentloop.base import AgentLoopBase, AgentLoopContext, AgentLoopOutput, PromptTooLongError
from agentloop.gateway.command import run_command
from agentloop.gateway.endpoint import AgentFailed, LLMEndpoint
from agentloop.gateway.harness import HarnessSpec, resolve_binary, run_harness
from agentloop.gateway.server import Gateway
from agentloop.gateway.session import Segment, Session
from agentloop.records import SampleRecord
from agentloop.tokens import Trajectory, encode_prompt
from servers.user_code import load_object

__all__ = ["AgentFailed", "GatewayAgentLoop", "LLMEndpoint"]

logger = logging.getLogger(__name__)


async def gateway_of(context: AgentLoopContext) -> Gateway:
    """The worker's gateway, started on its event loop by the first session."""
    if context.gateway is None:
        context.gateway = Gateway(context.config.gateway)
    await context.gateway.start()
    return context.gateway


def _reward_of(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, dict):
        if "reward" not in value:
            raise AgentFailed(f"the agent returned a dict without 'reward': {sorted(value)}")
        value = value["reward"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AgentFailed(f"the agent returned {value!r}: return a number, a dict or None")
    return float(value)


class GatewayAgentLoop(AgentLoopBase):
    offers_tools = False  # the agent brings its own tools; the configured ones are not made
    uses_tools_kwargs = False

    def __init__(
        self,
        context: AgentLoopContext,
        *,
        agent: str | Any = None,
        command: str | list[str] | None = None,
        external: bool = False,
        harness: str | dict[str, Any] | None = None,
        **agent_kwargs: Any,
    ) -> None:
        super().__init__(context)
        self.check_config(agent=agent, command=command, external=external, harness=harness)
        self.harness = None if harness is None else HarnessSpec.of(harness)
        if isinstance(agent, str):  # "pkg.module:function" or "pkg.module.function"
            agent = load_object(agent, key="agent", need_callable=True)
        self.agent = agent
        self.runs_in_workspace = agent is not None  # its Python agent calls the workspace tools
        self.session: Session | None = None
        """The sample's session once ``run`` has opened it (its segments, calls, rewards)."""
        self.command = command
        self.external = external
        self.agent_kwargs = agent_kwargs

    @classmethod
    def check_config(cls, **kwargs: Any) -> None:
        """Refuse a bad entry at start-up: not exactly one way to run the agent, or a harness
        whose CLI is not installed (the message gives the install command)."""
        ways = ("agent", "command", "external", "harness")
        chosen = [k for k in ways if kwargs.get(k)]
        if len(chosen) != 1:
            raise ValueError(
                "a gateway agent loop takes exactly one of agent: module:function, command: "
                f"'...', external: true, harness: claude-code|codex; got "
                f"{', '.join(chosen) or 'none'}"
            )
        if kwargs.get("harness"):
            resolve_binary(HarnessSpec.of(kwargs["harness"]))

    async def run(self, sampling_params: dict[str, Any], **row: Any) -> AgentLoopOutput:
        gateway = await gateway_of(self.context)
        session = self.session = Session(self)
        gateway.open(session)
        endpoint = LLMEndpoint(
            gateway.base_url(session), gateway.api_key, gateway.model, session.id
        )
        start = time.perf_counter()
        error: str | None = None
        reward: float | None = None
        try:
            returned = await asyncio.wait_for(
                self._run_agent(gateway, session, endpoint, row),
                timeout=self.config.gateway.agent_timeout_s,
            )
            reward = _reward_of(returned)
        except TimeoutError:
            error = (
                f"the agent ran past actor_rollout_ref.rollout.gateway.agent_timeout_s="
                f"{self.config.gateway.agent_timeout_s}"
            )
        except Exception as exc:  # noqa: BLE001 - the agent's fault fails this sample only
            error = "".join(traceback.format_exception(exc)).strip()
        finally:
            gateway.close(session)
        self.metrics["agent_s"] = time.perf_counter() - start
        if error is None and not _completed(session):
            error = _no_call_error(session)
        if error is None:
            reward = session.reward if reward is None else reward
            if reward is None and session.step_rewards:
                reward = sum(session.step_rewards.values())
            if reward is None and not (row.get("reward_model") or row.get("data_source")):
                error = (
                    f"session {session.id} ended with no reward: return a number from the "
                    f"agent, POST /sessions/{session.id}/reward, or give the row a "
                    "data_source / reward_model for the configured reward function"
                )
        if error is not None:
            logger.warning("gateway agent failed its sample: %s", error.splitlines()[-1])
            return await self._failed(session, row, error)
        return self._outputs(session, reward)

    async def _run_agent(
        self, gateway: Gateway, session: Session, llm: LLMEndpoint, row: dict[str, Any]
    ) -> Any:
        if self.agent is not None:
            return await self.agent(row, llm, **self.agent_kwargs)
        if self.harness is not None:
            resources = self.context.resources
            return await run_harness(self.harness, llm, row, self.config.gateway, resources)
        if self.command is not None:
            await run_command(self.command, llm, row, self.config.gateway, **self.agent_kwargs)
            return None
        done = await gateway.offer(session, row)
        await done  # POST /sessions/{sid}/end
        return None

    # ---- outputs ---------------------------------------------------------------------------
    def _segment_output(
        self, session: Session, seg: Segment, reward: float | None, weight: float
    ) -> AgentLoopOutput:
        traj = seg.traj
        out = self.output(
            traj,
            seg.head + seg.calls + seg.user_turns,
            record=SampleRecord(
                stop_reason=seg.finish_reasons[-1] if seg.finish_reasons else None,
                finish_reasons=list(seg.finish_reasons),
                turn_ends=list(seg.turn_ends),
                turn_states=list(seg.turn_states),
                assistant_turns=seg.calls,
                user_turns=seg.user_turns,
                tool_calls=seg.tool_calls,  # returned to the agent, which runs them
                tool_errors=len(seg.error_kinds),
                tool_error_kinds=list(seg.error_kinds),
                weight=weight,
                session_id=session.id,
                segment=seg.index,
                branch_reason=seg.branch_reason,
                branch_point=seg.branch_point,
                role=seg.role,
            ),
        )
        out.reward_score = reward
        out.extra["gateway_recorded"] = dict(session.recorded)
        out.metrics["gateway_calls"] = float(session.calls)
        out.metrics["gateway_max_tokens_cuts"] = float(session.max_tokens_cuts)
        return out

    def _weight(self, segments: int) -> float:
        """Each segment's weight: 1/k of the session, or 1 (``gateway.segment_weight``)."""
        return self.config.gateway.segment_weight_of(segments)

    def _outputs(self, session: Session, reward: float | None) -> AgentLoopOutput:
        segments = _completed(session)
        weight = self._weight(len(segments))
        outs = [self._segment_output(session, s, reward, weight) for s in segments]
        first, first.segments = outs[0], outs[1:]
        return first

    async def _failed(self, session: Session, row: dict[str, Any], error: str) -> AgentLoopOutput:
        """The failed session's samples: reward 0, or weight 0 (``on_agent_error=drop``). A
        session that made no call gets one sample of its prompt with nothing to train."""
        drop = self.config.gateway.on_agent_error == "drop"
        segments = _completed(session)
        if not segments:
            prompt = await self._row_prompt(row)
            out = self.output(Trajectory(prompt, self.config.response_length), 0)
            out.record.session_id = session.id  # its logs (a harness's transcript) are there
            outs = [out]
        else:
            outs = [self._segment_output(session, s, 0.0, 1.0) for s in segments]
        for out in outs:
            out.extra["gateway_recorded"] = dict(session.recorded)
            out.reward_score = 0.0
            out.record.stop_reason = "agent_error"
            out.record.weight = 0.0 if drop else self._weight(len(outs))
            out.extra["agent_error"] = error
            out.record.error = error
        if self.trace is not None:
            self.trace.agent_error(error)
        first, first.segments = outs[0], outs[1:]
        return first

    async def _row_prompt(self, row: dict[str, Any]) -> list[int]:
        """The row's prompt ids for a session with no completed call; a prompt over
        ``rollout.prompt_length`` (the reason the calls failed, often) keeps its last
        ``prompt_length`` tokens: the sample has nothing to train either way."""
        messages = row.get("raw_prompt") or []
        try:
            return await self.encode_prompt(messages, None)
        except PromptTooLongError:
            kwargs = self.config.chat_template_kwargs
            ids = await asyncio.to_thread(
                encode_prompt, self.tokenizer, messages, chat_template_kwargs=kwargs
            )
            return ids[-self.config.prompt_length :]


def _completed(session: Session) -> list[Segment]:
    """The session's segments that hold a sampled turn (a call refused or failed after its
    segment was opened leaves one with none)."""
    return [s for s in session.segments if s.calls]


def _no_call_error(session: Session) -> str:
    last = f"; the last call was answered: {session.errors[-1]}" if session.errors else ""
    return f"the agent made no completed model call ({len(session.errors)} refused or failed){last}"
