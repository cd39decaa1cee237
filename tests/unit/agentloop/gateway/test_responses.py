"""The Responses API as Codex CLI sends it (``codex_request.json``: developer messages, a
namespace tool, a freeform ``custom`` tool, the built-in ``web_search``, reasoning items,
``store: false``, ``include``), its streaming events as Codex reads them, and the gateway's two
faults: a prompt over the session's budget is a 400 with the context-length code, and a
session that ends with no completed call fails its sample while its batch goes on."""

from __future__ import annotations

import json
import re
from pathlib import Path

import openai
import pytest

from agentloop import RolloutConfig
from agentloop.config import AgentConfig, GatewayConfig
from agentloop.gateway.messages import ContextLengthError, GatewayInputError
from agentloop.gateway.responses_api import responses_call
from agentloop.gateway.session import ChatCall
from agentloop.tokens import encode_prompt
from agentloop.worker import AgentLoopWorker
from tests.unit.agentloop.gateway.agents import LONG_SYSTEM
from tests.unit.agentloop.gateway.helpers import WEATHER, hermes_call, open_session
from tests.unit.agentloop.gateway.test_http import post
from tests.unit.agentloop.scripted import ScriptedServer

CODEX = json.loads((Path(__file__).parent / "codex_request.json").read_text())
PATCH = "*** Begin Patch\n*** Update File: calc.py\n-    return a - b\n+    return a + b\n"
PROMPT = [{"role": "user", "content": "Weather in Paris?"}]
BUDGET = "(set actor_rollout_ref.rollout.prompt_length higher, or shorten it)"


pytestmark = pytest.mark.usefixtures("stopped_gateways")


