"""Mistral tool calls (``mistral``): Mistral-7B-Instruct-v0.3 and the other tokenizer-v3
models (Mixtral-8x22B, Codestral, Mistral-Large-2407, Mistral-Nemo with tekken spacing).
Tokenizer v7 and later write tool results differently: their templates select the
``mistral_v7`` variant (``agentloop.formats.mistral_v7``), which shares this parser.

A calling turn is ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`` closed by
``</s>`` (the eos); newer tokenizers (v11+) write ``[TOOL_CALLS]name[ARGS]{...}`` per call,
which is parsed too. The template needs structured ``tool_calls`` with 9-alphanumeric ids
and one ``tool`` message per call carrying the matching ``tool_call_id``; it renders each
result as ``[TOOL_RESULTS] {"content": <content>, "call_id": ...}[/TOOL_RESULTS]``, so the
tool message's content is the JSON value text ``mistral_common`` writes there (JSON output
re-serialized, other text as a JSON string). The tool list and the system prompt go before
and into the *last* user message: a new user message moves them (``history_rewrite``).

vLLM's ``mistral`` extraction is not reused: it drops every call of a turn when the JSON
list does not parse, and here each malformed call must become its own error.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from agentloop.formats.base import ChatFormat, register_format
from agentloop.parsers import (
    ParsedTurn,
    ToolCall,
    ToolCallError,
    bracket_end,
    loads_json,
    loads_tolerant,
    object_call,
    read_json_call,
    split_top,
)

__all__ = ["MISTRAL", "TOOLS_BLOCK", "MistralToolParser", "mistral_tool_content", "tool_reply"]

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
CALL_HINT = (
    'write a JSON list of {"name": <tool name>, "arguments": {...}} objects right after the '
    "tool-calls token"
)
_ALNUM = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_ID = re.compile(r"[A-Za-z0-9]{9}")
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SAMPLED_CALL_ID = re.compile(re.escape(CALL_ID) + r"\s*([A-Za-z0-9]{9})\s*" + re.escape(ARGS))
_BRACKET = re.compile(r"[\[{]")
TOOLS_BLOCK = re.compile(r"\[AVAILABLE_TOOLS\].*?\[/AVAILABLE_TOOLS\]", re.DOTALL)
_LAST_INST = re.compile(r"\[INST\](?!.*\[INST\]).*?\[/INST\]", re.DOTALL)


# ---- scanning JSON values -------------------------------------------------------------------
def _list_items(text: str) -> tuple[list[str], str]:
    """The items of the JSON list ``text`` starts with (or of the comma-separated objects
    it starts with), as text, and the text after them. An unclosed list runs to the end."""
    start = len(text) - len(text.lstrip())
    if text[start] == "[":
        end, closed = bracket_end(text, start)
        items = split_top(text[start + 1 : end - 1 if closed else end])
        if len(items) == 1 and not items[0].strip():
            items = []  # "[]": no calls
        return items, text[end:]
    items, pos = [], start
    while True:  # objects without the enclosing list
        end, _ = bracket_end(text, pos)
        items.append(text[pos:end])
        after = len(text) - len(text[end:].lstrip())
        if not text.startswith(",", after):
            return items, text[end:]
        pos = len(text) - len(text[after + 1 :].lstrip())
        if not text.startswith("{", pos):
            return items, text[after + 1 :]


# ---- parser ---------------------------------------------------------------------------------
class MistralToolParser:
    """``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`` (tokenizer v3) and
    ``[TOOL_CALLS]name[ARGS]{...}`` (v11+, also ``name[CALL_ID]id[ARGS]{...}``), one call
    per ``[TOOL_CALLS]`` there. Each list item is read on its own, so one malformed call is
    one error and the others are kept; an unclosed final list or object is still read.
    ``repair=False`` parses the JSON strictly, as the served endpoint does."""

    def __init__(self, repair: bool = True) -> None:
        self.repair = repair

    def parse(self, text: str) -> ParsedTurn:
        head, *segments = text.split(TOOL_CALLS)
        content = [head]
        found: list[tuple[str, str | None, str]] = []  # (raw, [ARGS] name, arguments text)
        for segment in segments:
            content.append(self._segment(segment, found))
        items = [self._read(*call, index) for index, call in enumerate(found, start=1)]
        if segments and not found and not "".join(segments).strip():
            empty = "the tool-calls token is not followed by a call"
            items.append(ToolCallError("bad_json", f"{empty}; {CALL_HINT}", ""))
        return ParsedTurn(content="".join(content).strip(), items=items)

    def _segment(self, segment: str, found: list[tuple[str, str | None, str]]) -> str:
        """Collects the calls written after one ``[TOOL_CALLS]``; returns the rest."""
        stripped = segment.strip()
        if not stripped:
            return ""
        name_part = segment.split(ARGS, 1)[0]
        if ARGS in segment and not _BRACKET.search(name_part.replace(CALL_ID, "")):
            return self._named(segment, found)
        if stripped[0] in "[{":
            items, rest = _list_items(segment)
            for item in items:
                if item.strip() or not self.repair:  # "[{...},]": a stray comma
                    found.append((item.strip(), None, ""))
            return rest
        found.append((stripped, None, ""))  # not a call list: an error
        return ""

    @staticmethod
    def _named(segment: str, found: list[tuple[str, str | None, str]]) -> str:
        """``name[ARGS]{...}`` (v11+); returns the text after the arguments."""
        name_part, args = segment.split(ARGS, 1)
        start = len(args) - len(args.lstrip())
        end = bracket_end(args, start)[0] if args[start : start + 1] in ("{", "[") else len(args)
        raw = (name_part + ARGS + args[:end]).strip()
        found.append((raw, name_part.split(CALL_ID, 1)[0].strip(), args[:end].strip()))
        return args[end:]

    def _read(
        self, raw: str, name: str | None, args_text: str, index: int
    ) -> ToolCall | ToolCallError:
        if name is None:
            if not raw:
                return ToolCallError(
                    "bad_json", f"tool call {index} is empty (a stray comma); {CALL_HINT}", raw
                )
            return read_json_call(raw, index, self.repair, CALL_HINT)
        if not name:
            return ToolCallError("missing_name", f"tool call {index} has no name", raw)
        try:
            args, repaired = loads_tolerant(args_text, self.repair)
        except json.JSONDecodeError as exc:
            return ToolCallError(
                "bad_arguments",
                f"arguments of tool call {index} ({name}) are not valid JSON "
                f"({exc.msg} at char {exc.pos})",
                raw,
                name,
            )
        return object_call(name, args, raw, index, repaired)


# ---- history messages -----------------------------------------------------------------------
def _generated_id(text: str, index: int) -> str:
    """A 9-alphanumeric call id fixed by the turn's text and the call's position."""
    number = int.from_bytes(hashlib.sha256(f"{index}\0{text}".encode()).digest()[:8], "big")
    chars = []
    for _ in range(9):
        number, digit = divmod(number, len(_ALNUM))
        chars.append(_ALNUM[digit])
    return "".join(chars)


def _sampled_id(raw: str) -> str | None:
    """The id the model wrote for a call, when it is a valid one."""
    if match := _SAMPLED_CALL_ID.search(raw):
        return match.group(1)
    try:
        obj, _ = loads_tolerant(raw)
    except json.JSONDecodeError:
        return None
    found = obj.get("id") if isinstance(obj, dict) else None
    return found if isinstance(found, str) and _ID.fullmatch(found) else None


def assistant_message(text: str, parsed: ParsedTurn) -> dict[str, Any]:
    """The model turn with one structured call per parsed item (errors included, with no
    arguments, so each has a result to answer it); ids are the model's own where it wrote
    valid ones, else derived from the turn's text. Content is left out: the v3 format has
    calls or content in a turn, and the trajectory keeps the sampled text anyway."""
    if not parsed.items:
        return {"role": "assistant", "content": text}
    calls: list[dict[str, Any]] = []
    used: set[str] = set()
    for index, item in enumerate(parsed.items):
        call_id = _sampled_id(item.raw)
        if call_id is None or call_id in used:
            call_id = _generated_id(text, index)
        used.add(call_id)
        name = item.name if item.name and _NAME.fullmatch(item.name) else "invalid_call"
        arguments = item.arguments if isinstance(item, ToolCall) else {}
        calls.append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        )
    return {"role": "assistant", "content": "", "tool_calls": calls}


def mistral_tool_content(content: str) -> str:
    """The JSON value ``mistral_common``'s v3 encoder writes as a tool result's
    ``"content"``: JSON output re-serialized, empty output as ``{}``, any other text as a
    JSON string (v7+ encoders write the text as given: ``mistral_v7``)."""
    if not content:
        return "{}"
    try:
        return json.dumps(loads_json(content), ensure_ascii=False)
    except json.JSONDecodeError:
        return json.dumps(content, ensure_ascii=False)


def tool_reply(text: str, index: int, assistant: dict[str, Any]) -> dict[str, Any]:
    """The tool message answering call ``index`` of ``assistant``: its id and name, ``text``."""
    call = assistant["tool_calls"][index]
    return {
        "role": "tool",
        "tool_call_id": call["id"],
        "name": call["function"]["name"],
        "content": text,
    }


def tool_message(
    content: str, item: ToolCall | ToolCallError, index: int, assistant: dict[str, Any]
) -> dict[str, Any]:
    """The result of call ``index``: its id and name, content as the JSON value text."""
    return tool_reply(mistral_tool_content(content), index, assistant)


def prompt_parts_moved(text: str) -> str:
    """Rendered history without what a new user message moves: the tool list and the last
    user message's text (where the system prompt is prepended)."""
    return _LAST_INST.sub("[INST][/INST]", TOOLS_BLOCK.sub("", text))


MISTRAL = register_format(
    ChatFormat(
        name="mistral",
        family=(
            "Mistral tokenizer v3 (Mistral-7B-Instruct-v0.3, Mixtral-8x22B, Codestral, "
            "Mistral-Large-2407, Mistral-Nemo)"
        ),
        call_syntax=(
            '[TOOL_CALLS] [{"name": ..., "arguments": {...}}] or [TOOL_CALLS]name[ARGS]{...}'
        ),
        parser=MistralToolParser,
        end_tokens=("</s>",),
        template_markers=("[INST]", "[TOOL_CALLS]"),
        assistant_message=assistant_message,
        tool_message=tool_message,
        history_rewrite=prompt_parts_moved,
        notes=(
            "Tool results are the v3 JSON object, content re-serialized as a JSON value. Tool "
            "turns extend the rendering exactly; a new user message moves the tool list "
            "and the system prompt to it (mistral_common's placement), and the trajectory "
            "keeps them where the model saw them."
        ),
    )
)
