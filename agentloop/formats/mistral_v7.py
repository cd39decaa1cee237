"""Mistral tool calls on tokenizer v7 and later (``mistral_v7``): the tekken-era models
(Mistral Small 3.x, Mistral-Large-2411, Magistral, Devstral), a variant of ``mistral``.

Calls are written and parsed as in ``mistral`` (a ``[TOOL_CALLS]`` JSON list on v7,
``[TOOL_CALLS]name[ARGS]{...}`` on v11+), and the history's calls are the same structured
``tool_calls`` with 9-alphanumeric ids. What changes is the tool result: mistral_common's
v7+ encoders write it as given, ``[TOOL_RESULTS]<id>[TOOL_CONTENT]<content>[/TOOL_RESULTS]``
(v7, v11) or ``[TOOL_RESULTS]<content>[/TOOL_RESULTS]`` (v13+), where the v3 encoder wraps
it in ``{"content": <JSON value>, "call_id": ...}`` and re-serializes JSON output. So the
tool message carries the tool's text unchanged: a JSON-quoted ``"Goethe"`` or a re-spaced
``{"born": ...}`` would be tokens the model never sees at inference.

The template is the version: ``[TOOL_CONTENT]`` (v7, v11) or ``[ARGS]`` (v11+) in a
``mistral`` template selects this format, also when ``multi_turn.format=mistral``. The
system prompt stays where it is (``[SYSTEM_PROMPT]``); the tool list goes before the last
user message up to v11 and before the first from v13 (``history_rewrite`` drops it).
"""

from __future__ import annotations

from typing import Any

from agentloop.formats.base import ChatFormat, register_format
from agentloop.formats.mistral import (
    MISTRAL,
    TOOLS_BLOCK,
    MistralToolParser,
    assistant_message,
    tool_reply,
)
from agentloop.parsers import ToolCall, ToolCallError

__all__ = ["MISTRAL_V7", "tool_list_moved", "tool_message"]


def tool_message(
    content: str, item: ToolCall | ToolCallError, index: int, assistant: dict[str, Any]
) -> dict[str, Any]:
    """The result of call ``index``: its id and name, the tool's text as given."""
    return tool_reply(content, index, assistant)


def tool_list_moved(text: str) -> str:
    """Rendered history without the tool list, which a new user message moves (v7, v11)."""
    return TOOLS_BLOCK.sub("", text)


MISTRAL_V7 = register_format(
    ChatFormat(
        name="mistral_v7",
        family=(
            "Mistral tokenizer v7+ (Mistral Small 3.x, Mistral-Large-2411, Magistral, Devstral)"
        ),
        call_syntax=MISTRAL.call_syntax,
        parser=MistralToolParser,
        end_tokens=("</s>",),
        variant_of="mistral",
        variant_markers=("[TOOL_CONTENT]", "[ARGS]"),
        assistant_message=assistant_message,
        tool_message=tool_message,
        history_rewrite=tool_list_moved,
        notes=(
            "Tool results are written as the tool returned them (mistral_common v7+); the "
            "template of a v7+ model selects it from `mistral`. A new user message moves the "
            "tool list to it (up to v11); the trajectory keeps it where the model saw it."
        ),
    )
)
