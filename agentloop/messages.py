"""Chat-message helpers shared by the LangGraph chat model and the session gateway."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["takes_string_arguments", "text_of"]

_STRING_ARGUMENTS = re.compile(r"arguments\s+is\s+string")


def text_of(content: str | list[Any]) -> str:
    """Message content as text (content blocks: their text parts joined)."""
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") in ("text", "input_text", "output_text"):
            parts.append(str(block.get("text", "")))
        else:
            raise ValueError(
                f"message content block {block!r} is not text; only text messages can be "
                "rendered into a token trajectory"
            )
    return "".join(parts)


def takes_string_arguments(chat_template: str | dict[str, str] | None) -> bool:
    """The chat template renders a tool call's ``arguments`` given as a JSON string verbatim
    (it tests ``arguments is string``); other templates need the dict."""
    if isinstance(chat_template, dict):
        chat_template = chat_template.get("tool_use") or chat_template.get("default")
    return bool(chat_template) and _STRING_ARGUMENTS.search(chat_template) is not None
