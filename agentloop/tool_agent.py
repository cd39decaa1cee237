"""``tool_agent``: generate -> parse tool calls -> run them concurrently -> append the tool
messages as a template delta (mask 0) -> generate again.

Stops when a turn has no tool call, at ``max_assistant_turns``/``max_user_turns``, when the
model's turn did not end with its end-of-turn token (length, abort, another stop token), or
when the next delta would not leave room in the response budget. Malformed calls, unknown
tools, schema failures, tool exceptions and timeouts all come back as tool messages.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from agentloop.base import AgentLoopBase, AgentLoopContext, AgentLoopOutput, register
from agentloop.parsers import ParsedTurn, ToolCall, ToolCallError, check_calls, get_parser
from agentloop.tokens import Trajectory
from agentloop.tools.runner import truncate_text

__all__ = ["ToolAgentLoop"]


@register("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    def __init__(self, context: AgentLoopContext, **kwargs: Any) -> None:
        super().__init__(context, **kwargs)
        self.multi_turn = self.config.multi_turn
        self.parser = get_parser(self.multi_turn.format)
        self.runner = context.tool_runner
        self.schemas = {name: tool.tool_schema for name, tool in context.tools.items()}
        self.eot_id = self.tokenizer.convert_tokens_to_ids(self.tokenizer.eos_token)

    async def run(
        self,
        sampling_params: dict[str, Any],
        *,
        raw_prompt: list[dict[str, Any]],
        tools_kwargs: dict[str, Any] | None = None,
        **row: Any,
    ) -> AgentLoopOutput:
        request_id = uuid.uuid4().hex
        schemas = list(self.schemas.values())
        messages = list(raw_prompt)
        traj = Trajectory(await self.encode_prompt(messages, schemas), self.config.response_length)
        self._tools_kwargs = tools_kwargs or {}
        self._instances: dict[str, str] = {}
        self._calls: list[dict[str, Any]] = []
        self._error_kinds: list[str] = []
        assistant_turns = user_turns = 0
        finish_reasons: list[str] = []
        turn_ends: list[int] = []  # each model turn's last response index (per-turn rewards)
        try:
            while True:
                out = await self.generate(request_id, traj, sampling_params)
                assistant_turns += 1
                finish_reasons.append(out.finish_reason)
                turn_ends.append(len(traj) - 1)
                if (
                    out.finish_reason != "stop"
                    or not out.token_ids
                    or out.token_ids[-1] != self.eot_id
                ):
                    stop = out.finish_reason if out.finish_reason != "stop" else "stop_token"
                    break
                text = self.tokenizer.decode(out.token_ids[:-1], skip_special_tokens=False)
                parse_ns = time.time_ns()
                parsed = check_calls(self.parser.parse(text), self.schemas)
                if self.trace is not None:
                    errors = [i for i in parsed.items if isinstance(i, ToolCallError)]
                    self.trace.parse(parse_ns, text, parsed.calls, errors)
                if not parsed.items:
                    stop = "no_tool_call"
                    break
                if self._reached(self.multi_turn.max_assistant_turns, assistant_turns):
                    stop = "max_assistant_turns"
                    break
                if self._reached(self.multi_turn.max_user_turns, user_turns):
                    stop = "max_user_turns"
                    break
                tool_messages = await self._call_tools(request_id, parsed, assistant_turns - 1)
                messages.append({"role": "assistant", "content": text})
                delta = await self.encode_delta(messages, tool_messages, schemas)
                messages.extend(tool_messages)
                if not traj.add_template(delta):
                    stop = "length"
                    break
                user_turns += 1
        finally:
            tool_rewards = await self._release()
        return self.output(
            traj,
            num_turns=1 + assistant_turns + user_turns,
            finish_reasons=finish_reasons,
            turn_ends=turn_ends,
            stop_reason=stop,
            assistant_turns=assistant_turns,
            user_turns=user_turns,
            tool_calls=sum(c["ok"] for c in self._calls),
            tool_errors=len(self._error_kinds),
            tool_error_kinds=self._error_kinds,
            calls=self._calls,
            tool_rewards=tool_rewards,
        )

    @staticmethod
    def _reached(limit: int | None, count: int) -> bool:
        return limit is not None and count >= limit

    async def _call_tools(
        self, request_id: str, parsed: ParsedTurn, turn: int
    ) -> list[dict[str, str]]:
        """Tool messages for every item of model turn ``turn``, in order; calls run
        concurrently."""
        limit = self.multi_turn.max_parallel_calls
        slots: list[dict[str, str] | None] = []
        to_run: list[tuple[int, ToolCall]] = []
        for item in parsed.items:
            if isinstance(item, ToolCall) and len(to_run) >= limit:
                item = ToolCallError(
                    "too_many_calls",
                    f"only {limit} tool call(s) run per turn; call {item.name!r} was skipped",
                    item.raw,
                    item.name,
                )
            if isinstance(item, ToolCallError):
                self._error_kinds.append(item.kind)
                slots.append(item.to_message())
                continue
            error = await self._ensure_instance(request_id, item.name)
            if error is not None:
                self._error_kinds.append("create_failed")
                slots.append({"role": "tool", "content": error})
                continue
            to_run.append((len(slots), item))
            slots.append(None)
        start = time.perf_counter()
        start_ns = time.time_ns()
        outcomes = await self.runner.run([c for _, c in to_run], self._instances)
        self.metrics["tool_s"] += time.perf_counter() - start
        if self.trace is not None:
            for (_, call), outcome in zip(to_run, outcomes, strict=True):
                self.trace.tool(start_ns, call.name, call.arguments, outcome)
        mt = self.multi_turn
        for (pos, call), outcome in zip(to_run, outcomes, strict=True):
            text = truncate_text(
                outcome.text, mt.max_tool_response_length, mt.tool_response_truncate_side
            )
            slots[pos] = {"role": "tool", "content": text}
            if not outcome.ok:
                self._error_kinds.append(outcome.error_kind or "tool_failed")
            self._calls.append(
                {
                    "name": call.name,
                    "arguments": call.arguments,
                    "ok": outcome.ok,
                    "seconds": outcome.seconds,
                    "repaired": call.repaired,
                    "reward": outcome.reward,
                    "turn": turn,
                }
            )
        return [s for s in slots if s is not None]

    async def _ensure_instance(self, request_id: str, name: str) -> str | None:
        if name in self._instances:
            return None
        create_kwargs = (self._tools_kwargs.get(name) or {}).get("create_kwargs") or {}
        try:
            self._instances[name] = await self.context.tools[name].create(
                f"{request_id}-{name}", **create_kwargs
            )
        except Exception as exc:  # reported to the model like any tool failure
            return f"Error: tool {name!r} could not start: {type(exc).__name__}: {exc}"
        return None

    async def _release(self) -> dict[str, float]:
        rewards: dict[str, float] = {}
        for name, instance in self._instances.items():
            tool = self.context.tools[name]
            try:
                rewards[name] = float(await tool.calc_reward(instance))
            finally:
                await tool.release(instance)
        return rewards
