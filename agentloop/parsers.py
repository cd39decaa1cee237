"""What every tool-call parser shares, whatever the model family's syntax.

A parser turns the decoded text of one model turn into an ordered list of calls and errors.
Every failure is a structured ``ToolCallError`` that becomes the tool message the model sees,
so a malformed call costs the model a turn, never the rollout. ``check_calls`` adds the errors
that need the tool set: unknown tool, arguments failing the tool's JSON schema.

The parsers themselves live beside their chat formats in ``agentloop.formats`` (one module per
family, Hermes included), so the one registry of formats is also the one of parsers; this
module holds the format-independent parts they are built from: the result types, tolerant
JSON, scanning JSON text, and the checks against the tool set.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import jsonschema

__all__ = [
    "ParsedTurn",
    "ToolCall",
    "ToolCallError",
    "ToolCallParser",
    "bracket_end",
    "check_calls",
    "json_kind",
    "loads_json",
    "read_json_call",
    "limit_calls",
    "loads_tolerant",
    "object_call",
    "split_top",
]

ErrorKind = Literal[
    "bad_json", "missing_name", "bad_arguments", "unknown_tool", "schema", "too_many_calls"
]


@dataclass(slots=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    raw: str
    """The text between the call tags, as sampled."""
    repaired: bool = False
    """The JSON only parsed after repair (trailing comma, single quotes, unclosed braces)."""


@dataclass(slots=True)
class ToolCallError:
    kind: ErrorKind
    message: str
    raw: str
    name: str | None = None

    def to_message(self) -> dict[str, str]:
        """The tool message the model sees instead of a result."""
        return {"role": "tool", "content": f"Error: {self.message}"}


@dataclass(slots=True)
class ParsedTurn:
    content: str
    """Text of the turn outside the call blocks."""
    items: list[ToolCall | ToolCallError] = field(default_factory=list)
    """Calls and errors in the order they appear in the turn."""

    @property
    def calls(self) -> list[ToolCall]:
        return [i for i in self.items if isinstance(i, ToolCall)]

    @property
    def errors(self) -> list[ToolCallError]:
        return [i for i in self.items if isinstance(i, ToolCallError)]


class ToolCallParser(Protocol):
    def parse(self, text: str) -> ParsedTurn: ...


# ---- tolerant JSON ----------------------------------------------------------------------------
_PY_LITERALS = {"True": "true", "False": "false", "None": "null"}


def _repair(text: str) -> str:
    """Fix the common slips of small models: single-quoted strings, Python literals, trailing
    commas, and unclosed strings/braces at the end."""
    out: list[str] = []
    stack: list[str] = []
    quote: str | None = None
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if quote:
            if ch == "\\" and i + 1 < n:
                nxt = text[i + 1]
                out.append("'" if quote == "'" and nxt == "'" else ch + nxt)
                i += 2
                continue
            if ch == quote:
                out.append('"')
                quote = None
            elif ch == '"':  # a double quote inside a single-quoted string
                out.append('\\"')
            else:
                out.append(ch)
        elif ch in "\"'":
            quote = ch
            out.append('"')
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
            out.append(ch)
        elif ch in "}]":
            _drop_trailing_comma(out)
            if stack:
                stack.pop()
            out.append(ch)
        elif ch.isalpha():
            j = i
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            word = text[i:j]
            out.append(_PY_LITERALS.get(word, word))
            i = j
            continue
        else:
            out.append(ch)
        i += 1
    if quote:
        out.append('"')
    _drop_trailing_comma(out)
    out.extend(reversed(stack))
    return "".join(out)


def _drop_trailing_comma(out: list[str]) -> None:
    j = len(out) - 1
    while j >= 0 and out[j].isspace():
        j -= 1
    if j >= 0 and out[j] == ",":
        del out[j]


def loads_json(text: str) -> Any:
    """``json.loads`` whose every failure is a ``json.JSONDecodeError``: model text can also
    nest past the decoder's recursion limit or hold an integer over Python's digit limit."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text, 0) from None
    except ValueError:  # int("1" * 5000): Python's limit on integer digits
        raise json.JSONDecodeError("a number has too many digits", text, 0) from None


def loads_tolerant(text: str, repair: bool = True) -> tuple[Any, bool]:
    """``json.loads``; on failure retry once on a repaired copy (with ``repair``). Returns
    (value, repaired) or raises the original ``json.JSONDecodeError``."""
    try:
        return loads_json(text), False
    except json.JSONDecodeError as first:
        if not repair:
            raise
        try:
            return loads_json(_repair(text)), True
        except json.JSONDecodeError:
            raise first from None


