"""LangChain messages <-> the chat-template dicts the token trajectory is rendered from.

A model turn the token chat model sampled renders as the exact text it sampled (tool-call
blocks included), so the template sees the same conversation ``tool_agent`` would; tool
messages render as ``{"role": "tool", "content": ...}`` as in ``tool_agent``.
"""

from __future__ import annotations

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

__all__ = ["METADATA_KEY", "from_chat_dicts", "text_of", "to_chat_dict", "to_chat_dicts"]

METADATA_KEY = "agentloop"
"""``AIMessage.response_metadata[METADATA_KEY]``: the token trajectory up to that turn."""


def text_of(content: str | list[Any]) -> str:
    """Message content as text (content blocks: their text parts joined)."""
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        else:
            raise ValueError(
                f"message content block {block!r} is not text; the token chat model renders "
                "text messages only"
            )
    return "".join(parts)


def to_chat_dict(message: BaseMessage) -> dict[str, Any]:
    if isinstance(message, AIMessage):
        state = message.response_metadata.get(METADATA_KEY)
        if state is not None:  # sampled by the token chat model: render what was sampled
            return {"role": "assistant", "content": state["text"]}
        out: dict[str, Any] = {"role": "assistant", "content": text_of(message.content)}
        if message.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": json.dumps(call["args"])},
                }
                for call in message.tool_calls
            ]
        return out
    if isinstance(message, HumanMessage):
        return {"role": "user", "content": text_of(message.content)}
    if isinstance(message, SystemMessage):
        return {"role": "system", "content": text_of(message.content)}
    if isinstance(message, ToolMessage):
        return {"role": "tool", "content": text_of(message.content)}
    if isinstance(message, ChatMessage):
        return {"role": message.role, "content": text_of(message.content)}
    raise ValueError(
        f"cannot render a {type(message).__name__} with the chat template; use system, human, "
        "ai or tool messages"
    )


def to_chat_dicts(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    return [to_chat_dict(m) for m in messages]


def from_chat_dicts(messages: Sequence[dict[str, Any]]) -> list[BaseMessage]:
    """A dataset row's ``raw_prompt`` as LangChain messages."""
    return list(convert_to_messages(list(messages)))
