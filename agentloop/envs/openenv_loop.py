"""``OpenEnvAgentLoop``: a dataset row played against an OpenEnv environment server.

An agent-loop entry names the environment (``openenv:``, ``OpenEnvSpec``)::

    - {name: grid, _target_: agentloop.envs.OpenEnvAgentLoop,
       openenv: {command: "python -m examples.openenv.grid_env.server --port {port}",
                 servers: 2, client: examples.openenv.grid_env.client:GridEnv, max_steps: 12}}

Per sample, over one WebSocket session of the least busy server: ``reset`` (the row's
``openenv.reset`` kwargs, else ``seed`` = the row's index) -> the observation as a user message
after the row's prompt -> a policy turn -> its action (``action: tool``: the environment's action
schema offered as one tool, the call's arguments are the action; or ``action: pkg.mod:function``,
``fn(text) -> dict | None`` over the turn's text) -> ``step`` -> the next observation as the
tool's answer (or a user message), until ``done``, ``max_steps``, a turn with no action (tool
mode), or the response budget. Observation tokens are template deltas with mask 0.

Rewards: each step's reward is its turn's score (``SampleRecord.turn_scores``: the credit
estimators read them per turn; GRPO's return is their sum); the outcome score is 0. Each turn's
state is a hash of the observation it acted on (GiGPO anchors). An action the model cannot
form, or the environment rejects, is answered with the reason as the observation and counted as a
tool error (``bad_action`` / ``env_rejected``); the episode goes on. A server that dies fails its
samples alone (weight 0, ``env_error``) and is restarted.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

from agentloop.base import AgentLoopBase, AgentLoopContext, AgentLoopOutput
from agentloop.envs.openenv_client import EnvConnection, EnvStep, OpenEnvSpec, connect
from agentloop.envs.openenv_servers import OpenEnvServerError, OpenEnvServers
from agentloop.parsers import check_calls
from agentloop.records import SampleRecord, ToolCallRecord
from agentloop.tokens import Trajectory

__all__ = ["OpenEnvAgentLoop"]

logger = logging.getLogger(__name__)


class OpenEnvAgentLoop(AgentLoopBase):
    offers_tools = False  # the environment's action is the only tool
    uses_tools_kwargs = False
    sets_reward = True  # step rewards

    def __init__(self, context: AgentLoopContext, *, openenv: dict[str, Any]) -> None:
        super().__init__(context)
        self.spec = OpenEnvSpec.of(openenv)
        self.schemas: list[dict[str, Any]] = []

    @classmethod
    def check_config(cls, **kwargs: Any) -> None:
        if "openenv" not in kwargs:
            raise ValueError("an OpenEnv loop needs openenv: {url | command, ...}")
        OpenEnvSpec.of(kwargs["openenv"])

    @classmethod
    def probe(cls, **kwargs: Any) -> None:
        """Start-up: the server answers its health check (a command's is started once and
        stopped; the error names the URL and the end of the server's log)."""
        OpenEnvSpec.of(kwargs["openenv"]).probe()

    async def _servers(self) -> OpenEnvServers:
        key = f"openenv:{self.spec.key}"
        servers = self.context.resources.get(key)
        if servers is None:
            servers = self.context.resources[key] = self.spec.servers_pool()
        await servers.start()
        return servers

    async def run(
        self, sampling_params: dict[str, Any], *, raw_prompt: list[dict[str, Any]], **row: Any
    ) -> AgentLoopOutput:
        servers = await self._servers()
        server = servers.acquire()
        episode = _Episode()
        conn: EnvConnection | None = None
        error: str | None = None
        traj: Trajectory | None = None
        try:
            if self.spec.action == "tool":  # the action schema, read once per worker
                if servers.action_tool is None:
                    servers.action_tool = await self.spec.action_tool(server.url)
                self.schemas = [servers.action_tool]
            conn = await connect(self.spec, server.url)
            first = await conn.reset(self.spec.reset_kwargs(row))
            if first.error is not None:  # e.g. CAPACITY_REACHED, or the env's reset raised
                raise OpenEnvServerError(f"reset was refused: {first.error}")
            traj = await self._play(conn, first, raw_prompt, sampling_params, episode)
        except (OSError, ConnectionError, TimeoutError, OpenEnvServerError) as exc:
            error = f"the OpenEnv server at {server.url} failed: {type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001 - websockets' ConnectionClosed and the like
            if not _is_disconnect(exc):
                raise
            error = f"the OpenEnv server at {server.url} closed the session: {exc}"
        finally:
            if conn is not None:
                await conn.close()
            servers.release(server)
        if error is not None:
            restarted = await servers.recover(server)
            return await self._failed(raw_prompt, traj, episode, error, restarted)
        assert traj is not None
        return self._output(traj, episode)

    async def _play(
        self,
        conn: EnvConnection,
        first: EnvStep,
        prompt: list[dict[str, Any]],
        sampling_params: dict[str, Any],
        ep: _Episode,
    ) -> Trajectory:
        observation = self.spec.render(first.observation)
        messages = [*prompt, {"role": "user", "content": observation}]
        head = len(messages)
        traj = Trajectory(
            await self.encode_prompt(messages, self.schemas), self.config.response_length
        )
        params = self.with_end_tokens(sampling_params)
        fmt = self.chat_format
        parser = fmt.new_parser(repair=self.config.multi_turn.repair_tool_calls, schemas=None)
        tools = {s["function"]["name"]: s for s in self.schemas}
        session_id = conn.session_id
        while True:
            out = await self.generate(session_id, traj, params)
            ep.turn(len(traj) - 1, out.finish_reason, observation)
            if not self.turn_closed(out):
                ep.stop = out.finish_reason if out.finish_reason != "stop" else "stop_token"
                return traj
            text = self.tokenizer.decode(out.token_ids[:-1], skip_special_tokens=False)
            parsed = check_calls(parser.parse(text), tools) if self.schemas else None
            action, problem, kind = self.spec.action_of(text, parsed)
            if action is None and problem is None:
                ep.stop = "no_action"
                return traj
            if problem is None:
                assert action is not None
                problem = await self._step(conn, action, ep)
                if problem is None:
                    observation = self.spec.render(ep.last.observation)
            else:
                ep.errors.append(kind)
            if problem is not None:
                observation = problem
            if self.trace is not None:
                self.trace.environment(
                    "openenv.step",
                    {"action": action, "reward": ep.scores[-1], "observation": observation[:500]},
                    {"done": ep.done, "error": problem or ""},
                )
            if ep.done:
                return traj
            if len(ep.ends) >= self.spec.max_steps:
                ep.stop = "max_steps"
                return traj
            assistant = (
                fmt.assistant_message(text, parsed)
                if parsed
                else {"role": "assistant", "content": text}
            )
            messages.append(assistant)
            answer = self._answer(observation, parsed, assistant)
            delta = await self.encode_delta(
                messages, answer, self.schemas, head=head, sampled_end=out.token_ids[-1]
            )
            messages.extend(answer)
            if not traj.add_template(delta):
                ep.stop = "length"
                return traj
            ep.observations += 1

    async def _step(self, conn: EnvConnection, action: dict[str, Any], ep: _Episode) -> str | None:
        """Send the action; record it as a call of the turn (with its step reward). Returns
        why the environment rejected it, or None."""
        start = time.perf_counter()
        reply = ep.last = await conn.step(action)
        seconds = time.perf_counter() - start
        self.metrics["tool_s"] += seconds
        ok = reply.error is None
        if ok:
            ep.scores[-1] = float(reply.reward or 0.0)
            if reply.done:
                ep.stop, ep.done = "done", True
        else:
            ep.errors.append("env_rejected")
        ep.calls.append(
            ToolCallRecord(
                name=self.spec.tool_name,
                arguments=action,
                ok=ok,
                seconds=seconds,
                repaired=False,
                reward=ep.scores[-1] if ok else None,
                turn=len(ep.ends) - 1,
            )
        )
        return None if ok else f"the environment rejected the action: {reply.error}"

    def _answer(
        self, observation: str, parsed: Any, assistant: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """The observation as the answer to the action: a tool message for each call of the
        turn (the first is the action; others are told so), else a user message."""
        if not parsed or not parsed.items:
            return [{"role": "user", "content": observation}]
        fmt = self.chat_format
        return [
            fmt.tool_message(
                observation if i == 0 else "only the first call of a turn is taken as the action",
                item,
                i,
                assistant,
            )
            for i, item in enumerate(parsed.items)
        ]

    def _record(self, ep: _Episode) -> SampleRecord:
        return SampleRecord(
            stop_reason=ep.stop,
            finish_reasons=list(ep.finish_reasons),
            turn_ends=list(ep.ends),
            assistant_turns=len(ep.ends),
            user_turns=ep.observations,
            tool_calls=sum(c.ok for c in ep.calls),
            tool_errors=len(ep.errors),
            tool_error_kinds=list(ep.errors),
            calls=list(ep.calls),
            turn_scores=list(ep.scores) if any(ep.scores) else [],
            turn_states=list(ep.states),
        )

    def _output(self, traj: Trajectory, ep: _Episode) -> AgentLoopOutput:
        out = self.output(
            traj, num_turns=1 + len(ep.ends) + ep.observations, record=self._record(ep)
        )
        out.reward_score = 0.0  # the return is the sum of the turn scores (step rewards)
        out.metrics["env/steps"] = float(len(ep.ends))
        out.metrics["env/return"] = float(sum(ep.scores))
        out.metrics["env/done"] = float(ep.done)
        return out

    async def _failed(
        self,
        prompt: list[dict[str, Any]],
        traj: Trajectory | None,
        ep: _Episode,
        error: str,
        restarted: bool,
    ) -> AgentLoopOutput:
        """A sample whose server failed: left out of the loss (weight 0), the error kept."""
        logger.warning("%s (sample left out: weight 0)", error)
        if traj is None:
            ids = await self.encode_prompt(prompt, self.schemas)
            traj = Trajectory(ids, self.config.response_length)
        out = self.output(
            traj, num_turns=1 + len(ep.ends) + ep.observations, record=self._record(ep)
        )
        out.reward_score = 0.0
        out.record.stop_reason = "env_error"
        out.record.weight = 0.0
        out.record.error = error + (" (the server was restarted)" if restarted else "")
        out.extra["env_error"] = out.record.error
        out.metrics["env/server_restarts"] = float(restarted)
        if self.trace is not None:
            self.trace.agent_error(out.record.error)
        return out


class _Episode:
    """What one episode recorded, per model turn."""

    def __init__(self) -> None:
        self.ends: list[int] = []
        self.finish_reasons: list[str] = []
        self.scores: list[float] = []
        self.states: list[str | None] = []
        self.errors: list[str] = []
        self.calls: list[ToolCallRecord] = []
        self.observations = 0
        """Observations appended after a model turn (the first is in the prompt)."""
        self.last = EnvStep()
        self.stop = "max_steps"
        self.done = False

    def turn(self, end: int, finish_reason: str, observation: str) -> None:
        self.ends.append(end)
        self.finish_reasons.append(finish_reason)
        self.scores.append(0.0)
        self.states.append(hashlib.sha1(observation.encode()).hexdigest()[:16])


def _is_disconnect(exc: BaseException) -> bool:
    name = type(exc).__name__
    return name.startswith("ConnectionClosed") or name in ("InvalidStatus", "InvalidHandshake")