# ---- call objects ---------------------------------------------------------------------------
def read_json_call(raw: str, index: int, repair: bool, hint: str) -> ToolCall | ToolCallError:
    """One call object ``{"name", "arguments"|"parameters"}``; ``hint`` (how to write a
    call in the family's syntax) ends the messages of malformed ones."""
    try:
        obj, repaired = loads_tolerant(raw, repair)
    except json.JSONDecodeError as exc:
        return ToolCallError(
            "bad_json",
            f"tool call {index} is not valid JSON ({exc.msg} at char {exc.pos}); {hint}",
            raw,
        )
    if not isinstance(obj, dict):
        return ToolCallError(
            "bad_json",
            f"tool call {index} must be a JSON object, got {json_kind(obj)}; {hint}",
            raw,
        )
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCallError("missing_name", f'tool call {index} has no "name"; {hint}', raw)
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # OpenAI style: arguments as a JSON string
        try:
            args, again = loads_tolerant(args, repair) if args.strip() else ({}, False)
            repaired = repaired or again
        except json.JSONDecodeError as exc:
            return ToolCallError(
                "bad_arguments",
                f"arguments of tool call {index} ({name}) are not valid JSON ({exc.msg})",
                raw,
                name,
            )
    if args is None:
        args = {}
    return object_call(name, args, raw, index, repaired)


def object_call(
    name: str, args: Any, raw: str, index: int, repaired: bool = False
) -> ToolCall | ToolCallError:
    """A call whose arguments parsed: a ``ToolCall`` when they are an object, else the
    ``bad_arguments`` error naming what they are."""
    if not isinstance(args, dict):
        return ToolCallError(
            "bad_arguments",
            f"arguments of tool call {index} ({name}) must be a JSON object, got {json_kind(args)}",
            raw,
            name,
        )
    return ToolCall(name=name, arguments=args, raw=raw, repaired=repaired)


def _scan_json(text: str, start: int = 0) -> Iterator[tuple[int, str, int]]:
    """``(index, character, depth)`` for each character of ``text`` from ``start`` that is
    outside strings, ``depth`` the objects/arrays open after it (a closing bracket lowers it
    first). Quote-aware, single quotes too (repair reads them); backslash escapes skipped."""
    depth = 0
    quote: str | None = None
    i = start
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        else:
            depth += (ch in "{[") - (ch in "}]")
            yield i, ch, depth
        i += 1


def bracket_end(text: str, start: int, stop: str = "") -> tuple[int, bool]:
    """(index just past the JSON object/array opening at ``text[start]``, whether it closed).
    An unclosed value ends at a character of ``stop`` (no brackets) outside strings, or at the
    end of ``text``."""
    for i, ch, depth in _scan_json(text, start):
        if ch in "}]" and depth <= 0:
            return i + 1, True
        if ch in stop:
            return i, False
    return len(text), False


def split_top(text: str) -> list[str]:
    """``text`` split at the commas outside strings, objects and arrays."""
    parts, begin = [], 0
    for i, ch, depth in _scan_json(text):
        if ch == "," and depth == 0:
            parts.append(text[begin:i])
            begin = i + 1
    parts.append(text[begin:])
    return parts


def json_kind(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


# ---- checks against the tool set ------------------------------------------------------------
def check_calls(parsed: ParsedTurn, schemas: Mapping[str, dict[str, Any]]) -> ParsedTurn:
    """Turn calls of unknown tools and calls whose arguments fail the tool's parameter schema
    into errors (in place, order kept). ``schemas``: tool name -> OpenAI function schema."""
    for pos, item in enumerate(parsed.items):
        if not isinstance(item, ToolCall):
            continue
        schema = schemas.get(item.name)
        if schema is None:
            known = ", ".join(sorted(schemas)) or "none"
            parsed.items[pos] = ToolCallError(
                "unknown_tool",
                f"unknown tool {item.name!r}; available tools: {known}",
                item.raw,
                item.name,
            )
            continue
        params = schema.get("function", schema).get("parameters") or {"type": "object"}
        error = jsonschema.validators.validator_for(params)(params).iter_errors(item.arguments)
        first = next(iter(sorted(error, key=lambda e: list(e.path))), None)
        if first is not None:
            where = "/".join(map(str, first.path)) or "arguments"
            parsed.items[pos] = ToolCallError(
                "schema",
                f"arguments of {item.name!r} do not match its schema at {where}: {first.message}",
                item.raw,
                item.name,
            )
    return parsed


def limit_calls(parsed: ParsedTurn, limit: int) -> ParsedTurn:
    """Calls after the first ``limit`` of a turn become ``too_many_calls`` errors (in place,
    order kept): they are answered with an error instead of being run."""
    seen = 0
    for pos, item in enumerate(parsed.items):
        if not isinstance(item, ToolCall):
            continue
        seen += 1
        if seen > limit:
            parsed.items[pos] = ToolCallError(
                "too_many_calls",
                f"only {limit} tool call(s) run per turn; call {item.name!r} was skipped",
                item.raw,
                item.name,
            )
    return parsed
