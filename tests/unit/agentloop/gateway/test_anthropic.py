"""The Anthropic Messages dialect's conversion: a Messages body becomes the same ``ChatCall``
the equivalent chat-completions body builds; reasoning round-trips through a thinking block;
hosted-service fields are recorded; every malformed body is a 400 naming its field."""

from __future__ import annotations

import pytest

from agentloop.gateway import GatewayInputError
from agentloop.gateway.anthropic_api import messages_call, split_reasoning
from agentloop.gateway.messages import comparable, render_messages
from agentloop.gateway.openai_api import chat_call
from tests.unit.agentloop.gateway.helpers import WEATHER

SCHEMA = WEATHER["function"]["parameters"]
TOOL = {"name": "weather", "description": "Weather in a city.", "input_schema": SCHEMA}
SIGNED = split_reasoning("<think>\nplan it\n</think>\n\n")[1]


def anthropic_body(**extra):
    """A Claude-Code-like body: system blocks, a system-role message, reasoning, a tool
    round with an error result and text after it."""
    return {
        "model": "claude",
        "max_tokens": 32000,
        "system": [{"type": "text", "text": "You are terse."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {"role": "system", "content": "Use tools."},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "plan it", "signature": SIGNED},
                    {
                        "type": "tool_use",
                        "id": "call_1",
                        "name": "weather",
                        "input": {"city": "Paris"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": "Paris: sunny"},
                    {"type": "text", "text": "Thanks."},
                ],
            },
        ],
        "tools": [TOOL],
        **extra,
    }


OPENAI_MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "system", "content": "Use tools."},
    {
        "role": "assistant",
        "content": "<think>\nplan it\n</think>\n\n",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "Paris: sunny"},
    {"role": "user", "content": "Thanks."},
]


def test_a_messages_body_is_the_chat_call_of_the_same_chat_body():
    call = messages_call(anthropic_body(temperature=0.5, top_k=5, stop_sequences=["END"])).call
    chat = chat_call({"messages": OPENAI_MESSAGES, "tools": [WEATHER], "temperature": 0.5})
    assert [comparable(m, i) for i, m in enumerate(call.messages)] == [
        comparable(m, i) for i, m in enumerate(chat.messages)
    ]
    for string_arguments in (True, False):
        assert render_messages(call.messages, string_arguments=string_arguments) == (
            render_messages(chat.messages, string_arguments=string_arguments)
        )
    assert call.tools == chat.tools == [WEATHER]
    assert (call.temperature, call.top_k, call.max_tokens, call.stop) == (0.5, 5, 32000, ["END"])


@pytest.mark.parametrize(
    "content",
    [
        "<think>\nplan it\n</think>\n\nIt is sunny.",
        "<think>plan</think>It is sunny.",
        "<think>\n\n</think>\n\nIt is sunny.",
        "<think>\nplan it\n</think>\n\n",
    ],
)
def test_reasoning_goes_out_as_a_thinking_block_and_comes_back_exactly(content):
    thinking, signature, text = split_reasoning(content)
    assert thinking == content.split("<think>")[1].split("</think>")[0].strip()
    assert text == content.split("</think>")[1].strip()
    blocks = [{"type": "thinking", "thinking": thinking, "signature": signature}]
    if text:
        blocks.append({"type": "text", "text": text})
    echoed = {"max_tokens": 9, "messages": [{"role": "assistant", "content": blocks}]}
    assert messages_call(echoed).call.messages[0]["content"] == content


def test_content_without_a_closed_think_block_is_all_text():
    assert split_reasoning("It is sunny.") == (None, "", "It is sunny.")
    assert split_reasoning("<think>cut by max_tokens") == (None, "", "<think>cut by max_tokens")
    assert split_reasoning(None) == (None, "", "")
    # a thinking block the gateway did not sign renders in Qwen3's own spacing
    unsigned = [
        {"type": "thinking", "thinking": "plan", "signature": "EqQBCgIYAhIM"},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "text", "text": "Hi."},
    ]
    call = messages_call(
        {"max_tokens": 9, "messages": [{"role": "assistant", "content": unsigned}]}
    )
    assert call.call.messages[0]["content"] == "<think>\nplan\n</think>\n\nHi."
    assert call.call.recorded == {"redacted_thinking": 1}


def test_tool_choice_maps_to_the_chat_choices():
    body = anthropic_body()
    choices = {
        "auto": "auto",
        "any": "required",
        "none": "none",
    }
    for kind, chat in choices.items():
        assert messages_call({**body, "tool_choice": {"type": kind}}).call.tool_choice == chat
    named = {"type": "tool", "name": "weather", "disable_parallel_tool_use": True}
    call = messages_call({**body, "tool_choice": named}).call
    assert call.tool_choice == {"type": "function", "function": {"name": "weather"}}
    assert call.recorded == {"disable_parallel_tool_use": 1}


