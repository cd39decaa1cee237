"""Fuzzing the tool-call parsers (every registered ``multi_turn.format``, one name per parser
class) with hypothesis.

Model text is untrusted input: whatever a turn holds, ``parse`` returns a ``ParsedTurn`` of
``ToolCall``/``ToolCallError`` items and never raises; ``check_calls`` and ``limit_calls`` keep
that shape; ``loads_tolerant`` raises nothing but ``json.JSONDecodeError``. A well-formed call,
written the way the model writes it, parses back to the same name and arguments.
"""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentloop import parsers
from agentloop.formats.base import all_formats, get_format, registered_formats
from agentloop.parsers import (
    ParsedTurn,
    ToolCall,
    ToolCallError,
    ToolCallParser,
    check_calls,
    limit_calls,
    loads_tolerant,
)


def new_parser(name: str, **kwargs: Any) -> ToolCallParser:
    """A fresh parser of the format registered as ``name``."""
    return get_format(name).new_parser(**kwargs)


# One name per parser class: aliases and variants share their format's parser (its own name
# is used).
_OWN_NAMES = {fmt.name for fmt in all_formats() if not fmt.variant_of}
FORMATS = sorted(
    {
        type(new_parser(name)): name
        for name in sorted(registered_formats(), key=lambda n: n in _OWN_NAMES)
    }.values()
)
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
    # the other families' tokens: Llama 3, Mistral, gpt-oss (Harmony), GLM
    "<|python_tag|>", ";", "; ", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|start|>",
    "assistant", "<|channel|>", "commentary", "analysis", "final", " to=functions.calc",
    "to=", "<|constrain|>", "json", "<|message|>", "<|call|>", "<|end|>", "<|return|>",
    "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<think>", "</think>",
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


OPENINGS = [
    OPEN + "\n", OPEN, "<tool_call >", "", "<|python_tag|>", "[TOOL_CALLS]", "[TOOL_CALLS][",
    "[TOOL_CALLS]calc[ARGS]", "<|start|>assistant<|channel|>commentary to=functions.calc "
    "<|constrain|>json<|message|>", "<|channel|>commentary<|message|>", OPEN + "calc\n<arg_key>a"
    "</arg_key>\n<arg_value>",
]  # fmt: skip


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
    opening = draw(st.sampled_from(OPENINGS))
    closing = draw(st.sampled_from(["\n" + CLOSE, CLOSE, "", "</tool_call", "]", "<|call|>"]))
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
    turn = new_parser(fmt).parse(text)
    assert_well_formed(turn)
    assert repr(new_parser(fmt).parse(text)) == repr(turn)  # deterministic (repr: NaN != NaN)


@pytest.mark.parametrize("fmt", FORMATS)
@FUZZ
@given(text=ANY_TURNS, limit=st.integers(0, 4))
def test_check_and_limit_calls_keep_the_shape_of_any_parse(fmt, text, limit):
    turn = new_parser(fmt).parse(text)
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
# A turn of calls written the way each family's model writes it parses back to the same names
# and arguments, with no errors and nothing repaired, and the text around the calls is the
# turn's content. Aliases share their format's parser class, so one name per class is enough.
@dataclass(frozen=True)
class Turn:
    calls: list[tuple[str, dict[str, Any]]]
    texts: list[str]  # texts[i] goes before call i; texts[-1] after the last, if closed
    ensure_ascii: bool
    close_last: bool  # False: the model stopped before closing its last call
    variant: bool  # the family's other way of writing a call


@dataclass(frozen=True)
class RoundTrip:
    write: Callable[[Turn], tuple[str, str]]  # the turn's text and its expected content
    markers: tuple[str, ...]  # what no name, key, string value or text around calls holds
    names: st.SearchStrategy[str] | None = None  # None: any text without markers
    typed_by_schema: bool = False  # values are untyped text, typed by the tool schemas
    unclosed_is_repaired: bool = False
    infinity: bool = True  # values may be +-Infinity (written as JSON constants)


