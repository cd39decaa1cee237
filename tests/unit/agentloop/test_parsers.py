"""The shared parsing parts through the Hermes tool-call parser: blocks per turn, tolerant
JSON repair, every error kind with the exact message the model sees, checks against the tool
set, and the repair switch. (Parsers come from the format registry:
tests/unit/agentloop/formats/test_registry.py.)"""

from __future__ import annotations

import json

import pytest

from agentloop.formats import get_format
from agentloop.formats.hermes import CALL_HINT, HermesToolParser
from agentloop.parsers import (
    ParsedTurn,
    ToolCall,
    ToolCallError,
    bracket_end,
    check_calls,
    split_top,
)
from tests.unit.agentloop.scripted import CALC_SCHEMA

SCHEMAS = {
    "calc": CALC_SCHEMA,
    "weather": {
        "type": "function",
        "function": {
            "name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
}


def block(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def parse(text: str) -> ParsedTurn:
    return HermesToolParser().parse(text)


def only_call(text: str) -> ToolCall:
    turn = parse(text)
    assert len(turn.items) == 1
    call = turn.items[0]
    assert isinstance(call, ToolCall), call
    return call


def only_error(text: str) -> ToolCallError:
    turn = parse(text)
    assert len(turn.items) == 1
    error = turn.items[0]
    assert isinstance(error, ToolCallError), error
    return error


# ---- blocks ----------------------------------------------------------------------------------
def test_several_blocks_are_read_in_order_and_text_outside_them_is_the_content():
    text = (
        "First I add.\n"
        + block('{"name": "calc", "arguments": {"a": 1, "b": 2}}')
        + "\nthen the weather\n"
        + block('{"name": "weather", "arguments": {"city": "Paris"}}')
        + "\n"
        + block('{"name": "calc", "arguments": {"a": 3, "b": 4}}')
        + "\nDone."
    )
    turn = parse(text)
    assert [(c.name, c.arguments) for c in turn.calls] == [
        ("calc", {"a": 1, "b": 2}),
        ("weather", {"city": "Paris"}),
        ("calc", {"a": 3, "b": 4}),
    ]
    assert turn.errors == []
    assert turn.content == "First I add.\n\nthen the weather\n\n\nDone."
    assert turn.calls[1].raw == '{"name": "weather", "arguments": {"city": "Paris"}}'


def test_a_turn_without_blocks_has_no_items_and_its_text_as_content():
    turn = parse("  The answer is 5.\n")
    assert turn.items == []
    assert turn.content == "The answer is 5."


def test_an_unclosed_final_block_is_still_parsed():
    text = block('{"name": "calc", "arguments": {"a": 1, "b": 2}}') + (
        '\n<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n'
    )
    turn = parse(text)
    assert [(c.name, c.arguments) for c in turn.calls] == [
        ("calc", {"a": 1, "b": 2}),
        ("weather", {"city": "Oslo"}),
    ]
    assert turn.content == ""


def test_errors_and_calls_keep_their_order_in_the_turn():
    text = block("oops") + block('{"name": "calc", "arguments": {"a": 1, "b": 2}}') + block("[]")
    turn = parse(text)
    assert [type(i).__name__ for i in turn.items] == ["ToolCallError", "ToolCall", "ToolCallError"]
    # the index in each message counts blocks, errors included
    assert turn.errors[0].message.startswith("tool call 1 ")
    assert turn.errors[1].message.startswith("tool call 3 ")


# ---- tolerant JSON ---------------------------------------------------------------------------
def test_valid_json_is_not_marked_repaired():
    call = only_call(block('{"name": "calc", "arguments": {"a": 1, "b": 2}}'))
    assert call.arguments == {"a": 1, "b": 2}
    assert call.repaired is False


@pytest.mark.parametrize(
    ("body", "arguments"),
    [
        pytest.param(
            '{"name": "calc", "arguments": {"a": 1, "b": 2,},}', {"a": 1, "b": 2}, id="trailing"
        ),
        pytest.param(
            '{"name": "weather", "arguments": {"cities": ["Oslo", "Rome",]}}',
            {"cities": ["Oslo", "Rome"]},
            id="trailing-comma-in-list",
        ),
        pytest.param(
            "{'name': 'weather', 'arguments': {'city': 'Paris'}}",
            {"city": "Paris"},
            id="single-quotes",
        ),
        pytest.param(
            """{'name': 'say', 'arguments': {'text': 'she said "hi"'}}""",
            {"text": 'she said "hi"'},
            id="double-quote-inside-single-quotes",
        ),
        pytest.param(
            r"{'name': 'say', 'arguments': {'text': 'it\'s'}}",
            {"text": "it's"},
            id="escaped-single-quote",
        ),
        pytest.param(
            '{"name": "f", "arguments": {"x": True, "y": False, "z": None}}',
            {"x": True, "y": False, "z": None},
            id="python-literals",
        ),
        pytest.param(
            '{"name": "f", "arguments": {"say": "True or None"}, "x": 1,}',
            {"say": "True or None"},
            id="literals-inside-strings-untouched",
        ),
        pytest.param(
            '{"name": "calc", "arguments": {"a": 1, "b": 2', {"a": 1, "b": 2}, id="braces"
        ),
        pytest.param(
            '{"name": "f", "arguments": {"xs": [1, [2, 3', {"xs": [1, [2, 3]]}, id="brackets"
        ),
        pytest.param(
            '{"name": "weather", "arguments": {"city": "New Yo',
            {"city": "New Yo"},
            id="unclosed-string",
        ),
        pytest.param(
            '{"name": "calc", "arguments": {"a": 1, "b": 2,', {"a": 1, "b": 2}, id="comma-then-eof"
        ),
    ],
)
def test_repairable_json_is_parsed_and_marked_repaired(body, arguments):
    call = only_call(block(body))
    assert call.arguments == arguments
    assert call.repaired is True
    assert call.raw == body


def test_arguments_given_as_a_json_string_are_parsed():
    body = json.dumps({"name": "calc", "arguments": json.dumps({"a": 1, "b": 2})})
    call = only_call(block(body))
    assert call.arguments == {"a": 1, "b": 2}
    assert call.repaired is False


def test_arguments_string_needing_repair_marks_the_call_repaired():
    body = json.dumps({"name": "calc", "arguments": "{'a': 1, 'b': 2,}"})
    call = only_call(block(body))
    assert call.arguments == {"a": 1, "b": 2}
    assert call.repaired is True


@pytest.mark.parametrize("arguments", ['""', "null"], ids=["empty-string", "null"])
def test_empty_or_null_arguments_mean_no_arguments(arguments):
    call = only_call(block(f'{{"name": "ping", "arguments": {arguments}}}'))
    assert call.arguments == {}


def test_parameters_key_is_accepted_for_arguments():
    call = only_call(block('{"name": "calc", "parameters": {"a": 1, "b": 2}}'))
    assert call.arguments == {"a": 1, "b": 2}


# ---- error kinds: exact messages -------------------------------------------------------------
def test_unrepairable_json_is_a_bad_json_error_with_position():
    raw = '{"name": "calc", "arguments": {"a": 1 2}}'
    error = only_error(block(raw))
    assert error.kind == "bad_json"
    assert error.raw == raw
    assert error.name is None
    assert error.to_message() == {
        "role": "tool",
        "content": "Error: tool call 1 is not valid JSON (Expecting ',' delimiter at char 38); "
        'write {"name": <tool name>, "arguments": {...}} inside <tool_call></tool_call>',
    }


def test_plain_text_in_a_block_is_a_bad_json_error():
    error = only_error(block("call the calculator"))
    assert error.kind == "bad_json"
    assert error.to_message()["content"] == (
        f"Error: tool call 1 is not valid JSON (Expecting value at char 0); {CALL_HINT}"
    )


def test_a_json_array_instead_of_an_object_is_a_bad_json_error():
    error = only_error(block('[{"name": "calc", "arguments": {}}]'))
    assert error.kind == "bad_json"
    assert error.to_message()["content"] == (
        "Error: tool call 1 must be a JSON object, got an array; "
        'write {"name": <tool name>, "arguments": {...}} inside <tool_call></tool_call>'
    )


@pytest.mark.parametrize(
    "body", ['{"arguments": {"a": 1}}', '{"name": "", "arguments": {}}', '{"name": 7}']
)
def test_a_call_without_a_string_name_is_a_missing_name_error(body):
    error = only_error(block(body))
    assert error.kind == "missing_name"
    assert error.to_message()["content"] == (
        'Error: tool call 1 has no "name"; '
        'write {"name": <tool name>, "arguments": {...}} inside <tool_call></tool_call>'
    )


@pytest.mark.parametrize(
    ("arguments", "got"),
    [("[1, 2]", "an array"), ("3", "a number"), ("2.5", "a number"), ("true", "a boolean")],
)
def test_arguments_that_are_not_an_object_are_a_bad_arguments_error(arguments, got):
    error = only_error(block(f'{{"name": "calc", "arguments": {arguments}}}'))
    assert error.kind == "bad_arguments"
    assert error.name == "calc"
    assert error.to_message()["content"] == (
        f"Error: arguments of tool call 1 (calc) must be a JSON object, got {got}"
    )


def test_arguments_string_holding_a_non_object_is_a_bad_arguments_error():
    error = only_error(block('{"name": "calc", "arguments": "\\"text\\""}'))
    assert error.kind == "bad_arguments"
    assert error.to_message()["content"] == (
        "Error: arguments of tool call 1 (calc) must be a JSON object, got a string"
    )


def test_arguments_string_that_is_not_json_is_a_bad_arguments_error():
    turn = parse(
        block('{"name": "other", "arguments": {"a": 1}}')
        + block('{"name": "calc", "arguments": "a=1 b=2"}')
    )
    assert isinstance(turn.items[0], ToolCall)
    error = turn.items[1]
    assert isinstance(error, ToolCallError)
    assert error.kind == "bad_arguments"
    assert error.name == "calc"
    assert error.to_message()["content"] == (
        "Error: arguments of tool call 2 (calc) are not valid JSON (Expecting value)"
    )


@pytest.mark.parametrize(
    "body", ["[" * 5000, '{"name": "f", "arguments": ' + "[" * 5000 + "]" * 5000 + "}"]
)
def test_json_nested_past_the_decoder_limit_is_a_bad_json_error(body):
    error = only_error(block(body))
    assert error.kind == "bad_json"
    assert error.to_message()["content"] == (
        f"Error: tool call 1 is not valid JSON (nested too deeply at char 0); {CALL_HINT}"
    )


def test_arguments_string_nested_past_the_decoder_limit_is_a_bad_arguments_error():
    error = only_error(block(json.dumps({"name": "f", "arguments": "[" * 5000})))
    assert error.kind == "bad_arguments"
    assert error.to_message()["content"] == (
        "Error: arguments of tool call 1 (f) are not valid JSON (nested too deeply)"
    )


def test_an_integer_over_the_digit_limit_is_a_bad_json_error():
    error = only_error(block('{"name": "f", "arguments": {"x": ' + "7" * 5000 + "}}"))
    assert error.kind == "bad_json"
    assert error.to_message()["content"] == (
        f"Error: tool call 1 is not valid JSON (a number has too many digits at char 0); "
        f"{CALL_HINT}"
    )


# ---- scanning JSON text ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "start", "stop", "expected"),
    [
        ('x {"a": "}", \'b\': [1, {"c": "\\"}"}]} tail', 2, "", (36, True)),
        ('{"a": [1, 2', 0, "", (11, False)),
        ('{"a": "x;y", "b": 1; {"c": 2}', 0, ";", (19, False)),
    ],
)
def test_bracket_end_skips_brackets_in_strings_and_stops_where_told(text, start, stop, expected):
    assert bracket_end(text, start, stop) == expected


def test_split_top_splits_only_at_commas_outside_strings_and_brackets():
    text = '{"a": 1, "b": [2, 3]}, \'x,y\', "q\\",", [4, {"c": 5}]'
    assert split_top(text) == ['{"a": 1, "b": [2, 3]}', " 'x,y'", ' "q\\","', ' [4, {"c": 5}]']
    assert split_top("") == [""]


# ---- checks against the tool set -------------------------------------------------------------
def test_check_calls_reports_an_unknown_tool_with_the_available_tools_sorted():
    turn = parse(block('{"name": "search", "arguments": {"q": "x"}}'))
    [error] = check_calls(turn, {"weather": SCHEMAS["weather"], "calc": SCHEMAS["calc"]}).items
    assert isinstance(error, ToolCallError)
    assert error.kind == "unknown_tool"
    assert error.name == "search"
    assert error.raw == '{"name": "search", "arguments": {"q": "x"}}'
    assert error.to_message()["content"] == (
        "Error: unknown tool 'search'; available tools: calc, weather"
    )


def test_check_calls_with_no_tools_says_none_are_available():
    turn = parse(block('{"name": "calc", "arguments": {}}'))
    [error] = check_calls(turn, {}).items
    assert error.to_message()["content"] == "Error: unknown tool 'calc'; available tools: none"


def test_check_calls_reports_a_missing_required_property():
    turn = parse(block('{"name": "calc", "arguments": {"a": 1}}'))
    [error] = check_calls(turn, SCHEMAS).items
    assert isinstance(error, ToolCallError)
    assert error.kind == "schema"
    assert error.name == "calc"
    assert error.to_message()["content"] == (
        "Error: arguments of 'calc' do not match its schema at arguments: "
        "'b' is a required property"
    )


def test_check_calls_reports_a_wrong_type_at_its_path():
    turn = parse(block('{"name": "calc", "arguments": {"a": "one", "b": 2}}'))
    [error] = check_calls(turn, SCHEMAS).items
    assert isinstance(error, ToolCallError)
    assert error.kind == "schema"
    assert error.to_message()["content"] == (
        "Error: arguments of 'calc' do not match its schema at a: 'one' is not of type 'integer'"
    )


def test_check_calls_accepts_a_bare_function_schema_and_a_tool_without_parameters():
    schemas = {
        "calc": SCHEMAS["calc"]["function"],
        "ping": {"type": "function", "function": {"name": "ping"}},
    }
    turn = parse(
        block('{"name": "calc", "arguments": {"a": 1}}')
        + block('{"name": "ping", "arguments": {"any": 1}}')
    )
    checked = check_calls(turn, schemas).items
    assert isinstance(checked[0], ToolCallError) and checked[0].kind == "schema"
    assert isinstance(checked[1], ToolCall)


def test_check_calls_keeps_item_order_with_errors_in_place():
    turn = parse(
        block('{"name": "calc", "arguments": {"a": 1, "b": 2}}')
        + block('{"name": "search", "arguments": {}}')
        + block("{bad")
        + block('{"name": "calc", "arguments": {"a": 1}}')
        + block('{"name": "weather", "arguments": {"city": "Rome"}}')
    )
    checked = check_calls(turn, SCHEMAS)
    assert checked is turn  # errors replace the calls in place
    kinds = [i.kind if isinstance(i, ToolCallError) else i.name for i in checked.items]
    assert kinds == ["calc", "unknown_tool", "bad_json", "schema", "weather"]
    assert [c.arguments for c in checked.calls] == [{"a": 1, "b": 2}, {"city": "Rome"}]


# ---- repair switch (multi_turn.repair_tool_calls) -------------------------------------------
@pytest.mark.parametrize(
    "body",
    [
        '{"name": "calc", "arguments": {"a": 1, "b": 2,}}',
        "{'name': 'calc', 'arguments': {'a': 1}}",
        '{"name": "calc", "arguments": {"a": 1',
        '{"name": "calc", "arguments": "{\'a\': 1}"}',
    ],
    ids=["trailing-comma", "single-quotes", "unclosed", "arguments-string"],
)
def test_with_repair_off_what_repair_would_fix_is_an_error_the_model_sees(body):
    assert get_format("hermes").new_parser().parse(block(body)).calls[0].repaired is True
    (error,) = get_format("hermes").new_parser(repair=False).parse(block(body)).items
    assert isinstance(error, ToolCallError)
    assert error.kind in ("bad_json", "bad_arguments")
    assert error.to_message()["content"].startswith(
        "Error: tool call 1 is not valid JSON ("
        if error.kind == "bad_json"
        else "Error: arguments of tool call 1 (calc) are not valid JSON ("
    )


def test_with_repair_off_valid_json_still_parses():
    body = '{"name": "calc", "arguments": {"a": 1, "b": 2}}'
    call = get_format("hermes").new_parser(repair=False).parse(block(body)).calls[0]
    assert call.arguments == {"a": 1, "b": 2} and call.repaired is False
