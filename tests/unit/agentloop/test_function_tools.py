"""Function tools: JSON schema from signature and docstring, sync/async execution without
blocking the loop, return values as text, and clear errors for what cannot be described."""

from __future__ import annotations

import asyncio
import time
from typing import Literal

import pytest

from agentloop.parsers import ParsedTurn, ToolCall, check_calls
from agentloop.tools import FunctionTool, ToolResult, ToolRunner, function_tool


@function_tool
def add(a: int, b: int = 1) -> int:
    """Add two integers.

    Longer explanation that is not part of the description.

    Args:
        a: The first number.
        b (int): The second number,
            defaults to one.
    """
    return a + b


@function_tool(name="search", description="Search the corpus.")
async def search_corpus(
    query: str,
    k: int | None = None,
    mode: Literal["bm25", "dense"] = "bm25",
    tags: list[str] | None = None,
) -> dict:
    await asyncio.sleep(0)
    return {"query": query, "k": k, "mode": mode, "tags": tags}


def test_schema_comes_from_signature_and_docstring():
    assert add.tool_schema == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "The first number."},
                    "b": {
                        "type": "integer",
                        "description": "The second number, defaults to one.",
                        "default": 1,
                    },
                },
                "required": ["a"],
            },
        },
    }


def test_optional_literal_and_list_parameters_and_overrides():
    fn = search_corpus.tool_schema["function"]
    assert fn["name"] == "search" and fn["description"] == "Search the corpus."
    assert fn["parameters"] == {
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "k": {"type": "integer"},
            "mode": {"type": "string", "enum": ["bm25", "dense"], "default": "bm25"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["query"],
    }


async def test_sync_and_async_functions_execute_and_return_text():
    assert await add.execute("i", {"a": 2, "b": 3}) == ToolResult("5")
    out = await search_corpus.execute("i", {"query": "x"})
    assert out.text == '{"query": "x", "k": null, "mode": "bm25", "tags": null}'


async def test_sync_function_runs_in_a_thread_and_does_not_block_the_loop():
    @function_tool
    def slow(seconds: float) -> str:
        """Block for a while."""
        time.sleep(seconds)
        return "done"

    start = time.perf_counter()
    results = await asyncio.gather(*(slow.execute("i", {"seconds": 0.3}) for _ in range(3)))
    assert [r.text for r in results] == ["done"] * 3
    assert time.perf_counter() - start < 0.8


async def test_non_text_return_becomes_an_error_message_through_the_runner():
    @function_tool
    def raw() -> bytes:
        """Return bytes."""
        return b"x"

    runner = ToolRunner({"raw": raw}, timeout_s=5)
    (outcome,) = await runner.run([ToolCall("raw", {}, raw="")], {"raw": "i"})
    assert outcome.ok is False
    assert outcome.text == "Error: tool 'raw' returned bytes; return str, a number, or JSON data"


def test_schema_checks_use_the_derived_schema():
    parsed = ParsedTurn("", [ToolCall("add", {"a": "two"}, raw="")])
    (error,) = check_calls(parsed, {"add": add.tool_schema}).errors
    assert (
        error.message
        == "arguments of 'add' do not match its schema at a: 'two' is not of type 'integer'"
    )


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "def f(x): return x",
            "tool 'f' parameter 'x' has no type annotation; annotate it (e.g. x: str)",
        ),
        (
            "def f(*xs: int): return 0",
            "tool 'f' parameter 'xs': *args/**kwargs cannot be described; name every parameter",
        ),
        (
            "def f(x: complex): return 0",
            "tool 'f' parameter 'x': annotation <class 'complex'> has no JSON schema; use "
            "str, int, float, bool, list[...], dict, Literal[...] or X | None",
        ),
        (
            "def f(x: int | str): return 0",
            "union int | str is not supported: use one type or X | None",
        ),
    ],
    ids=["no_annotation", "varargs", "complex", "union"],
)
def test_functions_that_cannot_be_described_raise_a_clear_type_error(source, message):
    scope: dict = {}
    exec(source, scope)  # noqa: S102 - builds small functions with the annotations under test
    with pytest.raises(TypeError) as info:
        FunctionTool(scope["f"])
    assert str(info.value) == message
