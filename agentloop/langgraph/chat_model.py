"""A LangChain chat model that samples through the token-level ``generate`` API.

``AgentLoopChatModel`` is made per sample by an agent loop (``AgentLoopChatModel.for_loop``)
and used in any LangGraph graph like another chat model: ``bind_tools`` takes OpenAI schemas
or LangChain tools, and each call returns an ``AIMessage`` with ``tool_calls`` (parsed by the
rollout's ``multi_turn.format`` parser and checked against the bound schemas) and
``invalid_tool_calls`` (every malformed, unknown or schema-failing call, with the error the
model should see).

The token trajectory lives in ``response_metadata["agentloop"]`` of each AIMessage: prompt
ids, response ids, loss mask, engine log-probs, the request id (later turns stick to the
same server), the sampled text, its parsed calls and the end token it ended with. The next
call continues from the last such message and appends only the template delta of the
messages added after it (mask 0), so the trajectory holds exactly the sampled tokens. The
messages before that AIMessage must be the ones it was sampled from. Messages are rendered
in the rollout's chat format as ``tool_agent`` renders them (``messages.to_chat_dicts``), so
every registered family works; a turn's calls are run only when it ended with one of the
format's call end tokens (gpt-oss ``<|call|>``, GLM ``<|observation|>``), as in ``tool_agent``.

When the budget is spent (the delta does not fit the response length, the last turn was cut,
or a turn limit is reached) the call raises ``TrajectoryLimitError``: a graph run ends there
and ``ReactAgentLoop`` returns the trajectory so far.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field, PrivateAttr

from agentloop.base import AgentLoopBase
from agentloop.config import MultiTurnConfig
from agentloop.langgraph.messages import (
    METADATA_KEY,
    parsed_to_state,
    takes_string_arguments,
    to_chat_dicts,
)
from agentloop.parsers import ParsedTurn, ToolCall, ToolCallParser, check_calls, limit_calls
from agentloop.tokens import Trajectory
from agentloop.tool_agent import reached

__all__ = ["AgentLoopChatModel", "TrajectoryLimitError", "trajectory_of", "turn_limit"]


class TrajectoryLimitError(Exception):
    """The sample cannot take another model turn. ``reason``: ``length`` (response budget or
    a cut last turn), ``stop_token``/``abort`` (the last turn did not end its turn),
    ``max_assistant_turns``, ``max_user_turns``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def trajectory_of(message: BaseMessage) -> dict[str, Any] | None:
    """The token state an ``AgentLoopChatModel`` turn carries (None for other messages)."""
    if not isinstance(message, AIMessage):
        return None
    return message.response_metadata.get(METADATA_KEY)


def turn_limit(state: dict[str, Any], multi_turn: MultiTurnConfig) -> str | None:
    """``max_assistant_turns``/``max_user_turns`` when a turn's state has reached it."""
    if reached(multi_turn.max_assistant_turns, state["assistant_turns"]):
        return "max_assistant_turns"
    if reached(multi_turn.max_user_turns, state["user_turns"]):
        return "max_user_turns"
    return None