def test_a_codex_request_becomes_chat_messages_and_function_tools():
    call = responses_call(CODEX)
    texts = [item["content"][0]["text"] for item in CODEX["input"] if item["type"] == "message"]
    patch = CODEX["input"][7]["input"]
    assert call.messages == [
        # instructions and the leading developer message: one system message
        {"role": "system", "content": CODEX["instructions"] + "\n\n" + texts[0]},
        {"role": "user", "content": texts[1]},
        {"role": "user", "content": texts[2]},
        {"role": "user", "content": texts[3]},
        {  # a hosted model's reasoning (not sampled here) goes back as its summary's text
            "role": "assistant",
            "content": "<think>\n**Running the tests first**\n</think>\n\n",
            "tool_calls": [
                {
                    "id": "call_exec_1",
                    "type": "function",
                    "function": {
                        "name": "exec_command",
                        "arguments": '{"cmd":"pytest -q","workdir":"/workspace"}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_exec_1", "content": CODEX["input"][6]["output"]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_patch_2",
                    "type": "function",
                    "function": {"name": "apply_patch", "arguments": json.dumps({"input": patch})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_patch_2", "content": CODEX["input"][8]["output"]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_docs_3",
                    "type": "function",
                    "function": {"name": "search_docs", "arguments": '{"query":"add"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_docs_3", "content": "add(a, b) returns a + b."},
        {"role": "assistant", "content": texts[4]},
        {"role": "developer", "content": texts[5]},  # later ones: system-level, in place
        {"role": "user", "content": texts[6]},
    ]
    names = [tool["function"]["name"] for tool in call.tools]
    assert names == [
        "exec_command",
        "write_stdin",
        "list_mcp_resources",
        "update_plan",
        "request_user_input",
        "apply_patch",
        "view_image",
        "search_docs",
    ]
    assert call.tool_origins["apply_patch"] == ("custom", None)
    assert call.tool_origins["search_docs"] == ("function", "mcp__docs__")
    assert call.tool_origins["exec_command"] == ("function", None)
    patch_tool = call.tools[5]["function"]
    assert patch_tool["parameters"]["required"] == ["input"]
    assert "The input follows this lark grammar:\nstart: begin_patch" in patch_tool["description"]
    assert call.recorded == {
        "reasoning": {"effort": "medium", "summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        "store": False,
        "parallel_tool_calls": True,
        "prompt_cache_key": CODEX["prompt_cache_key"],
        "text": {"verbosity": "medium"},
        "client_metadata": CODEX["client_metadata"],
        "dropped_tools": ["web_search"],
    }
    assert call.tool_choice == "auto"


@pytest.mark.parametrize(
    ("tool", "param", "message"),
    [
        (
            {"type": "local_shell"},
            "tools[1]",
            "tools[1]: the built-in tool type 'local_shell' cannot be served by the gateway (it "
            "lists function, namespace and custom tools to the model, and drops "
            "image_generation, web_search, web_search_preview, web_search_preview_2025_03_11)",
        ),
        (
            {"type": "file_search", "vector_store_ids": ["vs_1"]},
            "tools[1]",
            "tools[1]: the built-in tool type 'file_search' cannot be served by the gateway (it "
            "lists function, namespace and custom tools to the model, and drops "
            "image_generation, web_search, web_search_preview, web_search_preview_2025_03_11)",
        ),
        (
            {"type": "namespace", "name": "ns", "tools": [{"type": "web_search"}]},
            "tools[1].tools[0]",
            "tools[1].tools[0]: a namespace holds function tools only",
        ),
        (
            {"type": "namespace", "name": "ns"},
            "tools[1]",
            "tools[1]: a namespace tool needs a 'name' and a list of 'tools'",
        ),
        (
            {"type": "function", **WEATHER["function"]},
            "tools[1]",
            "tools[1]: a second tool named 'weather'",
        ),
    ],
)
async def test_tools_that_cannot_be_served_are_refused_naming_them(tokenizer, tool, param, message):
    gw, session, _ = await open_session(tokenizer, ["hi"])
    tools = [{"type": "function", **WEATHER["function"]}, tool]
    status, error = await post(f"{gw.base_url(session)}/responses", {"input": "hi", "tools": tools})
    assert status == 400
    assert error == {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": param,
            "code": None,
        }
    }


async def test_codex_stream_has_every_event_and_its_items_extend_one_segment(tokenizer):
    thought = "<think>\nThe weather tool knows.\n</think>\n\n"
    turns = [thought + hermes_call("weather", city="Paris"), "Sunny in Paris."]
    gw, session, server = await open_session(tokenizer, turns)
    client = openai.AsyncOpenAI(base_url=gw.base_url(session), api_key="k", max_retries=0)
    tools = [
        {"type": "function", **WEATHER["function"]},
        {"type": "web_search", "external_web_access": False},
        {
            "type": "namespace",
            "name": "mcp__docs__",
            "description": "Tools in the mcp__docs__ namespace.",
            "tools": [{"type": "function", "name": "search_docs", "parameters": {}}],
        },
    ]
    codex = {
        "model": "m",
        "instructions": "You are a coding agent.",
        "tools": tools,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "key-1",
        "stream": True,
    }
    first_input = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Paris?"}]},
    ]
    events = [e async for e in await client.responses.create(input=first_input, **codex)]
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[4].delta == "The weather tool knows." and events[4].summary_index == 0
    assert events[12].name == "weather" and json.loads(events[12].arguments) == {"city": "Paris"}
    done = events[-1].response
    reasoning, call = done.output
    assert reasoning.type == "reasoning" and reasoning.summary[0].text == "The weather tool knows."
    assert call.type == "function_call" and call.name == "weather"
    usage = done.usage
    assert usage.input_tokens == len(server.requests[0]["prompt_ids"])
    assert usage.output_tokens == len(server.sampled[0])
    assert usage.input_tokens_details.cached_tokens == 0
    assert usage.output_tokens_details.reasoning_tokens == 0
    prompt = tokenizer.decode(server.requests[0]["prompt_ids"])
    assert "search_docs" in prompt and "web_search" not in prompt
    assert prompt.startswith("<|im_start|>system\nYou are a coding agent.\n\nd")

    # Codex sends the output back (reasoning with its encrypted_content) and the call's output
    again = [
        *first_input,
        *[item.model_dump(exclude_none=True) for item in done.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ]
    events = [e async for e in await client.responses.create(input=again, **codex)]
    assert events[-1].response.output[0].content[0].text == "Sunny in Paris."
    assert len(session.segments) == 1 and session.segments[0].user_turns == 1
    assert session.recorded == {
        "reasoning": {"effort": "medium", "summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        "store": False,
        "parallel_tool_calls": True,
        "prompt_cache_key": "key-1",
        "dropped_tools": ["web_search"],
    }


async def test_custom_and_namespace_calls_come_back_in_their_own_item_shapes(tokenizer):
    turns = [
        hermes_call("apply_patch", input=PATCH),
        hermes_call("search_docs", query="add"),
        "Done.",
    ]
    gw, session, _ = await open_session(tokenizer, turns)
    client = openai.AsyncOpenAI(base_url=gw.base_url(session), api_key="k", max_retries=0)
    tools = [
        {"type": "custom", "name": "apply_patch", "description": "Edit files."},
        {
            "type": "namespace",
            "name": "mcp__docs__",
            "description": "Docs.",
            "tools": [{"type": "function", "name": "search_docs", "parameters": {}}],
        },
    ]
    items: list = [{"role": "user", "content": "Fix calc.py"}]
    outputs = ["Success.", "add(a, b) returns a + b."]
    shapes = []
    for output in [*outputs, None]:
        reply = await client.responses.create(model="m", input=items, tools=tools, store=False)
        items += [item.model_dump(exclude_none=True) for item in reply.output]
        last = reply.output[-1]
        shapes.append(last.model_dump(exclude={"id", "call_id"}, exclude_none=True))
        if output is not None:
            kind = "custom_tool_call_output" if last.type == "custom_tool_call" else None
            items.append(
                {"type": kind or "function_call_output", "call_id": last.call_id, "output": output}
            )
    assert shapes[0] == {
        "type": "custom_tool_call",
        "name": "apply_patch",
        "input": PATCH,
        "status": "completed",
    }
    assert shapes[1] == {
        "type": "function_call",
        "name": "search_docs",
        "namespace": "mcp__docs__",
        "arguments": '{"query": "add"}',
        "status": "completed",
    }
    assert shapes[2]["content"][0]["text"] == "Done."
    assert len(session.segments) == 1 and session.segments[0].user_turns == 2


async def test_a_prompt_over_the_budget_is_a_context_length_error_in_both_apis(tokenizer):
    gw, session, _ = await open_session(tokenizer, ["hi"])
    messages = [{"role": "system", "content": LONG_SYSTEM}, *PROMPT]
    tokens = len(encode_prompt(tokenizer, messages))
    assert tokens > 1024
    body = {
        "error": {
            "message": f"the prompt has {tokens} tokens, over the limit of 1024 tokens {BUDGET}",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    base = gw.base_url(session)
    assert await post(f"{base}/chat/completions", {"messages": messages}) == (400, body)
    responses = {"instructions": LONG_SYSTEM, "input": PROMPT[0]["content"]}
    assert await post(f"{base}/responses", {**responses, "stream": True}) == (400, body)
    # the counts as fields, for dialects that word the error their own way (Anthropic)
    with pytest.raises(ContextLengthError) as raised:
        await session.complete(ChatCall(messages=messages))
    assert (raised.value.tokens, raised.value.limit) == (tokens, 1024)
    assert raised.value.key == "actor_rollout_ref.rollout.prompt_length"
    assert isinstance(raised.value, GatewayInputError) and session.segments == []
    assert session.errors == [f"ContextLengthError: {body['error']['message']}"] * 3


@pytest.mark.parametrize("on_error", ["zero_reward", "drop"])
async def test_a_session_with_no_completed_call_fails_its_sample_and_the_batch_goes_on(
    tokenizer, tmp_path, on_error
):
    loops = [
        {"name": f"gw_{name}", "_target_": "agentloop.gateway.GatewayAgentLoop", "agent": target}
        for name, target in (
            ("weather", "tests.unit.agentloop.gateway.agents:weather_agent"),
            ("overlong", "tests.unit.agentloop.gateway.agents:overlong_agent"),
        )
    ]
    (tmp_path / "loops.yaml").write_text(json.dumps(loops))
    config = RolloutConfig(
        prompt_length=1024,
        response_length=512,
        gateway=GatewayConfig(on_agent_error=on_error),
        agent=AgentConfig(agent_loop_config_path=str(tmp_path / "loops.yaml")),
    )
    turns = [hermes_call("weather", city="Paris"), "It is sunny."]
    server = ScriptedServer(tokenizer, turns, end_token="<|im_end|>")
    worker = AgentLoopWorker(config, server, tokenizer, tools={})
    rows = [
        {"raw_prompt": PROMPT, "agent_name": "gw_weather", "data_source": "t"},
        {"raw_prompt": PROMPT, "agent_name": "gw_overlong", "data_source": "t"},
    ]
    try:
        ok, failed = await worker.generate_sequences(rows, None, None)
    finally:
        if worker.context.gateway is not None:
            await worker.context.gateway.stop()
    assert ok.reward_score == 1.0 and ok.record.stop_reason == "stop"
    tokens = len(encode_prompt(tokenizer, [{"role": "system", "content": LONG_SYSTEM}, *PROMPT]))
    assert failed.extra["agent_error"] == (
        "the agent made no completed model call (1 refused or failed); the last call was "
        f"answered: ContextLengthError: the prompt has {tokens} tokens, over the limit of 1024 "
        f"tokens {BUDGET}"
    )
    assert failed.reward_score == 0.0 and failed.record.stop_reason == "agent_error"
    assert failed.record.weight == (0.0 if on_error == "drop" else 1.0)
    assert failed.prompt_ids == encode_prompt(tokenizer, PROMPT) and failed.response_ids == []
    assert len(server.requests) == 2  # the refused call never reached the engine


async def test_new_messages_that_leave_no_room_are_a_context_length_error(tokenizer):
    gw, session, server = await open_session(
        tokenizer, [hermes_call("weather", city="Paris")], response_length=64
    )
    url = f"{gw.base_url(session)}/chat/completions"
    status, first = await post(url, {"messages": PROMPT, "tools": [WEATHER]})
    assert status == 200
    message = first["choices"][0]["message"]
    answer = {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"]}
    messages = [*PROMPT, message, {**answer, "content": "sunny " * 100}]
    status, error = await post(url, {"messages": messages, "tools": [WEATHER]})
    assert status == 400
    assert {k: v for k, v in error["error"].items() if k != "message"} == {
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
    found = re.fullmatch(
        r"the (\d+) tokens of the new messages leave no room to sample in segment 0 \((\d+) of "
        r"actor_rollout_ref\.rollout\.response_length=64 left\)",
        error["error"]["message"],
    )
    assert found is not None, error["error"]["message"]
    room = 64 - len(server.sampled[0])
    assert int(found.group(2)) == room and int(found.group(1)) > room