def _dumps(value: Any, turn: Turn) -> str:
    return json.dumps(value, ensure_ascii=turn.ensure_ascii)


def _outside(turn: Turn) -> list[str]:
    return turn.texts[: len(turn.calls)] + ([turn.texts[-1]] if turn.close_last else [])


def write_hermes(turn: Turn) -> tuple[str, str]:
    """Hermes/Qwen: <tool_call> blocks of JSON, text anywhere around them."""
    text = ""
    for before, (name, args) in zip(turn.texts, turn.calls, strict=False):
        text += f"{before}{OPEN}\n{_dumps({'name': name, 'arguments': args}, turn)}\n{CLOSE}"
    text = text + turn.texts[-1] if turn.close_last else text.removesuffix("\n" + CLOSE)
    return text, "".join(_outside(turn)).strip()


def write_llama3(turn: Turn) -> tuple[str, str]:
    """Llama 3: the turn is the JSON objects joined by "; " (variant: after <|python_tag|>),
    content only after them. No closing tag: the end token ends the last call."""
    calls = [_dumps({"name": n, "parameters": a}, turn) for n, a in turn.calls]
    text = ("<|python_tag|>" if turn.variant else "") + "; ".join(calls)
    after = turn.texts[-1] if turn.close_last else ""
    if after.lstrip()[:1] in ("{", ";"):  # would read as another call or a separator
        after = ""
    return text + after, after.strip()


_V11_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def write_mistral(turn: Turn) -> tuple[str, str]:
    """Mistral: [TOOL_CALLS] then a JSON list of calls (v3) or, the variant, where the name
    allows it, name[ARGS]{...} (v11); one call per [TOOL_CALLS] here, text between them."""
    text = ""
    for before, (name, args) in zip(turn.texts, turn.calls, strict=False):
        if turn.variant and _V11_NAME.fullmatch(name):
            text += f"{before}[TOOL_CALLS]{name}[ARGS]{_dumps(args, turn)}"
        else:
            text += f"{before}[TOOL_CALLS][{_dumps({'name': name, 'arguments': args}, turn)}]"
    text = text + turn.texts[-1] if turn.close_last else text.removesuffix("]")
    return text, "".join(_outside(turn)).strip()


def write_gpt_oss(turn: Turn) -> tuple[str, str]:
    """gpt-oss: one commentary message per call, the recipient in the channel (variant: in
    the role header), <|call|> ending it; text between is unformatted content."""
    text = ""
    for before, (name, args) in zip(turn.texts, turn.calls, strict=False):
        if turn.variant:
            head = f"<|start|>assistant to=functions.{name}<|channel|>commentary <|constrain|>json"
        else:
            head = f"<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json"
        text += f"{before}{head}<|message|>{_dumps(args, turn)}<|call|>"
    text = text + turn.texts[-1] if turn.close_last else text.removesuffix("<|call|>")
    parts = [t for t in _outside(turn) if t.strip()]
    return text, "\n".join(parts).strip()


def write_glm(turn: Turn) -> tuple[str, str]:
    """GLM-4.5/4.6: <tool_call>NAME then <arg_key>/<arg_value> pairs, strings written raw,
    other values as JSON (variant: no line break after the name, as GLM-4.7 writes it)."""
    text = ""
    for before, (name, args) in zip(turn.texts, turn.calls, strict=False):
        pairs = "".join(
            f"<arg_key>{k}</arg_key>\n<arg_value>"
            f"{v if isinstance(v, str) else _dumps(v, turn)}</arg_value>\n"
            for k, v in args.items()
        )
        text += f"{before}{OPEN}{name}{'' if turn.variant else chr(10)}{pairs}{CLOSE}"
    text = text + turn.texts[-1] if turn.close_last else text.removesuffix(CLOSE)
    return text, "".join(_outside(turn)).strip()


def _token_free(forbidden: str) -> st.SearchStrategy[str]:
    """Names with no whitespace (any Unicode kind) and none of ``forbidden``."""
    chars = st.characters(blacklist_categories=("Z", "C"), blacklist_characters=forbidden)
    return st.text(chars, min_size=1, max_size=20)


