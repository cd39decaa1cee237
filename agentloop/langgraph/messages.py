"""LangChain messages <-> the chat-template dicts the token trajectory is rendered from.

Rendering follows the rollout's chat format (``multi_turn.format``), as ``tool_agent`` does:
a model turn the token chat model sampled becomes ``chat_format.assistant_message(text,
parsed)`` (the sampled text and its parsed calls, kept in the turn's metadata), and each
``ToolMessage`` answering one of its calls becomes ``chat_format.tool_message(...)`` for
that call (paired by the call ids the chat model assigned). For hermes-like formats that is
``{"role": "assistant", "content": <sampled text>}`` and ``{"role": "tool", "content": ...}``;
mistral gets structured calls with ids and tool messages with the matching ``tool_call_id``,
gpt-oss ``thinking`` + ``tool_calls`` and named tool messages.

An AI message written by the graph (not sampled) renders its ``tool_calls`` in the OpenAI
shape; their arguments are the JSON text where the chat template accepts a string
(``arguments is string``, as Qwen's templates) and the dict otherwise (templates that apply
``tojson`` or ``.items()`` to them). Tool messages answering it go through the format's
``tool_message`` too.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_messages,
)

from agentloop.formats.base import ChatFormat, content_message, plain_tool_message
from agentloop.messages import takes_string_arguments, text_of
from agentloop.parsers import ParsedTurn, ToolCall, ToolCallError

__all__ = [
    "METADATA_KEY",
    "from_chat_dicts",
    "parsed_from_state",
    "parsed_to_state",
    "takes_string_arguments",
    "text_of",
    "to_chat_dict",
    "to_chat_dicts",
]

METADATA_KEY = "agentloop"
"""``AIMessage.response_metadata[METADATA_KEY]``: the token trajectory up to that turn."""

# call id -> (index of the call in its turn, the parsed call, the turn's history message)
_Answers = dict[str, tuple[int, ToolCall | ToolCallError, dict[str, Any]]]


# ---- parsed turns in message metadata (plain data, so checkpointers can serialize it) -------
def parsed_to_state(parsed: ParsedTurn) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for item in parsed.items:
        if isinstance(item, ToolCall):
            items.append(
                {
                    "name": item.name,
                    "arguments": copy.deepcopy(item.arguments),
                    "raw": item.raw,
                    "repaired": item.repaired,
                }
            )
        else:
            items.append(
                {"kind": item.kind, "message": item.message, "raw": item.raw, "name": item.name}
            )
    return {"content": parsed.content, "items": items}


def parsed_from_state(data: dict[str, Any]) -> ParsedTurn:
    items: list[ToolCall | ToolCallError] = []
    for item in data["items"]:
        if "kind" in item:
            items.append(ToolCallError(item["kind"], item["message"], item["raw"], item["name"]))
        else:
            arguments = copy.deepcopy(item["arguments"])
            items.append(ToolCall(item["name"], arguments, item["raw"], item["repaired"]))
    return ParsedTurn(content=data["content"], items=items)


# ---- rendering --------------------------------------------------------------------------------
def _written_ai(message: AIMessage, string_arguments: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": text_of(message.content)}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call["id"],
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": json.dumps(call["args"]) if string_arguments else call["args"],
                },
            }
            for call in message.tool_calls
        ]
    return out


def to_chat_dict(message: BaseMessage, *, string_arguments: bool = True) -> dict[str, Any]:
    """One message on its own: a sampled turn as its text, a tool message as its content
    with its ``tool_call_id`` (and ``name`` where set). ``to_chat_dicts`` renders a
    conversation in the rollout's format."""
    if isinstance(message, AIMessage):
        state = message.response_metadata.get(METADATA_KEY)
        if state is not None:  # sampled by the token chat model: render what was sampled
            return {"role": "assistant", "content": state["text"]}
        return _written_ai(message, string_arguments)
    if isinstance(message, HumanMessage):
        return {"role": "user", "content": text_of(message.content)}
    if isinstance(message, SystemMessage):
        return {"role": "system", "content": text_of(message.content)}
    if isinstance(message, ToolMessage):
        out = {
            "role": "tool",
            "content": text_of(message.content),
            "tool_call_id": message.tool_call_id,
        }
        if message.name:
            out["name"] = message.name
        return out
    if isinstance(message, ChatMessage):
        return {"role": message.role, "content": text_of(message.content)}
    raise ValueError(
        f"cannot render a {type(message).__name__} with the chat template; use system, human, "
        "ai or tool messages"
    )


def _ai(
    message: AIMessage, chat_format: ChatFormat | None, string_arguments: bool
) -> tuple[dict[str, Any], _Answers]:
    """The history message of an AI message and what its tool messages answer."""
    state = message.response_metadata.get(METADATA_KEY)
    if state is None:
        out = _written_ai(message, string_arguments)
        answers: _Answers = {
            call["id"]: (i, ToolCall(call["name"], call["args"], ""), out)
            for i, call in enumerate(message.tool_calls)
            if call["id"]
        }
        return out, answers
    text = state["text"]
    parsed = (
        parsed_from_state(state["parsed"])
        if state.get("parsed") is not None
        else ParsedTurn(content=text)
    )
    build = chat_format.assistant_message if chat_format is not None else content_message
    out = build(text, parsed)
    order = state.get("call_order") or []
    if len(order) != len(parsed.items):
        raise ValueError(
            f"the model turn's metadata lists {len(order)} call id(s) for "
            f"{len(parsed.items)} parsed call(s): it was changed after sampling"
        )
    pairs = enumerate(zip(order, parsed.items, strict=True))
    return out, {call_id: (i, item, out) for i, (call_id, item) in pairs}


def to_chat_dicts(
    messages: Sequence[BaseMessage],
    chat_format: ChatFormat | None = None,
    *,
    string_arguments: bool = True,
) -> list[dict[str, Any]]:
    """One chat dict per message, in ``chat_format`` (None: sampled turns as their text and
    plain tool messages, the hermes rendering). A tool message whose ``tool_call_id`` is
    one of the latest AI message's calls is built by the format's ``tool_message`` for that
    call; any other renders on its own (``to_chat_dict``). ``string_arguments``: written
    calls' arguments as JSON text (``takes_string_arguments``) rather than the dict."""
    tool_message = chat_format.tool_message if chat_format is not None else plain_tool_message
    out: list[dict[str, Any]] = []
    answers: _Answers = {}
    for message in messages:
        if isinstance(message, AIMessage):
            rendered, answers = _ai(message, chat_format, string_arguments)
            out.append(rendered)
        elif isinstance(message, ToolMessage) and message.tool_call_id in answers:
            index, item, assistant = answers[message.tool_call_id]
            out.append(tool_message(text_of(message.content), item, index, assistant))
        else:
            out.append(to_chat_dict(message, string_arguments=string_arguments))
    return out


def from_chat_dicts(messages: Sequence[dict[str, Any]]) -> list[BaseMessage]:
    """A dataset row's ``raw_prompt`` as LangChain messages."""
    return list(convert_to_messages(list(messages)))
