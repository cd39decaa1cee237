"""Llama 3.1/3.2/3.3 JSON tool calls (``llama3_json``, alias ``llama3``): a calling turn is
one or more ``{"name": ..., "parameters": {...}}`` objects (``; `` between them, an optional
leading ``<|python_tag|>``), closed by ``<|eot_id|>`` (or ``<|eom_id|>`` after a built-in
``<|python_tag|>`` call); tool results are ``tool`` messages the template renders as
``ipython`` turns. The instruct tokenizer's eos is ``<|eot_id|>`` but the base one's is
``<|end_of_text|>``, so the end tokens come from the format, never from eos.

Built-in tools (the template's ``builtin_tools``, e.g. ``["brave_search",
"wolfram_alpha"]``): the model writes ``<|python_tag|>brave_search.call(query="...")`` and
ends with ``<|eom_id|>``; that is a call of the tool named ``brave_search`` with the keyword
arguments as its arguments. Any other text after ``<|python_tag|>`` is Python for the
built-in ``code_interpreter``: a call ``code_interpreter(code=<the text>)``. Register tools
with those names to run them; otherwise the model gets the unknown-tool error.

vLLM's ``llama3_json`` extraction is not reused: it drops every call of a turn when one is
malformed, reads built-in calls as plain text, and here each malformed call must become its
own error.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from agentloop.formats.base import ChatFormat, register_format
from agentloop.parsers import ParsedTurn, ToolCall, ToolCallError, bracket_end, read_json_call

__all__ = ["CODE_INTERPRETER", "LLAMA3", "Llama3JsonToolParser", "builtin_call"]

PYTHON_TAG = "<|python_tag|>"
CODE_INTERPRETER = "code_interpreter"
CALL_HINT = (
    'reply with only {"name": <tool name>, "parameters": {...}} (several calls separated by "; ")'
)
BUILTIN_HINT = 'call a built-in tool as <|python_tag|>TOOL.call(key="value", ...)'
_BUILTIN = re.compile(r"([A-Za-z_]\w*)\.call\(")


def builtin_call(body: str) -> ToolCall | ToolCallError:
    """The built-in tool call written after ``<|python_tag|>``: ``NAME.call(k="v", ...)``
    is a call of ``NAME`` with the keyword arguments (literal values); any other text is
    code for ``code_interpreter``."""
    raw = body.strip()
    named = _BUILTIN.match(raw)
    if named is None:
        if not raw:
            return ToolCallError(
                "bad_json", f"the python tag is not followed by a call; {BUILTIN_HINT}", raw
            )
        return ToolCall(name=CODE_INTERPRETER, arguments={"code": raw}, raw=raw)
    name = named.group(1)
    try:
        return ToolCall(name=name, arguments=_keyword_literals(raw), raw=raw)
    except (SyntaxError, RecursionError, MemoryError):
        problem = "not a complete Python call"
    except ValueError as exc:
        problem = str(exc)
    return ToolCallError(
        "bad_arguments",
        f'built-in tool call 1 ({name}) is not {name}.call(key="value", ...) ({problem}); '
        f"{BUILTIN_HINT}",
        raw,
        name,
    )


def _keyword_literals(raw: str) -> dict[str, Any]:
    """The keyword arguments of the single call expression ``raw``, as literals."""
    tree = ast.parse(raw, mode="eval").body
    if not isinstance(tree, ast.Call):
        raise ValueError("text follows the call")
    if tree.args or any(k.arg is None for k in tree.keywords):
        raise ValueError("only key=value arguments are allowed")
    arguments: dict[str, Any] = {}
    for keyword in tree.keywords:
        if keyword.arg in arguments:
            raise ValueError(f"argument {keyword.arg} is given twice")
        try:
            arguments[str(keyword.arg)] = ast.literal_eval(keyword.value)
        except ValueError:
            raise ValueError(f"the value of {keyword.arg} is not a literal") from None
    return arguments


def _skip_separators(text: str, pos: int) -> int:
    while pos < len(text) and (text[pos].isspace() or text[pos] == ";"):
        pos += 1
    return pos


class Llama3JsonToolParser:
    """A turn calls tools when its text, past whitespace and an optional ``<|python_tag|>``,
    starts with ``{``: each JSON object from there (objects separated by ``;`` and/or
    whitespace) is one call, ``parameters`` or ``arguments`` holding its arguments. Text
    after the last object is content; a turn not starting with ``{`` is all content, unless
    it starts with ``<|python_tag|>``: then it is one built-in tool call (``builtin_call``).
    ``repair=False`` parses the JSON strictly, as the served endpoint does."""

    def __init__(self, repair: bool = True) -> None:
        self.repair = repair

    def parse(self, text: str) -> ParsedTurn:
        body = text.strip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG) :].lstrip()
            if not body.startswith("{"):
                return ParsedTurn(content="", items=[builtin_call(body)])
        if not body.startswith("{"):
            return ParsedTurn(content=text.strip())
        items: list[ToolCall | ToolCallError] = []
        pos = 0
        while pos < len(body) and body[pos] == "{":
            end, _ = bracket_end(body, pos, stop=";")  # a ; is never inside JSON
            items.append(self._read(body[pos:end].strip(), len(items) + 1))
            pos = _skip_separators(body, end)
        return ParsedTurn(content=body[pos:].strip(), items=items)

    def _read(self, raw: str, index: int) -> ToolCall | ToolCallError:
        return read_json_call(raw, index, self.repair, CALL_HINT)


def _unchanged(text: str) -> str:
    """The template renders earlier turns the same whatever follows them."""
    return text


LLAMA3 = register_format(
    ChatFormat(
        name="llama3_json",
        family="Llama 3.1, 3.2, 3.3",
        call_syntax=(
            '{"name": ..., "parameters": {...}} (several joined by "; ", optional <|python_tag|>);'
            ' built-in: <|python_tag|>brave_search.call(query="...")'
        ),
        aliases=("llama3",),
        parser=Llama3JsonToolParser,
        end_tokens=("<|eot_id|>", "<|eom_id|>"),
        template_markers=("<|start_header_id|>", "<|eot_id|>"),
        history_rewrite=_unchanged,
        notes=(
            "Deltas are exact and start after the <|eot_id|> or <|eom_id|> the model sampled; "
            "tool results are ipython turns, string results JSON-quoted as in the official "
            "template. Built-in tool calls (builtin_tools) are calls of the tool they name, "
            "other code after <|python_tag|> a code_interpreter call. The template trims "
            "message text and closes every history turn with <|eot_id|>; the trajectory keeps "
            "the sampled whitespace and end token."
        ),
    )
)