HERMES_TAGS = ("<tool_call", "</tool_call")
ROUND_TRIPS: dict[str, RoundTrip] = {
    "hermes": RoundTrip(write_hermes, HERMES_TAGS),
    "llama3_json": RoundTrip(write_llama3, ("<|python_tag|>",)),
    "mistral": RoundTrip(write_mistral, ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")),
    "gpt-oss": RoundTrip(write_gpt_oss, ("<|", "to="), names=_token_free("<")),
    "glm45": RoundTrip(
        write_glm,
        (*HERMES_TAGS, "arg_key>", "arg_value>", "</think>"),
        names=_token_free("<>"),
        typed_by_schema=True,
        unclosed_is_repaired=True,
        infinity=False,  # the template's JSON has no Infinity; such text stays a string
    ),
}


def test_every_registered_parser_is_fuzzed_and_round_tripped_through_one_of_its_names():
    fuzzed = {type(new_parser(name)) for name in FORMATS}
    assert {type(new_parser(name)) for name in registered_formats()} == fuzzed
    assert len(fuzzed) == len(FORMATS)
    assert sorted(ROUND_TRIPS) == FORMATS


def _turn_strategy(spec: RoundTrip) -> st.SearchStrategy[Turn]:
    def clean(text: str) -> bool:
        return not any(m in text for m in spec.markers)

    strings = st.text(max_size=20).filter(clean)
    values = st.recursive(
        # finite numbers only: NaN != NaN, so a round trip cannot compare equal
        st.none()
        | st.booleans()
        | st.integers(min_value=-(10**40), max_value=10**40)
        | st.floats(allow_nan=False, allow_infinity=spec.infinity)
        | strings,
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(st.text(max_size=8).filter(clean), inner, max_size=4)
        ),
        max_leaves=12,
    )
    keys = st.text(max_size=8).filter(clean)
    if spec.typed_by_schema:  # the key is read stripped, and an empty one is an error
        keys = keys.map(str.strip).filter(bool)
    names = st.text(min_size=1, max_size=20).filter(clean) if spec.names is None else spec.names
    calls = st.lists(
        st.tuples(names, st.dictionaries(keys, values, max_size=5)),
        min_size=1,
        max_size=4,
        unique_by=(lambda c: c[0]) if spec.typed_by_schema else None,  # one schema per name
    )
    return st.builds(
        Turn,
        calls=calls,
        texts=st.lists(st.text(max_size=30).filter(clean), min_size=5, max_size=5),
        ensure_ascii=st.booleans(),
        close_last=st.booleans(),
        variant=st.booleans(),
    )


TURNS = {name: _turn_strategy(spec) for name, spec in ROUND_TRIPS.items()}


def _schemas(calls: list[tuple[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """String-typed properties for the string arguments; other values' types left open."""
    return {
        name: {
            "name": name,
            "parameters": {
                "type": "object",
                "properties": {
                    k: {"type": "string"} for k, v in args.items() if isinstance(v, str)
                },
            },
        }
        for name, args in calls
    }


@pytest.mark.parametrize("fmt", FORMATS)
@FUZZ
@given(data=st.data())
def test_a_well_formed_call_parses_back_to_its_name_and_arguments(fmt, data):
    spec = ROUND_TRIPS[fmt]
    turn = data.draw(TURNS[fmt], label="turn")
    text, content = spec.write(turn)
    schemas = _schemas(turn.calls) if spec.typed_by_schema else None
    parsed = new_parser(fmt, schemas=schemas).parse(text)
    assert parsed.errors == []
    assert [(c.name, c.arguments) for c in parsed.calls] == turn.calls
    repaired = [c.repaired for c in parsed.calls]
    unclosed = spec.unclosed_is_repaired and not turn.close_last
    assert repaired == [False] * (len(repaired) - 1) + [unclosed]
    assert parsed.content == content
