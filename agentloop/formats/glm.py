"""GLM-4.5 / GLM-4.6 tool calls (``glm45``, vLLM's parser name; aliases ``glm4.5``, ``glm46``),
and GLM-4.7 (``glm47``, a variant the template selects).

The template (``[gMASK]<sop>``, role headers ``<|system|>``, ``<|user|>``, ``<|assistant|>``,
``<|observation|>``) closes no turn: the model ends its turn by sampling the next header,
``<|observation|>`` to have its calls run, ``<|user|>`` (or ``<|endoftext|>``) to yield, so the
format has ``end_opens_next`` and the tool-result delta starts right after the sampled
``<|observation|>``. A call is ``<tool_call>NAME`` then one ``<arg_key>K</arg_key>``
``<arg_value>V</arg_value>`` pair per argument, then ``</tool_call>``; the template writes
string values raw and other values as JSON. The history keeps a model turn as the text it
sampled, calls included (``content_message``): the template renders it as written (stripped,
``<think></think>`` added where the turn has none) and renders tool results from the ``tool``
role alone, so no structured ``tool_calls`` are needed.

Values: with the tool's schema (``schemas=``) a property typed only ``string`` keeps the raw
text; otherwise a value that is JSON of another type (number, boolean, null, array, object)
is decoded, anything else stays the raw string (``check_calls`` then reports a type the
schema rejects). vLLM's GLM parser is not reused: it is a streaming engine bound to a
tokenizer and a request, and gives no per-call error for a malformed call.

GLM-4.7's template writes no line breaks after headers or inside calls, opens the reasoning
in the generation prompt (``<|assistant|><think>``) and renders the reasoning of turns before
the last user message as a bare ``</think>`` where GLM-4.5/4.6 write ``<think></think>``: the
``glm47`` variant has that rewrite, the rest is ``glm45``'s. Its template is recognized by
``{{ '</think>' }}`` (a bare end of reasoning; 4.5/4.6 write ``<think></think>``) or the
tool prompt's ``<tool_call>{function-name}<arg_key>`` (no line break after the name).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from agentloop.formats.base import ChatFormat, content_message, register_format
from agentloop.parsers import ParsedTurn, ToolCall, ToolCallError, loads_tolerant

__all__ = ["GLM45", "GLM47", "GlmToolParser", "drop_earlier_reasoning", "empty_earlier_reasoning"]

GLM_HINT = (
    "write <tool_call>NAME, then <arg_key>KEY</arg_key><arg_value>VALUE</arg_value> for each "
    "argument, then </tool_call>"
)

# A call block ends at </tool_call>, else before the next <tool_call> or at the end (unclosed).
_BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|(?=<tool_call>)|\Z)", re.DOTALL)
_NOT_TAG = r"(?:(?!</?arg_(?:key|value)>).)*?"
_PAIR = re.compile(
    rf"\s*<arg_key>({_NOT_TAG})</arg_key>\s*<arg_value>({_NOT_TAG})</arg_value>", re.DOTALL
)
_NAME = re.compile(r"[^\s<>]+")
_REASONING = re.compile(r"<think>(?:(?!<think>).)*?</think>", re.DOTALL)
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
    "array": (list,),
    "object": (dict,),
}


class GlmToolParser:
    """``<tool_call>NAME\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>\\n</tool_call>``
    blocks (several per turn; the line break after NAME is optional, as GLM-4.7 writes it).
    Calls are read after the turn's reasoning (text up to the last ``</think>`` is reasoning,
    as the template splits it). ``repair`` reads a block the model did not close and repairs
    JSON-looking array/object values; ``repair=False`` makes an unclosed block an error.
    ``schemas`` (tool name -> OpenAI function schema) types the values per property."""

    def __init__(
        self, repair: bool = True, schemas: Mapping[str, dict[str, Any]] | None = None
    ) -> None:
        self.repair = repair
        self.schemas = dict(schemas or {})

    def parse(self, text: str) -> ParsedTurn:
        end = text.rfind("</think>")
        split = end + len("</think>") if end >= 0 else 0
        reasoning, rest = text[:split], text[split:]
        items: list[ToolCall | ToolCallError] = []
        for index, match in enumerate(_BLOCK.finditer(rest), start=1):
            closed = match.group(2) == "</tool_call>"
            items.append(self._read(match.group(1), index, closed))
        content = (reasoning + _BLOCK.sub("", rest)).strip()
        return ParsedTurn(content=content, items=items)

    def _read(self, body: str, index: int, closed: bool) -> ToolCall | ToolCallError:
        raw = body.strip()
        head, tag, rest = body.partition("<arg_key>")
        name = head.strip()
        if not name:
            return ToolCallError(
                "missing_name", f"tool call {index} has no function name; {GLM_HINT}", raw
            )
        if not _NAME.fullmatch(name):
            return ToolCallError(
                "missing_name",
                f"tool call {index} does not start with a function name (got {name[:40]!r}); "
                f"{GLM_HINT}",
                raw,
            )
        if not closed and not self.repair:
            return ToolCallError(
                "bad_arguments",
                f"tool call {index} ({name}) is not closed with </tool_call>; {GLM_HINT}",
                raw,
                name,
            )
        properties = _properties(self.schemas.get(name))
        arguments: dict[str, Any] = {}
        repaired = not closed
        rest = tag + rest
        pos = 0
        while (pair := _PAIR.match(rest, pos)) is not None:
            key = pair.group(1).strip()
            if not key or key in arguments:
                problem = "an empty argument name" if not key else f"argument {key!r} twice"
                return ToolCallError(
                    "bad_arguments", f"tool call {index} ({name}) has {problem}", raw, name
                )
            value, fixed = self._value(pair.group(2), properties.get(key))
            arguments[key] = value
            repaired = repaired or fixed
            pos = pair.end()
        stray = rest[pos:].strip()
        if stray:
            return ToolCallError(
                "bad_arguments",
                f"tool call {index} ({name}) has text outside its <arg_key>/<arg_value> pairs "
                f"({stray[:40]!r}); {GLM_HINT}",
                raw,
                name,
            )
        return ToolCall(name=name, arguments=arguments, raw=raw, repaired=repaired)

    def _value(self, raw: str, schema: Any) -> tuple[Any, bool]:
        """The argument value and whether it took JSON repair."""
        types = _types(schema)
        text = raw.strip()
        if types == {"string"} or not text:
            return raw, False
        repaired = False
        try:
            value = json.loads(text, parse_constant=_no_constant)
        except (ValueError, RecursionError):
            if not (self.repair and text[0] in "[{"):
                return raw, False
            try:
                value, repaired = loads_tolerant(text, repair=True)
            except json.JSONDecodeError:
                return raw, False
        if isinstance(value, str):
            return raw, False  # a quoted string: the template writes strings raw
        if types and "string" in types and not _has_type(value, types):
            return raw, False
        return value, repaired


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _properties(schema: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if not isinstance(schema, Mapping):
        return {}
    params = schema.get("function", schema).get("parameters") or {}
    props = params.get("properties") if isinstance(params, Mapping) else None
    return props if isinstance(props, Mapping) else {}


def _types(schema: Any) -> set[str]:
    """JSON types a property schema allows (``type``, ``anyOf``/``oneOf``); empty: unknown."""
    if not isinstance(schema, Mapping):
        return set()
    kind = schema.get("type")
    found = {kind} if isinstance(kind, str) else set(kind) if isinstance(kind, list) else set()
    for option in (*schema.get("anyOf", ()), *schema.get("oneOf", ())):
        found |= _types(option)
    return found


def _has_type(value: Any, types: set[str]) -> bool:
    if isinstance(value, bool):
        return "boolean" in types
    return any(isinstance(value, _JSON_TYPES.get(t, ())) for t in types)


def empty_earlier_reasoning(text: str) -> str:
    """The template's history rewrite: reasoning of assistant turns before the last user
    message renders as ``<think></think>``."""
    return _REASONING.sub("<think></think>", text)


GLM45 = register_format(
    ChatFormat(
        name="glm45",
        family="GLM-4.5, GLM-4.6",
        call_syntax="<tool_call>NAME<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>",
        aliases=("glm4.5", "glm46"),
        parser=GlmToolParser,
        end_tokens=("<|observation|>", "<|user|>", "<|endoftext|>"),
        call_end_tokens=("<|observation|>",),
        end_opens_next=True,
        template_markers=("[gMASK]<sop>", "<|observation|>", "<arg_key>"),
        assistant_message=content_message,
        history_rewrite=empty_earlier_reasoning,
        notes=(
            "A turn ends with the next header the model samples (<|observation|> runs the "
            "calls); the delta starts after it, so deltas are exact whatever the model wrote. "
            "The template empties the reasoning of turns before the last user message and "
            "strips turn text; the trajectory keeps the turns as sampled."
        ),
    )
)


def drop_earlier_reasoning(text: str) -> str:
    """GLM-4.7's history rewrite: reasoning of assistant turns before the last user message
    renders as a bare ``</think>``."""
    return _REASONING.sub("</think>", text)


GLM47 = register_format(
    ChatFormat(
        name="glm47",
        family="GLM-4.7",
        call_syntax=GLM45.call_syntax,
        aliases=("glm4.7",),
        parser=GlmToolParser,
        end_tokens=GLM45.end_tokens,
        call_end_tokens=GLM45.call_end_tokens,
        end_opens_next=True,
        variant_of="glm45",
        variant_markers=("{{ '</think>' }}", "<tool_call>{function-name}<arg_key>"),
        assistant_message=content_message,
        history_rewrite=drop_earlier_reasoning,
        notes=(
            "As glm45, but the template renders the reasoning of turns before the last user "
            "message as a bare </think> (its template selects it from glm45); the trajectory "
            "keeps the turns as sampled."
        ),
    )
)
