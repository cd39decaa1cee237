"""Fuzzing ``POST /v1/chat/completions`` of a real server (``agentloop-serve``: vLLM CPU
engine, tiny-qwen3, the HTTP front; shared with the other HTTP modules) with hypothesis:
arbitrary JSON, objects with random keys, near-valid chat bodies and raw bytes. Every answer
is 200 or a 4xx with an OpenAI-style error body, never a 500 and never a hang; afterwards the
server still answers ``/health`` and a normal chat request. Bodies that would otherwise be
valid ask for at most 4 tokens, so generation stays quick."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability.http.conftest import AUTH

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_MODEL_LEN = 512
TIMEOUT_S = 30  # a request that takes longer counts as a hang


def fuzz(n: int) -> settings:
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@pytest.fixture(scope="module")
def http(server_url) -> Iterator[httpx.Client]:
    # No keep-alive: a connection the server dropped cannot fail the next example instead.
    limits = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(
        base_url=server_url, timeout=TIMEOUT_S, limits=limits, headers=AUTH
    ) as client:
        yield client


def post(http: httpx.Client, body: bytes) -> httpx.Response:
    return http.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )


def dumps(value: Any) -> bytes:
    # ensure_ascii escapes lone surrogates (\ud800) instead of failing; NaN/Infinity pass.
    return json.dumps(value).encode()


def assert_answered(r: httpx.Response) -> None:
    """200 with a completion (or an SSE stream), or a 4xx with an OpenAI-style error body."""
    assert r.status_code == 200 or 400 <= r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code != 200:
        error = r.json()["error"]
        assert isinstance(error["message"], str) and error["message"], error
        assert isinstance(error["type"], str) and error["code"] == r.status_code, error
        return
    if r.headers["content-type"].startswith("text/event-stream"):
        events = [line.removeprefix("data: ") for line in r.text.splitlines() if line]
        assert events[-1] == "[DONE]", events[-3:]
        for event in map(json.loads, events[:-1]):
            if "error" in event:  # an error after the stream started: still not a 5xx
                assert 400 <= event["error"]["code"] < 500, event
        return
    body = r.json()
    assert body["object"] == "chat.completion" and isinstance(body["choices"], list), body


# ---- strategies -------------------------------------------------------------------------------
# Text with every code point, lone surrogates included (JSON carries them as \ud800).
TEXT = st.text(st.characters(exclude_categories=()), max_size=24)
CLEAN_TEXT = st.text(max_size=24)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | TEXT
)
JUNK = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
BAD_NUMBERS = st.sampled_from(
    [-1, -(2**63) - 1, 2**63, 10**30, 1e308, -1e-300, 1.5, "1", "", None, True, []]
) | st.floats(allow_nan=True, allow_infinity=True)


@st.composite
def mostly(draw, good: st.SearchStrategy, bad: st.SearchStrategy = JUNK, good_in_10: int = 8):
    """``good`` most of the time, else ``bad``: deep bodies get past the first check."""
    return draw(good if draw(st.integers(0, 9)) < good_in_10 else bad)


# Never null or absent where a body is otherwise valid: the default is the whole model length.
MAX_TOKENS = mostly(st.integers(1, 4), st.sampled_from([0, -1, 10**30, 2.5, "x", [], {"a": 1}]))

SCHEMA_LEAF = st.fixed_dictionaries(
    {"type": st.sampled_from(["string", "integer", "number", "boolean", "null"])},
    optional={
        "enum": st.lists(st.integers(-3, 3) | CLEAN_TEXT, min_size=1, max_size=3),
        "pattern": st.text("ab()[]*+?|{}0123456789,\\^$.", max_size=8),
        "minimum": st.integers(-5, 5) | st.floats(),
        "maxLength": st.integers(-1, 5),
        "$ref": st.sampled_from(["#", "#/nowhere", "#/properties/a"]),
    },
)
SCHEMA = st.recursive(
    SCHEMA_LEAF,
    lambda inner: (
        st.fixed_dictionaries(
            {
                "type": st.just("object"),
                "properties": st.dictionaries(st.text(max_size=6), inner, max_size=3),
            },
            optional={
                "required": st.lists(st.text(max_size=6), max_size=2),
                "additionalProperties": st.booleans(),
            },
        )
        | st.fixed_dictionaries({"type": st.just("array"), "items": inner})
        | st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=2)})
    ),
    max_leaves=6,
)
OBJECT_SCHEMA = st.fixed_dictionaries(
    {
        "type": st.just("object"),
        "properties": st.dictionaries(st.text(max_size=6), SCHEMA, max_size=3),
    }
)
TOOL = mostly(
    st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {"name": mostly(st.sampled_from(["add", "search"]), TEXT)},
                optional={
                    "description": CLEAN_TEXT,
                    "parameters": mostly(OBJECT_SCHEMA, SCHEMA | JUNK),
                    "strict": st.booleans(),
                },
            ),
        }
    )
)
TOOLS = mostly(st.lists(TOOL, min_size=1, max_size=3))
TOOL_CHOICE = mostly(
    st.sampled_from(["none", "auto", "required"])
    | st.builds(
        lambda name: {"type": "function", "function": {"name": name}},
        st.sampled_from(["add", "search", "missing"]),
    ),
    st.sampled_from(["x", ""]) | JUNK,
)

PART = mostly(
    st.fixed_dictionaries({"type": st.just("text"), "text": CLEAN_TEXT}),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["image_url", "input_audio", "video_url", "file", "x"])},
        optional={
            "image_url": st.fixed_dictionaries(
                {"url": st.sampled_from(["data:image/png;base64,AAAA", "file:///etc/passwd"])}
            ),
            "text": JUNK,
        },
    )
    | JUNK,
)
CONTENT = mostly(CLEAN_TEXT, st.none() | TEXT | st.lists(PART, max_size=2) | JUNK, 7)
ARGUMENTS = mostly(
    st.dictionaries(st.text(max_size=6), SCALARS, max_size=3).map(json.dumps),
    TEXT
    | JUNK.map(json.dumps)
    | st.integers(1, 1500).map(lambda d: "[" * d + "]" * d)  # deep, past json's limit at ~1000
    | JUNK,
)
TOOL_CALL = mostly(
    st.fixed_dictionaries(
        {
            "id": CLEAN_TEXT,
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {"name": st.sampled_from(["add", "search"]) | CLEAN_TEXT, "arguments": ARGUMENTS}
            ),
        }
    )
)
MESSAGE = mostly(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "user", "system", "assistant", "tool"])},
        optional={
            "content": CONTENT,
            "name": mostly(CLEAN_TEXT),
            "tool_calls": mostly(st.lists(TOOL_CALL, max_size=2)),
            "tool_call_id": mostly(CLEAN_TEXT),
        },
    ),
    st.fixed_dictionaries({"role": st.sampled_from(["developer", "function", "x", ""]) | JUNK})
    | JUNK,
    9,
)
MESSAGES = mostly(st.lists(MESSAGE, min_size=1, max_size=4), JUNK | st.just([]), 9)


def number(good: st.SearchStrategy) -> st.SearchStrategy:
    return mostly(good, BAD_NUMBERS | JUNK)


# Optional request fields: a good value most of the time, junk the rest.
FIELDS: dict[str, st.SearchStrategy] = {
    "model": mostly(st.just("tiny-qwen3"), st.sampled_from(["other", ""]) | JUNK),
    "max_completion_tokens": MAX_TOKENS,
    "min_tokens": number(st.integers(0, 2)),
    "temperature": number(st.floats(0, 2)),
    "top_p": number(st.floats(0.01, 1)),
    "top_k": number(st.sampled_from([-1, 0, 1, 5, 50])),
    "min_p": number(st.floats(0, 1)),
    "presence_penalty": number(st.floats(-2, 2)),
    "frequency_penalty": number(st.floats(-2, 2)),
    "repetition_penalty": number(st.floats(0.1, 2)),
    "n": number(st.integers(1, 3)),  # not up to vLLM's 16384: that is load, not bad input
    "seed": number(st.integers(-(2**63), 2**63 - 1)),
    "stop": mostly(st.none() | CLEAN_TEXT.filter(bool) | st.lists(CLEAN_TEXT, max_size=3)),
    "stop_token_ids": mostly(st.lists(st.integers(0, 151_935), max_size=3), JUNK | st.just([-1])),
    "logit_bias": mostly(
        st.dictionaries(st.integers(0, 151_935).map(str), st.floats(-100, 100), max_size=2)
    ),
    "tools": TOOLS,
    "parallel_tool_calls": mostly(st.booleans()),
    "stream": mostly(st.booleans()),
    "response_format": mostly(
        st.sampled_from([{"type": "text"}, {"type": "json_object"}])
        | st.builds(
            lambda schema: {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
            SCHEMA,
        )
    ),
    "structured_outputs": mostly(
        st.builds(lambda r: {"regex": r}, st.text("ab()[]*+?|{}0123456789,\\", max_size=8))
        | st.builds(lambda c: {"choice": c}, st.lists(CLEAN_TEXT, max_size=3))
        | st.builds(lambda s: {"json": s}, SCHEMA)
    ),
    "chat_template_kwargs": mostly(
        st.fixed_dictionaries({"enable_thinking": st.booleans()}),
        st.dictionaries(st.sampled_from(["enable_thinking", "tools", "chat_template"]), JUNK),
    ),
    "add_generation_prompt": mostly(st.booleans()),
    "continue_final_message": mostly(st.booleans()),
    "echo": mostly(st.booleans()),
    "ignore_eos": mostly(st.booleans()),
    "user": mostly(CLEAN_TEXT, TEXT | JUNK),
    "request_id": mostly(CLEAN_TEXT.filter(bool), TEXT | JUNK),
}


@st.composite
def chat_bodies(draw) -> dict[str, Any]:
    """A chat request that is valid but for a few fields: its messages, values of the
    sampling and tool fields, the pairs that must go together (tool_choice needs tools,
    top_logprobs needs logprobs, stream_options needs stream)."""
    body: dict[str, Any] = {"messages": draw(MESSAGES), "max_tokens": draw(MAX_TOKENS)}
    for key in draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=6, unique=True)):
        body[key] = draw(FIELDS[key])
    if draw(st.integers(0, 3)) == 0:
        body["tool_choice"] = draw(TOOL_CHOICE)
        if draw(mostly(st.just(True), st.just(False))):
            body.setdefault("tools", draw(TOOLS))
    if draw(st.integers(0, 3)) == 0:
        body["top_logprobs"] = draw(number(st.integers(0, 20)))
        body["logprobs"] = draw(mostly(st.just(True), st.booleans() | JUNK))
    if draw(st.integers(0, 5)) == 0:
        body["stream_options"] = draw(
            mostly(st.fixed_dictionaries({"include_usage": st.booleans()}))
        )
        body["stream"] = draw(mostly(st.just(True), st.booleans() | JUNK))
    body.update(draw(st.dictionaries(TEXT, JUNK, max_size=1)))  # an unknown key now and then
    return body


@st.composite
def bodies_with_random_keys(draw) -> dict[str, Any]:
    keys = st.sampled_from(["messages", "model", "tools", "stream", "n", "stop"]) | TEXT
    body = draw(st.dictionaries(keys, JUNK, max_size=5))
    if not isinstance(body.get("max_tokens"), int) or not 1 <= body["max_tokens"] <= 4:
        body["max_completion_tokens"] = 2  # wins over max_tokens in vLLM
    return body


VALID = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@st.composite
def raw_bytes(draw) -> bytes:
    """Random bytes, or a valid body cut short, with bytes flipped, or nested very deep."""
    kind = draw(st.sampled_from(["random", "cut", "flip", "deep"]))
    if kind == "random":
        return draw(st.binary(max_size=200))
    valid = dumps(VALID)
    if kind == "cut":
        return valid[: draw(st.integers(0, len(valid) - 1))]
    if kind == "flip":
        data = bytearray(valid)
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(data)
    depth = draw(st.integers(500, 5000))
    return b'{"messages": ' + b"[" * depth + b"]" * draw(st.integers(0, depth)) + b"}"


# ---- fuzz ------------------------------------------------------------------------------------
@fuzz(120)
@given(value=JUNK)
def test_arbitrary_json_values_get_an_answer(http, value):
    assert_answered(post(http, dumps(value)))


@fuzz(120)
@given(data=raw_bytes())
def test_raw_bytes_get_an_answer(http, data):
    assert_answered(post(http, data))


@fuzz(120)
@given(body=bodies_with_random_keys())
def test_objects_with_random_keys_get_an_answer(http, body):
    assert_answered(post(http, dumps(body)))


@fuzz(400)
@given(body=chat_bodies())
def test_near_valid_chat_bodies_get_an_answer(http, body):
    assert_answered(post(http, dumps(body)))


# ---- the crashes the fuzz found, pinned with their messages ----------------------------------
def error_of(r: httpx.Response) -> str:
    assert r.status_code == 400, (r.status_code, r.text[:300])
    return r.json()["error"]["message"]


def test_a_body_nested_past_the_json_decoder_limit_is_400(http):
    message = error_of(post(http, b'{"messages": ' + b"[" * 100_000 + b"}"))
    assert message == "request body is nested too deeply to parse as JSON"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("messages", [{"role": "user", "content": "a\ud800"}]),
        ("stop", ["\ud800"]),
        ("model", "\ud800"),
        ("request_id", "\ud800"),
    ],
)
def test_a_lone_surrogate_anywhere_in_the_body_is_400(http, field, value):
    body = {**VALID, field: value}
    assert error_of(post(http, dumps(body))) == (
        "request body holds a lone UTF-16 surrogate ('\\ud800' in a string): send valid "
        "Unicode (escape pairs like \\ud83d\\ude00 are fine)"
    )


def test_a_surrogate_pair_is_valid_unicode_and_answered(http):
    body = {**VALID, "messages": [{"role": "user", "content": "\ud83d\ude00"}]}
    assert b"\\ud83d\\ude00" in dumps(body)  # sent as the JSON escape pair
    assert post(http, dumps(body)).status_code == 200


@pytest.mark.parametrize(("messages", "kind"), [(None, "NoneType"), (5, "int")])
def test_a_field_of_the_wrong_type_for_vllms_pre_validators_is_400(http, messages, kind):
    # vLLM's "before" validators iterate messages before pydantic checks its type.
    message = error_of(post(http, dumps({"messages": messages, "max_tokens": 2})))
    assert (
        message == f"request body has a value of the wrong type ('{kind}' object is not iterable)"
    )


def test_tool_call_arguments_nested_past_the_json_decoder_limit_are_400(http):
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[" * 5000}}
    body = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "1"},
        ],
        "max_tokens": 2,
    }
    assert error_of(post(http, dumps(body))) == (
        "a JSON string in the request is nested too deeply to parse"
    )


CONSTRAINT_FAILED = (
    "generation failed under this request's structured-output constraint (structured_outputs, "
    "response_format or a forced tool_choice): the grammar backend could not build or follow "
    "its regex or JSON schema; simplify it"
)
# vLLM accepts these up front; the engine then fails the request while building the grammar.
ENGINE_REJECTED_GRAMMARS = [
    {"structured_outputs": {"json": {"$ref": "#", "type": "number"}}},
    {"structured_outputs": {"regex": "0\\"}},  # a lone trailing backslash
    {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"$ref": "#", "type": "number"}},
        }
    },
]


@pytest.mark.parametrize(
    "constraint", ENGINE_REJECTED_GRAMMARS, ids=["json_ref_cycle", "regex", "response_format"]
)
def test_a_grammar_the_engine_fails_on_is_400_naming_the_constraint(http, constraint):
    assert error_of(post(http, dumps({**VALID, **constraint}))) == CONSTRAINT_FAILED


def test_a_streamed_grammar_failure_is_an_in_band_400_naming_the_constraint(http):
    r = post(http, dumps({**VALID, **ENGINE_REJECTED_GRAMMARS[1], "stream": True}))
    assert r.status_code == 200  # the stream had started: the error comes as an event
    events = [line.removeprefix("data: ") for line in r.text.splitlines() if line]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2]) == {
        "error": {
            "message": CONSTRAINT_FAILED,
            "type": "invalid_request_error",
            "param": None,
            "code": 400,
        }
    }


def test_server_still_answers_health_and_a_valid_chat_request_after_the_fuzz(http):
    assert http.get("/health").json()["status"] == "ok"
    r = post(http, dumps({**VALID, "messages": [{"role": "user", "content": "Add 2 and 3."}]}))
    assert r.status_code == 200
    body = r.json()
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert 1 <= body["usage"]["completion_tokens"] <= 2
