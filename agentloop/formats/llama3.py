"""Llama 3.1/3.2/3.3 JSON tool calls (``llama3_json``, alias ``llama3``): a calling turn is
one or more ``{"name": ..., "parameters": {...}}`` objects (``; `` between them, an optional
leading ``<|python_tag|>``), closed by ``<|eot_id|>`` (or ``<|eom_id|>`` after a built-in
``<|python_tag|>`` call); tool results are ``tool`` messages the template renders as
``ipython`` turns. The instruct tokenizer's eos is ``<|eot_id|>`` but the base one's is
``<|end_of_text|>``, so the end tokens come from the format, never from eos.

vLLM's ``llama3_json`` extraction is not reused: it drops every call of a turn when one is
malformed, and here each malformed object must become its own error.
"""

from __future__ import annotations

from agentloop.formats.base import ChatFormat, register_format
from agentloop.parsers import ParsedTurn, ToolCall, ToolCallError, bracket_end, read_json_call

__all__ = ["LLAMA3", "Llama3JsonToolParser"]

PYTHON_TAG = "<|python_tag|>"
CALL_HINT = (
    'reply with only {"name": <tool name>, "parameters": {...}} (several calls separated by "; ")'
)


def _skip_separators(text: str, pos: int) -> int:
    while pos < len(text) and (text[pos].isspace() or text[pos] == ";"):
        pos += 1
    return pos


class Llama3JsonToolParser:
    """A turn calls tools when its text, past whitespace and an optional ``<|python_tag|>``,
    starts with ``{``: each JSON object from there (objects separated by ``;`` and/or
    whitespace) is one call, ``parameters`` or ``arguments`` holding its arguments. Text
    after the last object is content; a turn not starting with ``{`` is all content.
    ``repair=False`` parses the JSON strictly, as the served endpoint does."""

    def __init__(self, repair: bool = True) -> None:
        self.repair = repair

    def parse(self, text: str) -> ParsedTurn:
        body = text.strip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG) :].lstrip()
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
            '{"name": ..., "parameters": {...}} (several joined by "; ", optional <|python_tag|>)'
        ),
        aliases=("llama3",),
        parser=Llama3JsonToolParser,
        end_tokens=("<|eot_id|>", "<|eom_id|>"),
        template_markers=("<|start_header_id|>", "<|eot_id|>"),
        history_rewrite=_unchanged,
        notes=(
            "Deltas are exact and start after the <|eot_id|> or <|eom_id|> the model sampled; "
            "tool results are ipython turns, string results JSON-quoted as in the official "
            "template. The template trims message text and closes every history turn with "
            "<|eot_id|>; the trajectory keeps the sampled whitespace and end token."
        ),
    )
)
