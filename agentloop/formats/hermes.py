"""Hermes tool calls (Qwen2.5, Qwen3, Hermes, SmolLM2-style ChatML templates):
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, turns closed by
``<|im_end|>``, tool results as ``tool`` messages the template wraps in
``<tool_response>``."""

from __future__ import annotations

import re

from agentloop.formats.base import ChatFormat, register_format
from agentloop.parsers import ParsedTurn, ToolCall, ToolCallError, read_json_call

__all__ = ["CALL_HINT", "HERMES", "HermesToolParser"]

CALL_HINT = 'write {"name": <tool name>, "arguments": {...}} inside <tool_call></tool_call>'


class HermesToolParser:
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks (Hermes,
    Qwen2.5/Qwen3). Several per turn; a final block the model did not close is still read.
    ``repair=False`` parses the JSON strictly, as the served endpoint does."""

    _BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def __init__(self, repair: bool = True) -> None:
        self.repair = repair

    def parse(self, text: str) -> ParsedTurn:
        items: list[ToolCall | ToolCallError] = []
        for index, match in enumerate(self._BLOCK.finditer(text), start=1):
            items.append(read_json_call(match.group(1).strip(), index, self.repair, CALL_HINT))
        content = self._BLOCK.sub("", text).strip()
        return ParsedTurn(content=content, items=items)


HERMES = register_format(
    ChatFormat(
        name="hermes",
        family="Qwen2.5, Qwen3, Hermes, SmolLM2 (ChatML)",
        call_syntax='<tool_call>{"name": ..., "arguments": {...}}</tool_call>',
        aliases=("qwen",),  # verl's name for the same format
        parser=HermesToolParser,
        end_tokens=("<|im_end|>",),
        eos_fallback=True,
        template_markers=("<tool_call>",),
        notes=(
            "Qwen3 drops the reasoning (<think> blocks) of assistant turns before the last "
            "user message; the trajectory keeps them as sampled."
        ),
    )
)
