"""gpt-oss (Harmony): a model turn is a sequence of messages ``<|channel|>CHANNEL<|message|>
TEXT<|end|>``, each after the first opened by ``<|start|>assistant``. Reasoning goes to the
``analysis`` channel, a tool call is a ``commentary`` message addressed ``to=functions.NAME``
(in the header before or after the channel) whose text is the JSON arguments and which ends
with ``<|call|>``; a final answer is a ``final`` message ending with ``<|return|>``. Tool
results are ``functions.NAME`` messages addressed ``to=assistant``.

``<|end|>`` closes a message inside a turn, so only ``<|call|>`` (tools run) and
``<|return|>`` (the conversation ends) end a turn and stop the engine.

vLLM reads Harmony from o200k token ids with ``openai_harmony`` and keeps invalid JSON as
argument text (no per-call errors), so this parser reads the decoded turn text itself.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from agentloop.formats.base import ChatFormat, register_format
from agentloop.parsers import ParsedTurn, ToolCall, ToolCallError, loads_tolerant, object_call

__all__ = [
    "GPT_OSS",
    "GptOssToolParser",
    "HarmonyMessage",
    "UNNAMED_TOOL",
    "harmony_assistant_message",
    "harmony_history_rewrite",
    "harmony_tool_message",
    "split_messages",
]

START, END, CALL, RETURN = "<|start|>", "<|end|>", "<|call|>", "<|return|>"
MESSAGE, CHANNEL, CONSTRAIN = "<|message|>", "<|channel|>", "<|constrain|>"
UNNAMED_TOOL = "unknown"
"""Function name the history gives a call that named none (its error still gets answered)."""

CALL_HINT = (
    "address a commentary message to=functions.<tool name> and write its arguments as one "
    "JSON object"
)
_TERMINATOR = re.compile(r"<\|(?:end|call|return)\|>")
_ROLE = re.compile(r"\s*([^\s<]+)")
_RECIPIENT = re.compile(r"(?<![^\s>])to=([^\s<]*)")
_CHANNEL = re.compile(r"<\|channel\|>\s*([^\s<]*)")
_CONSTRAIN = re.compile(r"<\|constrain\|>\s*([^\s<]*)")
_ANALYSIS = re.compile(
    r"<\|start\|>assistant<\|channel\|>analysis<\|message\|>(?:(?!<\|end\|>).)*<\|end\|>",
    re.DOTALL,
)


@dataclass(frozen=True, slots=True)
class HarmonyMessage:
    """One message of a sampled turn."""

    role: str
    channel: str | None
    recipient: str | None
    constrain: str | None
    """The ``<|constrain|>`` content type (``json`` for tool calls), if written."""
    body: str
    end: str | None
    """``<|end|>``, ``<|call|>`` or ``<|return|>``; None where the text ended first (the
    turn's own end token is not part of the decoded text)."""

    @property
    def is_call(self) -> bool:
        """Addressed to a tool (a recipient other than the assistant)."""
        return self.role == "assistant" and bool(self.recipient) and self.recipient != "assistant"

    @property
    def attempts_call(self) -> bool:
        """A call, or a message written like one without a recipient: it ends with
        ``<|call|>`` or is constrained to a content type."""
        return self.is_call or self.end == CALL or self.constrain is not None


def _header(role: str, header: str, body: str, end: str | None) -> HarmonyMessage:
    recipient = _RECIPIENT.search(header)
    channel = _CHANNEL.search(header)
    constrain = _CONSTRAIN.search(header)
    return HarmonyMessage(
        role=role,
        channel=channel.group(1) if channel else None,
        recipient=recipient.group(1) if recipient else None,
        constrain=constrain.group(1) if constrain else None,
        body=body,
        end=end,
    )


def split_messages(text: str) -> list[HarmonyMessage]:
    """The messages of a turn's decoded text (special tokens kept), which starts right after
    the generation prompt ``<|start|>assistant``. Text outside any message header (a model
    that skipped the format) is a message without channel."""
    messages: list[HarmonyMessage] = []
    for position, segment in enumerate(text.split(START)):
        role = "assistant"  # the generation prompt's; a header without a role is one too
        if position and (match := _ROLE.match(segment)):
            role, segment = match.group(1), segment[match.end() :]
        if not segment.strip():
            continue
        header, found, rest = segment.partition(MESSAGE)
        if not found:
            if CHANNEL in segment or _RECIPIENT.match(segment.lstrip()):
                messages.append(_header(role, segment, "", None))
            else:
                messages.append(HarmonyMessage(role, None, None, None, segment, None))
            continue
        end = _TERMINATOR.search(rest)
        body = rest[: end.start()] if end else rest
        messages.append(_header(role, header, body, end.group() if end else None))
        trailing = rest[end.end() :] if end else ""
        if trailing.strip():
            messages.append(HarmonyMessage(role, None, None, None, trailing, None))
    return messages


class GptOssToolParser:
    """Tool calls of a gpt-oss turn: every assistant message addressed to a recipient other
    than ``assistant`` is one call (``functions.NAME`` -> ``NAME``; other namespaces such as
    ``browser.search`` keep the full recipient, which ``check_calls`` reports as unknown); its
    text is the JSON object of arguments (empty: no arguments). A message that ends with
    ``<|call|>`` or is constrained to a content type but has no recipient is a
    ``missing_name`` error. ``content`` joins the commentary and final texts; reasoning
    (``analysis``) and messages of other roles are not content.
    ``repair=False`` parses the JSON strictly, as the served endpoint does."""

    def __init__(self, repair: bool = True) -> None:
        self.repair = repair

    def parse(self, text: str) -> ParsedTurn:
        items: list[ToolCall | ToolCallError] = []
        content: list[str] = []
        for message in split_messages(text):
            if message.role != "assistant":
                continue
            if message.attempts_call:
                items.append(self._read(message, len(items) + 1))
            elif message.channel != "analysis" and message.body.strip():
                content.append(message.body)
        return ParsedTurn(content="\n".join(content).strip(), items=items)

    def _read(self, message: HarmonyMessage, index: int) -> ToolCall | ToolCallError:
        raw = message.body
        name = (message.recipient or "").removeprefix("functions.")
        if not message.is_call or not name:
            return ToolCallError(
                "missing_name", f"tool call {index} names no function; {CALL_HINT}", raw
            )
        if not raw.strip():
            return ToolCall(name=name, arguments={}, raw=raw)
        try:
            args, repaired = loads_tolerant(raw.strip(), self.repair)
        except json.JSONDecodeError as exc:
            return ToolCallError(
                "bad_json",
                f"tool call {index} ({name}) is not valid JSON ({exc.msg} at char {exc.pos}); "
                f"{CALL_HINT}",
                raw,
                name,
            )
        return object_call(name, args, raw, index, repaired)


def harmony_assistant_message(text: str, parsed: ParsedTurn) -> dict[str, Any]:
    """The history message of a sampled turn, in the fields the gpt-oss template reads:
    ``thinking`` (the analysis texts), ``tool_calls`` (one per parsed item; an error keeps
    its name, or ``UNNAMED_TOOL``, and its raw text as arguments) and ``content`` (the
    commentary/final texts as sampled; empty when there is analysis, as the template takes
    one or the other). The template renders a message's first call only and names every
    result after it: a gpt-oss turn holds one call, as ``<|call|>`` ends it. A turn without
    calls gets no ``thinking``: the template drops a final answer's analysis once later
    messages exist, and leaving it out keeps the history's ``<|end|>`` count the same before
    and after they are added."""
    messages = [m for m in split_messages(text) if m.role == "assistant"]
    thinking = "\n".join(m.body for m in messages if m.channel == "analysis" and not m.is_call)
    answer = "\n".join(m.body for m in messages if m.channel != "analysis" and not m.attempts_call)
    if not parsed.items:
        return {"role": "assistant", "content": answer}
    calls = [
        {
            "type": "function",
            "function": {
                "name": item.name or UNNAMED_TOOL,
                "arguments": item.arguments if isinstance(item, ToolCall) else item.raw,
            },
        }
        for item in parsed.items
    ]
    if thinking:
        return {"role": "assistant", "content": "", "thinking": thinking, "tool_calls": calls}
    return {"role": "assistant", "content": answer, "tool_calls": calls}


def harmony_tool_message(
    content: str, item: ToolCall | ToolCallError, index: int, assistant: dict[str, Any]
) -> dict[str, Any]:
    """``{"role": "tool", "name": NAME, "content": ...}``. The gpt-oss template names the
    result ``functions.NAME`` after the turn's (first) call; ``name`` serves renderers that
    read it from the tool message."""
    return {"role": "tool", "name": item.name or UNNAMED_TOOL, "content": content}


def harmony_history_rewrite(text: str) -> str:
    """Rendered history in the form the template gives it once later messages exist:
    analysis messages dropped (a final answer's once it is not last, a tool-call turn's once
    a final answer follows) and ``<|return|>`` rendered as ``<|end|>``."""
    return _ANALYSIS.sub("", text).replace(RETURN, END)


GPT_OSS = register_format(
    ChatFormat(
        name="gpt-oss",  # verl's name
        family="gpt-oss (Harmony)",
        call_syntax=(
            "<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>"
        ),
        aliases=("harmony", "openai"),  # vLLM's tool-parser name is "openai"
        parser=GptOssToolParser,
        end_tokens=(CALL, RETURN),
        call_end_tokens=(CALL,),
        delta_end_tokens=(END, CALL, RETURN),
        template_markers=(START, CHANNEL, CALL),
        assistant_message=harmony_assistant_message,
        tool_message=harmony_tool_message,
        history_rewrite=harmony_history_rewrite,
        notes=(
            "A turn ends with <|call|> (its tool call runs) or <|return|> (final); <|end|> "
            "closes messages inside a turn. The template drops the analysis of tool-call "
            "turns once a final answer follows and renders an earlier final answer with "
            "<|end|> and without its analysis; the trajectory keeps every turn as sampled."
        ),
    )
)
