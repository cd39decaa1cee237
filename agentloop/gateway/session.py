"""One rollout session of the gateway: an agent's chat calls turned into exact token samples.

Each call's messages are compared (``comparable``) with every segment's history: the prompt
messages of its latest call plus the assistant message the gateway returned. A call whose
messages start with a segment's whole history (and whose tools are the same) extends it: the
new messages are appended to the segment's trajectory as ``encode_delta`` ids (loss mask 0),
after the ids the engine sampled, which are never re-rendered. Any other call starts a new
segment from the full render of its messages, recording the branch point (messages shared
with the closest segment) and why it could not extend one. Each segment is one training
sample.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentloop.base import PromptTooLongError
from agentloop.gateway.messages import (
    ContextLengthError,
    GatewayInputError,
    comparable,
    render_messages,
)
from agentloop.messages import takes_string_arguments
from agentloop.parsers import ParsedTurn, ToolCall, ToolCallError, check_calls
from agentloop.tokens import Trajectory

if TYPE_CHECKING:
    from agentloop.base import AgentLoopBase

__all__ = [
    "ChatCall",
    "Completion",
    "Segment",
    "SegmentFullError",
    "Session",
    "SessionLimitError",
]


class SessionLimitError(GatewayInputError):
    """A call over one of the session's limits (400, naming the config key)."""


class SegmentFullError(SessionLimitError):
    """New messages that leave no room to sample in the segment they extend: the
    conversation no longer fits, answered with the context-length code (a client such as Codex
    compacts its history on it). ``tokens``: the new messages' tokens; ``room``: what was left."""

    code = "context_length_exceeded"

    def __init__(self, tokens: int, room: int, segment: int, budget: int) -> None:
        super().__init__(
            f"the {tokens} tokens of the new messages leave no room to sample in segment "
            f"{segment} ({room} of actor_rollout_ref.rollout.response_length={budget} left)",
            "messages",
        )
        self.tokens = tokens
        self.room = room


