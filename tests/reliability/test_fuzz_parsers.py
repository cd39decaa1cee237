"""Fuzzing the tool-call parsers (every registered ``multi_turn.format``) with hypothesis.

Model text is untrusted input: whatever a turn holds, ``parse`` returns a ``ParsedTurn`` of
``ToolCall``/``ToolCallError`` items and never raises; ``check_calls`` and ``limit_calls`` keep
that shape; ``loads_tolerant`` raises nothing but ``json.JSONDecodeError``. A well-formed call,
written the way the model writes it, parses back to the same name and arguments.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentloop import parsers
from agentloop.parsers import (
    ParsedTurn,
    ToolCall,
    ToolCallError,
    check_calls,
    get_parser,
    limit_calls,
    loads_tolerant,
)

FORMATS = sorted(parsers._PARSERS)
ERROR_KINDS = set(typing.get_args(parsers.ErrorKind))
FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# ---- strategies -------------------------------------------------------------------------------
OPEN, CLOSE = "<tool_call>", "</tool_call>"
FRAGMENTS = [
    OPEN, CLOSE, OPEN, CLOSE, "<tool_call", "tool_call>", "</tool_", "<tool_call><tool_call>",
    "{", "}", "[", "]", ":", ",", '"', "'", "\\", "\\u", "\\ud800", "\n", " ", "\x00",
    '"name"', '"arguments"', '"parameters"', "'name'", '"calc"', '""', "null", "True", "None",
    "false", "NaN", "Infinity", "-Infinity", "1e999", "-0", "0.1e-5", "9" * 5000, "[" * 1200,
    "{\"a\":" * 600, "]" * 50, "}" * 50, "é", "\U0001f600", "\u202e", "\ufeff",
]  # fmt: skip
JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats()  # NaN and infinities included: json.dumps writes them as NaN/Infinity
    | st.text(max_size=20)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def fragment_soup(draw) -> str:
    """Text made of tag pieces, JSON punctuation, literals and junk: mostly near-valid."""
    pieces = st.sampled_from(FRAGMENTS) | st.text(max_size=6)
    return "".join(draw(st.lists(pieces, max_size=40)))


@st.composite
def mutated_call(draw) -> str:
    """A call block whose JSON was cut, had characters dropped or inserted, or lost a tag."""
    obj: dict[str, Any] = {
        draw(st.sampled_from(["name", "nam", "Name"])): draw(st.text(max_size=8))
    }
    key = draw(st.sampled_from(["arguments", "parameters", "args"]))
    obj[key] = draw(JSON_VALUES | JSON_VALUES.map(json.dumps))
    body = json.dumps(obj, ensure_ascii=draw(st.booleans()))
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(body)))
        op = draw(st.sampled_from(["cut", "drop", "insert"]))
        if op == "cut":
            body = body[:i]
        elif op == "drop":
            body = body[:i] + body[i + 1 :]
        else:
            body = body[:i] + draw(st.sampled_from(FRAGMENTS)) + body[i:]
    opening = draw(st.sampled_from([OPEN + "\n", OPEN, "<tool_call >", ""]))
    closing = draw(st.sampled_from(["\n" + CLOSE, CLOSE, "", "</tool_call"]))
    return opening + body + closing


@st.composite
def deep_or_huge(draw) -> str:
    """Nesting far past json's recursion limit, and numbers far past Python's digit limit."""
    depth = draw(st.integers(1, 3000))
    opener = draw(st.sampled_from(["[", '{"a":', "{'a':", '{"name": "f", "arguments": ' + "["]))
    closer = {"[": "]", '{"a":': "}", "{'a':": "}"}.get(opener, "]")
    digits = draw(st.integers(1, 6000))
    number = draw(st.sampled_from(["", "-"])) + "7" * digits
    body = draw(
        st.sampled_from(
            [
                opener * depth + closer * draw(st.integers(0, depth)),
                f'{{"name": "f", "arguments": {{"x": {number}}}}}',
                f'{{"name": "f", "arguments": "{{\\"x\\": {number}}}"}}',
                f'{{"name": "f", "arguments": "{"[" * depth}"}}',
                number,
            ]
        )
    )
    return OPEN + body + draw(st.sampled_from([CLOSE, ""]))


ANY_TURN = st.text() | fragment_soup() | mutated_call() | deep_or_huge()
ANY_TURNS = st.lists(ANY_TURN, min_size=1, max_size=3).map("\n".join)

SCHEMAS = {
    "calc": {
        "type": "function",
        "function": {
            "name": "calc",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
    "search": {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {
                    "q": {"type": "string", "maxLength": 5},
                    "tags": {"type": "array", "items": {"type": "object"}},
                    "opts": {"type": "object", "additionalProperties": {"type": "number"}},
                },
                "additionalProperties": False,
            },
        },
    },
    "ping": {"type": "function", "function": {"name": "ping"}},
}


# ---- what every parse result must look like ---------------------------------------------------
def assert_well_formed(turn: ParsedTurn) -> None:
    assert isinstance(turn, ParsedTurn)
    assert isinstance(turn.content, str)
    for item in turn.items:
        if isinstance(item, ToolCall):
            assert isinstance(item.name, str) and item.name
            assert isinstance(item.arguments, dict)
            assert isinstance(item.raw, str) and isinstance(item.repaired, bool)
        else:
            assert isinstance(item, ToolCallError), item
            assert item.kind in ERROR_KINDS
            assert isinstance(item.message, str) and item.message
            assert isinstance(item.raw, str)
            assert item.name is None or isinstance(item.name, str)
            message = item.to_message()
            assert message == {"role": "tool", "content": f"Error: {item.message}"}
    assert turn.calls + turn.errors == sorted(
        turn.items, key=lambda i: isinstance(i, ToolCallError)
    )


@pytest.mark.parametrize("fmt", FORMATS)
@FUZZ
@given(text=ANY_TURNS)
def test_parse_never_raises_and_returns_calls_and_errors(fmt, text):
    turn = get_parser(fmt).parse(text)
    assert_well_formed(turn)
    assert repr(get_parser(fmt).parse(text)) == repr(turn)  # deterministic (repr: NaN != NaN)


@pytest.mark.parametrize("fmt", FORMATS)
@FUZZ
@given(text=ANY_TURNS, limit=st.integers(0, 4))
def test_check_and_limit_calls_keep_the_shape_of_any_parse(fmt, text, limit):
    turn = get_parser(fmt).parse(text)
    before = list(turn.items)
    checked = limit_calls(check_calls(turn, SCHEMAS), limit)
    assert checked is turn and len(checked.items) == len(before)
    assert_well_formed(checked)
    assert len(checked.calls) <= limit
    for old, new in zip(before, checked.items, strict=True):
        if isinstance(old, ToolCallError):
            assert new is old  # parse errors stay as they were
        elif isinstance(new, ToolCall):
            assert new is old and new.name in SCHEMAS
        else:
            assert new.kind in ("unknown_tool", "schema", "too_many_calls")
            assert (new.name, new.raw) == (old.name, old.raw)


@FUZZ
@given(text=st.text() | fragment_soup() | deep_or_huge().map(lambda t: t.removeprefix(OPEN)))
def test_loads_tolerant_returns_a_value_or_raises_only_json_decode_error(text):
    try:
        value, repaired = loads_tolerant(text)
    except json.JSONDecodeError as exc:
        assert isinstance(exc.msg, str) and exc.msg
        return
    assert isinstance(repaired, bool)
    assert isinstance(value, (dict, list, str, int, float, bool, type(None)))


# ---- round trip ------------------------------------------------------------------------------
def render_hermes(name: str, arguments: dict[str, Any], ensure_ascii: bool) -> str:
    """How Hermes/Qwen models (and their chat templates) write a call."""
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=ensure_ascii)
    return f"{OPEN}\n{call}\n{CLOSE}"


RENDERERS: dict[str, Callable[[str, dict[str, Any], bool], str]] = {
    "hermes": render_hermes,
    "qwen": render_hermes,  # verl's name for the same format
}


def test_every_registered_format_has_a_round_trip_renderer_here():
    assert sorted(RENDERERS) == FORMATS


def _no_tags(text: str) -> bool:
    return "<tool_call" not in text and "</tool_call" not in text


# Finite numbers only: NaN != NaN, so a round trip cannot compare equal.
ROUND_TRIP_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=20).filter(_no_tags),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=8).filter(_no_tags), inner, max_size=4)
    ),
    max_leaves=12,
)
CALLS = st.tuples(
    st.text(min_size=1, max_size=20).filter(_no_tags),
    st.dictionaries(st.text(max_size=8).filter(_no_tags), ROUND_TRIP_VALUES, max_size=5),
)


@pytest.mark.parametrize("fmt", FORMATS)
@FUZZ
@given(
    calls=st.lists(CALLS, min_size=1, max_size=4),
    texts=st.lists(st.text(max_size=30).filter(_no_tags), min_size=5, max_size=5),
    ensure_ascii=st.booleans(),
    close_last=st.booleans(),
)
def test_a_well_formed_call_parses_back_to_its_name_and_arguments(
    fmt, calls, texts, ensure_ascii, close_last
):
    blocks = [RENDERERS[fmt](name, args, ensure_ascii) for name, args in calls]
    between = texts[: len(calls)]
    text = "".join(t + b for t, b in zip(between, blocks, strict=True))
    if close_last:
        text += texts[-1]
    else:  # the model stopped before closing its last call: still read
        text = text.removesuffix("\n" + CLOSE)
    turn = get_parser(fmt).parse(text)
    assert turn.errors == []
    assert [(c.name, c.arguments) for c in turn.calls] == calls
    assert not any(c.repaired for c in turn.calls)
    outside = "".join(between) + (texts[-1] if close_last else "")
    assert turn.content == outside.strip()