class AgentLoopChatModel(BaseChatModel):
    loop: AgentLoopBase
    """The agent loop of this sample: its server client, tokenizer, rollout config, budget
    and trace."""
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    """Rollout sampling params; keyword args bound to the model (``.bind(temperature=0)``)
    override them."""
    session_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    """The sample's session: every turn of the graph run stays on one server."""
    parser: Any = None
    """A ``ToolCallParser``; default: one built from the rollout's chat format."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    _last: dict[str, Any] | None = PrivateAttr(default=None)

    @classmethod
    def for_loop(
        cls, loop: AgentLoopBase, sampling_params: dict[str, Any], **kwargs: Any
    ) -> AgentLoopChatModel:
        return cls(loop=loop, sampling_params=dict(sampling_params), **kwargs)

    @property
    def _llm_type(self) -> str:
        return "agentloop-token"

    @property
    def last_trajectory(self) -> dict[str, Any] | None:
        """The token state of the latest turn this model sampled (what a loop returns when a
        graph run ends with ``TrajectoryLimitError``)."""
        return self._last

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Any],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        if tool_choice not in (None, "auto", "none"):
            raise ValueError(
                f"tool_choice={tool_choice!r} is not supported: the token chat model samples "
                "freely and cannot force a call; use 'auto' (default) or 'none'"
            )
        schemas = [convert_to_openai_tool(t) for t in tools]
        return self.bind(tools=schemas, tool_choice=tool_choice, **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        raise NotImplementedError(
            "AgentLoopChatModel is async only: use ainvoke/astream in an async graph"
        )

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        *,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | None = None,
        **sampling: Any,
    ) -> ChatResult:
        if stop:
            raise ValueError(
                "stop sequences are not supported by the token chat model; the model's "
                "end-of-turn token ends a turn (use sampling stop_token_ids for others)"
            )
        loop = self.loop
        traj, state = await self._extend(messages, tools)
        params = loop.with_end_tokens({**self.sampling_params, **sampling})
        out = await loop.generate(self.session_id, traj, params)
        closed = loop.turn_closed(out)
        sampled = out.token_ids[:-1] if closed else out.token_ids
        text = loop.tokenizer.decode(sampled, skip_special_tokens=False)
        state["assistant_turns"] += 1
        state["finish_reasons"].append(out.finish_reason)
        state["turn_ends"].append(len(traj) - 1)
        if closed:
            state["stop"] = None
        else:
            state["stop"] = "stop_token" if out.finish_reason == "stop" else out.finish_reason
        content, tool_calls, invalid, kinds, order = text, [], [], {}, []
        parsed: ParsedTurn | None = None
        if closed and tools and tool_choice != "none":
            parsed = self._parse(text, tools)
            content = parsed.content
            if out.token_ids[-1] in loop.ends.call_ids:  # else a final turn: no call runs
                tool_calls, invalid, kinds, order = self._calls(parsed)
            else:
                parsed = ParsedTurn(content=parsed.content)
        state.update(
            session_id=self.session_id,
            prompt_ids=traj.prompt_ids,
            response_ids=traj.response_ids,
            response_mask=traj.response_mask,
            response_log_probs=traj.response_log_probs,
            response_versions=traj.response_versions,
            text=text,
            parsed=parsed_to_state(parsed) if parsed is not None else None,
            end_id=out.token_ids[-1] if closed else None,
            messages=len(messages) + 1,
            error_kinds=kinds,
            call_order=order,
        )
        self._last = state
        message = AIMessage(
            content=content,
            tool_calls=tool_calls,
            invalid_tool_calls=invalid,
            response_metadata={
                "finish_reason": "tool_calls" if tool_calls else out.finish_reason,
                "model_name": self._llm_type,
                METADATA_KEY: state,
            },
            usage_metadata={
                "input_tokens": len(traj.prompt_ids) + len(traj) - len(out.token_ids),
                "output_tokens": len(out.token_ids),
                "total_tokens": len(traj.prompt_ids) + len(traj),
            },
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _extend(
        self, messages: list[BaseMessage], tools: list[dict[str, Any]] | None
    ) -> tuple[Trajectory, dict[str, Any]]:
        """The trajectory to sample the next turn on: the prompt for a first turn, else the
        last turn's trajectory plus the delta of the messages added since."""
        loop, mt = self.loop, self.loop.config.multi_turn
        last = next(
            (i for i in range(len(messages) - 1, -1, -1) if trajectory_of(messages[i])), None
        )
        if last is None:
            prompt = await loop.encode_prompt(self._render(messages), tools)
            traj = Trajectory(prompt, loop.config.response_length)
            state = {"assistant_turns": 0, "user_turns": 0, "finish_reasons": [], "turn_ends": []}
            return traj, state
        prev = trajectory_of(messages[last])
        assert prev is not None
        if prev["messages"] != last + 1:
            raise ValueError(
                f"the model turn at message {last} was sampled after {prev['messages'] - 1} "
                f"messages but now follows {last}: the graph changed the messages before the "
                "last model turn; a token trajectory can only grow by appending messages"
            )
        if prev["stop"] is not None:
            raise TrajectoryLimitError(
                prev["stop"],
                f"the last model turn ended with {prev['stop']!r}, not its end-of-turn token; "
                "no message can be appended after it",
            )
        limit = turn_limit(prev, mt)
        if limit is not None:
            raise TrajectoryLimitError(
                limit, f"multi_turn.{limit}={getattr(mt, limit)} reached: no more turns"
            )
        traj = Trajectory.restore(
            prev["prompt_ids"],
            loop.config.response_length,
            prev["response_ids"],
            prev["response_mask"],
            prev["response_log_probs"],
            prev.get("response_versions"),
        )
        rendered = self._render(messages)
        history, new = rendered[: last + 1], rendered[last + 1 :]
        delta = await loop.encode_delta(history, new, tools, sampled_end=prev.get("end_id"))
        if not traj.add_template(delta):
            raise TrajectoryLimitError(
                "length",
                f"the {len(delta)}-token template delta of {len(new)} new message(s) does not "
                f"leave room to sample ({traj.room} of rollout.response_length="
                f"{loop.config.response_length} tokens left)",
            )
        state = {
            "assistant_turns": prev["assistant_turns"],
            "user_turns": prev["user_turns"] + 1,
            "finish_reasons": list(prev["finish_reasons"]),
            "turn_ends": list(prev["turn_ends"]),
        }
        return traj, state

    def _render(self, messages: list[BaseMessage]) -> list[dict[str, Any]]:
        """The chat dicts of ``messages`` in the rollout's chat format, one per message."""
        loop = self.loop
        return to_chat_dicts(
            messages,
            loop.chat_format,
            string_arguments=takes_string_arguments(loop.tokenizer.chat_template),
        )

    def _parse(self, text: str, tools: list[dict[str, Any]]) -> ParsedTurn:
        """The turn's calls as ``tool_agent`` parses them: the format's parser, calls checked
        against the bound schemas and limited to ``max_parallel_calls``."""
        loop = self.loop
        multi_turn = loop.config.multi_turn
        schemas = {s["function"]["name"]: s for s in tools}
        parser: ToolCallParser = self.parser or loop.chat_format.new_parser(
            repair=multi_turn.repair_tool_calls, schemas=schemas
        )
        parse_ns = time.time_ns()
        parsed = check_calls(parser.parse(text), schemas)
        limit_calls(parsed, loop.config.multi_turn.max_parallel_calls)
        if loop.trace is not None:
            loop.trace.parse(parse_ns, text, parsed.calls, parsed.errors)
        return parsed

    @staticmethod
    def _calls(
        parsed: ParsedTurn,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, str], list[str]]:
        """Valid calls, invalid calls (in LangChain's shapes), each invalid call's error
        kind, and all call ids in order of appearance (the order of ``parsed.items``)."""
        calls, invalid, kinds, order = [], [], {}, []
        for item in parsed.items:
            call_id = f"call_{uuid.uuid4().hex[:16]}"
            if isinstance(item, ToolCall):
                entry = {"name": item.name, "args": item.arguments, "id": call_id}
                calls.append({**entry, "type": "tool_call"})
            else:
                entry = {"name": item.name, "args": item.raw, "id": call_id}
                invalid.append({**entry, "error": item.message, "type": "invalid_tool_call"})
                kinds[call_id] = item.kind
            order.append(call_id)
        return calls, invalid, kinds, order
