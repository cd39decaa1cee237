"""Hermes tool calls (Qwen2.5, Qwen3, Hermes, SmolLM2-style ChatML templates):
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, turns closed by
``<|im_end|>``, tool results as ``tool`` messages the template wraps in
``<tool_response>``."""

from __future__ import annotations

from agentloop.formats.base import ChatFormat, register_format
from agentloop.parsers import HermesToolParser

__all__ = ["HERMES"]

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
