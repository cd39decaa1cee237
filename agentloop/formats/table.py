"""The registered chat formats as the markdown table of docs/chat-formats.md
(``python -m agentloop.formats.table`` prints it; a test keeps the docs equal to it)."""

from __future__ import annotations

import re

from agentloop.formats.base import ChatFormat, all_formats

__all__ = ["markdown_table"]


def _code(items: tuple[str, ...] | list[str]) -> str:
    return ", ".join(f"`{i}`" for i in items)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _tokens_as_code(text: str) -> str:
    """``<think>``-like tokens in prose, as code (markdown would take them for HTML)."""
    return re.sub(r"(<[^\s<>]+>)", r"`\1`", text)


def _row(fmt: ChatFormat) -> str:
    names = f"`{fmt.name}`" + (f" ({_code(fmt.aliases)})" if fmt.aliases else "")
    ends = _code(fmt.end_tokens) if fmt.end_tokens else "the tokenizer's eos"
    calls = fmt.call_end_tokens
    runs = "any of them" if calls is None else _code(calls)
    if fmt.end_opens_next:
        ends += " (the next message's header)"
    cells = [names, fmt.family, f"`{fmt.call_syntax}`", ends, runs, _tokens_as_code(fmt.notes)]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def markdown_table() -> str:
    """One row per registered format (aliases folded into their format's row)."""
    import agentloop.formats  # noqa: F401  (registers the built-in families)

    lines = [
        "| `multi_turn.format` (aliases) | family | a tool call | a model turn ends with | "
        "tools run after | what the template rewrites, what is kept |",
        "|---|---|---|---|---|---|",
        *(_row(fmt) for fmt in all_formats()),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())  # noqa: T201  (a command-line tool)