@dataclass(slots=True, kw_only=True)
class ChatCall:
    """One chat call, as the HTTP layer parsed it (OpenAI field names)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: Any = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    """Stop strings: the content is cut before the first one sampled (the engine works on
    token ids, so the trajectory keeps every sampled token)."""
    recorded: dict[str, Any] = field(default_factory=dict)
    """Fields that steer a hosted service (``reasoning``, ``include``, ``store``, tools
    dropped, ...): accepted, kept on the session, never acted on."""
    tool_origins: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    """Listed function name -> (the request's tool type, its namespace): how a call of it is
    answered in the dialect (a Responses ``custom`` tool's call is a ``custom_tool_call``)."""
    model: str | None = None
    """The request's ``model`` field (the segment's role with ``gateway.role_from_model``)."""


@dataclass(slots=True, kw_only=True)
class Completion:
    """What one call sampled, ready for the OpenAI response shapes."""

    call_id: str
    content: str | None
    tool_calls: list[dict[str, Any]]
    """OpenAI ``tool_calls`` (``id``, ``type``, ``function.name``, ``function.arguments``)."""
    finish_reason: str
    """``stop``, ``tool_calls`` or ``length``."""
    prompt_tokens: int
    completion_tokens: int
    segment: int
    max_tokens_cut: int | None = None
    """The ``max_tokens`` the agent asked for when the rollout's budget cut it."""
    stop_sequence: str | None = None
    """The agent's stop string the content was cut at."""
    branch_reason: str | None = None
    """Why this call started a new segment (its first call only; None: it extended one)."""
    tool_origins: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    """The call's ``ChatCall.tool_origins``, for the response shapes."""


@dataclass(slots=True)
class Segment:
    """One training sample of the session: a prompt and the turns appended to it."""

    index: int
    traj: Trajectory
    head: int
    """Messages of the segment's first call (its prompt)."""
    tools_key: str
    tools: list[dict[str, Any]]
    compared: list[tuple[Any, ...]]
    """``comparable`` of the history: the latest call's messages + the returned message."""
    history: list[dict[str, Any]]
    """The same history as chat-template dicts in the rollout's format."""
    prompt_messages: list[dict[str, Any]]
    branch_reason: str | None
    branch_point: int | None
    role: str | None = None
    """The ``model`` of the segment's first call, with ``gateway.role_from_model``."""
    open: bool = False
    """The last turn closed with an end-of-turn token: messages can follow it."""
    end_id: int | None = None
    calls: int = 0
    user_turns: int = 0
    finish_reasons: list[str] = field(default_factory=list)
    turn_ends: list[int] = field(default_factory=list)
    turn_states: list[str | None] = field(default_factory=list)
    """Each call's state as the agent named it (``POST /sessions/{sid}/state``); None: none."""
    tool_calls: int = 0
    """Well-formed tool calls returned to the agent (the agent runs them)."""
    error_kinds: list[str] = field(default_factory=list)
    """The kind of each call the model wrote wrongly (returned as text, not as a call)."""
    answers: dict[str, tuple[int, ToolCall | ToolCallError, dict[str, Any]]] = field(
        default_factory=dict
    )
    """Call id -> (index in its turn, the parsed call, the turn's history message)."""


def _common_prefix(a: list[Any], b: list[Any]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _cut_at_stop(text: str, stops: list[str]) -> tuple[str, str] | None:
    """``text`` up to the first stop string in it and that string; None when none occurs."""
    found = [(i, s) for i, s in ((text.find(s), s) for s in stops if s) if i >= 0]
    if not found:
        return None
    at, stop = min(found)
    return text[:at], stop


class Session:
    """A session's segments and limits; ``complete`` serves one chat call."""

    def __init__(self, loop: AgentLoopBase, session_id: str | None = None) -> None:
        self.loop = loop
        self.id = session_id or uuid.uuid4().hex
        self.segments: list[Segment] = []
        self.calls = 0
        self.sampled_tokens = 0
        self.max_tokens_cuts = 0
        self.ended = False
        self.reward: float | None = None
        self.step_rewards: dict[str, float] = {}
        self.state_key: str | None = None
        """The state the next chat call acts on, as the agent named it (``POST
        /sessions/{sid}/state``); taken by that call (GiGPO's anchor key of its turn)."""
        self.recorded: dict[str, Any] = {}
        """The latest value of each hosted-service field the agent sent (``ChatCall``)."""
        self.errors: list[str] = []
        """The error each failed call was answered with, in order."""
        self._string_arguments = takes_string_arguments(loop.tokenizer.chat_template)
        self._gateway = loop.config.gateway

    # ---- the segment rule --------------------------------------------------------------
    def _match(
        self, compared: list[tuple[Any, ...]], tools_key: str
    ) -> tuple[Segment | None, str | None, int | None]:
        """The segment the call extends, else None with the reason and branch point."""
        for seg in reversed(self.segments):
            n = len(seg.compared)
            if seg.tools_key == tools_key and len(compared) > n and compared[:n] == seg.compared:
                if seg.open:
                    return seg, None, None
                return (
                    None,
                    (
                        f"segment {seg.index}'s last turn ended without its end-of-turn token "
                        f"({seg.finish_reasons[-1]}); nothing can be appended to it"
                    ),
                    n,
                )
        if not self.segments:
            return None, None, None
        best = max(self.segments, key=lambda s: _common_prefix(s.compared, compared))
        point = _common_prefix(best.compared, compared)
        if best.tools_key != tools_key:
            reason = "the tools differ from every earlier call's"
        elif point == len(compared):
            reason = "the messages repeat an earlier call's (a retry or another sample)"
        elif point == 0 and compared and compared[0][0] == "system":
            reason = "the system prompt changed"
        elif point == 0:
            reason = "a fresh context (no message in common)"
        else:
            reason = f"the history differs from segment {best.index}'s at message {point}"
        return None, reason, point

    async def _segment_for(self, call: ChatCall) -> Segment:
        """The extended segment with the new messages' delta appended, or a new one."""
        compared = [comparable(m, i) for i, m in enumerate(call.messages)]
        tools_key = json.dumps(call.tools, sort_keys=True)
        seg, reason, point = self._match(compared, tools_key)
        if seg is not None:
            n = len(seg.compared)
            new = self._render_new(seg, call.messages[n:], n)
            delta = await self.loop.encode_delta(
                seg.history, new, call.tools or None, head=seg.head, sampled_end=seg.end_id
            )
            if not seg.traj.add_template(delta):
                raise SegmentFullError(len(delta), seg.traj.room, seg.index, seg.traj.budget)
            seg.compared = compared
            seg.history = [*seg.history, *new]
            seg.user_turns += 1
            return seg
        history = render_messages(call.messages, string_arguments=self._string_arguments)
        try:
            prompt = await self.loop.encode_prompt(history, call.tools or None)
        except PromptTooLongError as exc:
            key = "actor_rollout_ref.rollout.prompt_length"
            raise ContextLengthError(exc.tokens, exc.limit, key) from None
        seg = Segment(
            index=len(self.segments),
            traj=Trajectory(prompt, self.loop.config.response_length),
            head=len(call.messages),
            tools_key=tools_key,
            tools=call.tools,
            compared=compared,
            history=history,
            prompt_messages=[dict(m) for m in call.messages],
            branch_reason=reason,
            branch_point=point,
            role=call.model if self._gateway.role_from_model else None,
        )
        self.segments.append(seg)
        return seg

    async def prompt_tokens(self, call: ChatCall) -> int:
        """The prompt length ``call`` would be sampled after if it were made now: its
        segment's trajectory plus the new messages' delta, or a new segment's full render.
        Changes nothing (an Anthropic ``count_tokens``)."""
        compared = [comparable(m, i) for i, m in enumerate(call.messages)]
        seg, _, _ = self._match(compared, json.dumps(call.tools, sort_keys=True))
        if seg is None:
            history = render_messages(call.messages, string_arguments=self._string_arguments)
            try:
                return len(await self.loop.encode_prompt(history, call.tools or None))
            except PromptTooLongError as exc:  # counted all the same: the agent decides
                return exc.tokens
        n = len(seg.compared)
        new = self._render_new(seg, call.messages[n:], n)
        delta = await self.loop.encode_delta(
            seg.history, new, call.tools or None, head=seg.head, sampled_end=seg.end_id
        )
        return len(seg.traj.prompt_ids) + len(seg.traj) + len(delta)

    def _render_new(
        self, seg: Segment, messages: list[dict[str, Any]], start: int
    ) -> list[dict[str, Any]]:
        """New messages in the format's history shape: a tool message answering one of the
        segment's last calls is built by the format's ``tool_message`` for that call."""
        rendered = render_messages(messages, string_arguments=self._string_arguments, start=start)
        fmt = self.loop.chat_format
        for i, (message, out) in enumerate(zip(messages, rendered, strict=True)):
            answer = seg.answers.get(str(message.get("tool_call_id")))
            if out["role"] == "tool" and answer is not None:
                index, item, assistant = answer
                rendered[i] = fmt.tool_message(out["content"], item, index, assistant)
        return rendered

    # ---- one call ------------------------------------------------------------------------
    def _check_limits(self) -> None:
        gw = self._gateway
        if self.calls >= gw.max_calls_per_session:
            raise SessionLimitError(
                f"the session made {self.calls} calls, the limit: raise "
                "actor_rollout_ref.rollout.gateway.max_calls_per_session",
                "messages",
            )
        cap = gw.max_tokens_per_session
        if cap is not None and self.sampled_tokens >= cap:
            raise SessionLimitError(
                f"the session sampled {self.sampled_tokens} tokens, the limit: raise "
                "actor_rollout_ref.rollout.gateway.max_tokens_per_session",
                "max_tokens",
            )

    def _sampling(self, call: ChatCall) -> tuple[dict[str, Any], int | None]:
        """The rollout's sampling params (the agent's temperature/top_p only where the config
        lets it choose) and the ``max_tokens`` it asked for when the budget cuts it."""
        params = self.loop.config.sampling_params()
        if self._gateway.agent_sets_temperature:
            for key in ("temperature", "top_p", "top_k"):
                if getattr(call, key) is not None:
                    params[key] = getattr(call, key)
        budget = params.get("max_tokens")
        cap = self._gateway.max_tokens_per_session
        if cap is not None:
            budget = min(budget or cap, cap - self.sampled_tokens)
        cut = None
        if call.max_tokens is not None:
            if budget is not None and call.max_tokens > budget:
                cut = call.max_tokens
            else:
                budget = call.max_tokens
        if budget is not None:
            params["max_tokens"] = budget
        return params, cut

    async def complete(self, call: ChatCall) -> Completion:
        """Serve one chat call: extend or start a segment, sample, parse the tool calls (a
        span in the session's trace when it is traced)."""
        trace = self.loop.trace
        start_ns = time.time_ns()
        try:
            completion = await self._complete(call)
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
            if trace is not None:
                trace.chat_call(start_ns, call.messages, None, self.errors[-1])
            raise
        if trace is not None:
            trace.chat_call(start_ns, call.messages, completion)
        return completion

    async def _complete(self, call: ChatCall) -> Completion:
        if not call.messages:
            raise GatewayInputError("messages must be a non-empty list", "messages")
        self._check_limits()
        self.recorded.update(call.recorded)
        self.calls += 1
        seg = await self._segment_for(call)
        loop = self.loop
        params, cut = self._sampling(call)
        if cut is not None:
            self.max_tokens_cuts += 1
        start = len(seg.traj)
        out = await loop.generate(self.id, seg.traj, loop.with_end_tokens(params))
        self.sampled_tokens += len(out.token_ids)
        seg.calls += 1
        if self.state_key is not None:
            seg.turn_states += [None] * (seg.calls - 1 - len(seg.turn_states))
            seg.turn_states.append(self.state_key)
            self.state_key = None
        seg.finish_reasons.append(out.finish_reason)
        seg.turn_ends.append(len(seg.traj) - 1)
        closed = loop.turn_closed(out)
        seg.open, seg.end_id = closed, (out.token_ids[-1] if closed else None)
        sampled = out.token_ids[:-1] if closed else out.token_ids
        text = loop.tokenizer.decode(sampled, skip_special_tokens=False)
        stopped = _cut_at_stop(text, call.stop)
        if stopped is not None:  # the turn ends at a stop string: nothing can follow it
            text, closed, seg.open, seg.end_id = stopped[0], False, False, None
        parsed = self._parse(text, call) if closed else ParsedTurn(content=text)
        if closed and out.token_ids[-1] not in loop.ends.call_ids:
            parsed = ParsedTurn(content=parsed.content)  # a final turn: no call runs
        call_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        tool_calls, seg.answers = [], {}
        history_message = loop.chat_format.assistant_message(text, parsed)
        for i, item in enumerate(parsed.items):
            if isinstance(item, ToolCall):
                tc_id = f"call_{uuid.uuid4().hex[:24]}"
                arguments = json.dumps(item.arguments, ensure_ascii=False)
                function = {"name": item.name, "arguments": arguments}
                tool_calls.append({"id": tc_id, "type": "function", "function": function})
                seg.answers[tc_id] = (i, item, history_message)
        seg.tool_calls += len(tool_calls)
        seg.error_kinds += [e.kind for e in parsed.errors]
        content = parsed.content if not parsed.errors else text
        message = {"role": "assistant", "content": content or None}
        if tool_calls:
            message["tool_calls"] = tool_calls
        seg.compared = [*seg.compared, comparable(message, len(seg.compared))]
        seg.history = [*seg.history, history_message]
        if tool_calls:
            finish = "tool_calls"
        else:
            finish = "length" if out.finish_reason == "length" and stopped is None else "stop"
        return Completion(
            call_id=call_id,
            content=message["content"],
            tool_calls=tool_calls,
            finish_reason=finish,
            prompt_tokens=len(seg.traj.prompt_ids) + start,
            completion_tokens=len(out.token_ids),
            segment=seg.index,
            max_tokens_cut=cut,
            tool_origins=call.tool_origins,
            stop_sequence=stopped[1] if stopped is not None else None,
            branch_reason=seg.branch_reason if seg.calls == 1 else None,
        )

    def _parse(self, text: str, call: ChatCall) -> ParsedTurn:
        if not call.tools or call.tool_choice == "none":
            return ParsedTurn(content=text)
        schemas = {t["function"]["name"]: t for t in call.tools}
        parser = self.loop.chat_format.new_parser(
            repair=self.loop.config.multi_turn.repair_tool_calls, schemas=schemas
        )
        parse_ns = time.time_ns()
        parsed = check_calls(parser.parse(text), schemas)
        if self.loop.trace is not None:
            self.loop.trace.parse(parse_ns, text, parsed.calls, parsed.errors)
        return parsed