def test_hosted_service_fields_are_recorded_not_refused():
    hosted = {
        "metadata": {"user_id": "u"},
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": []},
        "output_config": {"effort": "high"},
        "service_tier": "auto",
    }
    body = anthropic_body(**hosted)
    body["system"][0]["cache_control"] = {"type": "ephemeral"}
    body["messages"][0]["content"][0]["cache_control"] = {"type": "ephemeral"}
    body["tools"] = [{**TOOL, "cache_control": {"type": "ephemeral"}}]
    body["messages"][3]["content"][0]["is_error"] = True
    call = messages_call(body).call
    assert call.recorded == {**hosted, "cache_control": 3, "is_error": 1}
    assert call.messages[1] == {
        "role": "user",
        "content": [{"type": "text", "text": "Weather in Paris?"}],
    }


def bad(body):
    return {"max_tokens": 9, "messages": [{"role": "user", "content": "hi"}], **body}


BAD = [
    (bad({"max_tokens": None}), "max_tokens: field required", "max_tokens"),
    (bad({"max_tokens": 0}), "max_tokens: must be >= 1, got 0", "max_tokens"),
    (bad({"messages": []}), "messages: must be a non-empty list of messages", "messages"),
    (
        bad(
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": [{"type": "foo"}]},
                ]
            }
        ),
        "messages.1.content.0.type: unknown block type 'foo'",
        "messages.1.content.0.type",
    ),
    (
        bad(
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "name": "weather", "input": {}}],
                    }
                ]
            }
        ),
        "messages.0.content.0.id: a tool_use block needs a string id",
        "messages.0.content.0.id",
    ),
    (
        bad({"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]}),
        "messages.0.content.0.tool_use_id: must be a string",
        "messages.0.content.0.tool_use_id",
    ),
    (
        bad({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
        "messages.0.content.0.type: image blocks are not supported: the sessions train text models",
        "messages.0.content.0.type",
    ),
    (
        bad(
            {
                "messages": [
                    {"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b"}]}
                ]
            }
        ),
        "messages.0.content.0.type: tool_use blocks are not allowed in user messages",
        "messages.0.content.0.type",
    ),
    (
        bad({"messages": [{"role": "robot", "content": "hi"}]}),
        "messages.0.role: must be user, assistant or system, got 'robot'",
        "messages.0.role",
    ),
    (
        bad({"system": [{"type": "image"}]}),
        "system.0.type: only text blocks are supported here, got 'image'",
        "system.0.type",
    ),
    (
        bad({"tools": [{"name": "weather"}]}),
        "tools.0.input_schema: tool 'weather' needs an input_schema object",
        "tools.0.input_schema",
    ),
    (
        bad({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
        "tools.0.type: 'web_search_20250305' (web_search) is a server tool the gateway cannot "
        "run; give the agent's own tool with a name and an input_schema",
        "tools.0.type",
    ),
    (
        bad({"tools": [{"type": "bash_20250124", "name": "bash"}]}),
        "tools.0.type: 'bash_20250124' (bash) is a server tool the gateway cannot run; give "
        "the agent's own tool with a name and an input_schema",
        "tools.0.type",
    ),
    (
        bad({"tool_choice": {"type": "sometimes"}}),
        "tool_choice.type: must be auto, any, tool or none, got 'sometimes'",
        "tool_choice.type",
    ),
    (
        bad({"tool_choice": {"type": "tool"}}),
        "tool_choice.name: a tool choice of type 'tool' needs the tool's name",
        "tool_choice.name",
    ),
    (bad({"stop_sequences": "END"}), "stop_sequences: must be a list of strings", "stop_sequences"),
    (bad({"temperature": "hot"}), "temperature: must be a number, got 'hot'", "temperature"),
    (bad({"top_k": 1.5}), "top_k: must be an integer, got 1.5", "top_k"),
    (bad({"stream": "yes"}), "stream: must be a boolean, got 'yes'", "stream"),
]


@pytest.mark.parametrize(("body", "message", "param"), BAD, ids=[p for _, _, p in BAD])
def test_a_malformed_body_names_its_field(body, message, param):
    with pytest.raises(GatewayInputError) as raised:
        messages_call(body)
    assert (str(raised.value), raised.value.param) == (message, param)


def test_count_tokens_needs_no_max_tokens():
    call = messages_call({"messages": [{"role": "user", "content": "hi"}]}, count_only=True)
    assert call.call.max_tokens is None and call.stream is False
