"""The Anthropic Messages routes with the real ``anthropic`` SDK over a scripted engine: a
tool round trip that extends one segment, streaming (both ways) equal to the plain reply,
thinking blocks echoed (same segment) or dropped (a new one, with today's reason),
count_tokens equal to the next call's prompt, stop reasons, and every error in Anthropic's
shape with its status."""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp
import anthropic
import pytest

from tests.unit.agentloop.gateway.helpers import WEATHER, hermes_call, make_loop, open_session

TOOL = {
    "name": "weather",
    "description": "Weather in a city.",
    "input_schema": WEATHER["function"]["parameters"],
}
PROMPT = [{"role": "user", "content": "Weather in Paris?"}]


pytestmark = pytest.mark.usefixtures("stopped_gateways")


def client_for(gw, session, key="agentloop"):
    """The SDK as Claude Code is pointed at a session: ``/sessions/{sid}`` as its base URL."""
    base_url = f"{gw.url}/sessions/{session.id}"
    return anthropic.AsyncAnthropic(base_url=base_url, api_key=key, max_retries=0)


async def post(url, body, headers=None):
    headers = headers or {"x-api-key": "agentloop"}
    async with aiohttp.ClientSession() as http:
        data = body if isinstance(body, str) else json.dumps(body)
        async with http.post(url, data=data, headers=headers) as r:
            return r.status, await r.json()


async def test_a_tool_round_trip_extends_one_segment(tokenizer):
    gw, session, server = await open_session(
        tokenizer, [hermes_call("weather", city="Paris"), "Sunny."]
    )
    client = client_for(gw, session)
    first = await client.messages.create(model="m", max_tokens=64, messages=PROMPT, tools=[TOOL])
    assert first.stop_reason == "tool_use" and first.role == "assistant"
    (use,) = first.content
    assert (use.type, use.name, use.input) == ("tool_use", "weather", {"city": "Paris"})
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "Paris: sunny"}
    messages = [*PROMPT, {"role": "assistant", "content": first.content}]
    messages.append({"role": "user", "content": [result]})
    count = await client.messages.count_tokens(model="m", messages=messages, tools=[TOOL])
    second = await client.messages.create(model="m", max_tokens=64, messages=messages, tools=[TOOL])
    assert second.stop_reason == "end_turn"
    assert [(b.type, b.text) for b in second.content] == [("text", "Sunny.")]
    assert count.input_tokens == second.usage.input_tokens == len(server.requests[1]["prompt_ids"])
    assert first.usage.output_tokens == len(server.sampled[0])
    (seg,) = session.segments  # the tool result was appended as a delta
    assert seg.calls == 2 and seg.user_turns == 1
    assert seg.traj.response_ids[: len(server.sampled[0])] == server.sampled[0]


async def test_streaming_both_ways_equals_the_plain_reply(tokenizer):
    turns = ["<think>\nplan\n</think>\n\n" + hermes_call("weather", city="Paris")] * 3
    gw, session, _ = await open_session(tokenizer, turns)
    client = client_for(gw, session)
    kwargs = {"model": "m", "max_tokens": 64, "messages": PROMPT, "tools": [TOOL]}
    plain = await client.messages.create(**kwargs)
    async with client.messages.stream(**kwargs) as stream:
        events = [event.type async for event in stream]
        streamed = await stream.get_final_message()
    raw = [event async for event in await client.messages.create(**kwargs, stream=True)]
    assert [b.type for b in plain.content] == ["thinking", "tool_use"]
    assert plain.content[0].thinking == "plan"

    def shape(message):
        blocks = [b.model_dump(exclude={"id"}) for b in message.content]
        return blocks, message.stop_reason, message.usage.output_tokens

    assert shape(streamed) == shape(plain)
    assert [e.type for e in raw] == [
        "message_start",
        *["content_block_start", "content_block_delta", "content_block_delta"],
        "content_block_stop",
        *["content_block_start", "content_block_delta", "content_block_stop"],
        "message_delta",
        "message_stop",
    ]
    assert [e.delta.type for e in raw if e.type == "content_block_delta"] == [
        "thinking_delta",
        "signature_delta",
        "input_json_delta",
    ]
    assert raw[-2].delta.stop_reason == "tool_use" and "message_stop" in events


async def test_a_thinking_block_echoed_extends_and_dropped_starts_a_segment(tokenizer):
    reply = "<think>\nplan\n</think>\n\nIt is sunny."
    gw, session, _ = await open_session(tokenizer, [reply, "ok", "ok"])
    client = client_for(gw, session)
    first = await client.messages.create(model="m", max_tokens=64, messages=PROMPT)
    thinking, text = first.content
    assert (thinking.thinking, text.text) == ("plan", "It is sunny.")
    follow = {"role": "user", "content": "And tomorrow?"}
    echoed = [*PROMPT, {"role": "assistant", "content": first.content}, follow]
    await client.messages.create(model="m", max_tokens=64, messages=echoed)
    assert len(session.segments) == 1
    dropped = [*PROMPT, {"role": "assistant", "content": [text]}, follow]
    await client.messages.create(model="m", max_tokens=64, messages=dropped)
    assert len(session.segments) == 2
    assert session.segments[1].branch_reason == "the history differs from segment 0's at message 1"


async def test_stop_reasons_and_the_stop_sequence(tokenizer):
    gw, session, _ = await open_session(tokenizer, ["It is sunny. END more", "a b c d e f g h"])
    client = client_for(gw, session)
    stopped = await client.messages.create(
        model="m", max_tokens=64, messages=PROMPT, stop_sequences=["END"]
    )
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "END")
    assert stopped.content[0].text == "It is sunny. "
    cut = await client.messages.create(model="m", max_tokens=2, messages=PROMPT)
    assert (cut.stop_reason, cut.stop_sequence, cut.usage.output_tokens) == ("max_tokens", None, 2)


async def test_the_sync_client_and_both_base_urls_reach_the_session(tokenizer):
    gw, session, _ = await open_session(tokenizer, ["one", "two"])

    def call(base_url):
        client = anthropic.Anthropic(base_url=base_url, api_key="agentloop", max_retries=0)
        return client.messages.create(model="m", max_tokens=8, messages=PROMPT).content[0].text

    for base_url, text in (
        (f"{gw.url}/sessions/{session.id}", "one"),
        (gw.base_url(session), "two"),
    ):
        assert await asyncio.to_thread(call, base_url) == text
    assert session.calls == 2


async def test_hosted_fields_and_headers_are_recorded_on_the_session(tokenizer):
    gw, session, _ = await open_session(tokenizer, ["hi"])
    client = client_for(gw, session)
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    await client.messages.create(
        model="m",
        max_tokens=8,
        system=system,
        messages=PROMPT,
        metadata={"user_id": "u1"},
        extra_body={"context_management": {"edits": []}},
        extra_headers={
            "anthropic-beta": "context-management-2025-06-27",
            "anthropic-version": "2023-06-01",  # as Claude Code sends it
        },
    )
    assert session.recorded == {
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "context-management-2025-06-27",
        "cache_control": 1,
        "context_management": {"edits": []},
        "metadata": {"user_id": "u1"},
    }


def anthropic_error(kind, message):
    return {"type": "error", "error": {"type": kind, "message": message}}


async def test_errors_come_in_the_anthropic_shape_with_their_status(tokenizer):
    gw, session, server = await open_session(tokenizer, ["hi"] * 3)
    url = f"{gw.url}/sessions/{session.id}/v1/messages"
    ok = {"model": "m", "max_tokens": 8, "messages": PROMPT}
    cases = [
        (
            {**ok, "messages": [*PROMPT, {"role": "assistant", "content": [{"type": "foo"}]}]},
            "messages.1.content.0.type: unknown block type 'foo'",
        ),
        (
            {**ok, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            "tools.0.type: 'web_search_20250305' (web_search) is a server tool the gateway "
            "cannot run; give the agent's own tool with a name and an input_schema",
        ),
        (
            {**ok, "tools": [{"name": "weather"}]},
            "tools.0.input_schema: tool 'weather' needs an input_schema object",
        ),
        ("{not json", "the request body is not valid JSON"),
    ]
    for body, message in cases:
        assert await post(url, body) == (400, anthropic_error("invalid_request_error", message))
    count_url = f"{url}/count_tokens"
    assert await post(count_url, {"messages": "hi"}) == (
        400,
        anthropic_error("invalid_request_error", "messages: must be a non-empty list of messages"),
    )

    async def down(*args, **kwargs):
        raise RuntimeError("no healthy server")

    server.generate = down
    assert await post(url, ok) == (
        500,
        anthropic_error("api_error", "RuntimeError: no healthy server"),
    )
    assert await post(url.replace(session.id, "nope"), ok) == (
        404,
        anthropic_error("not_found_error", "no session 'nope' on this gateway"),
    )
    assert (await post(f"{gw.url}/sessions/{session.id}/end", {}))[0] == 200
    assert await post(url, ok) == (
        409,
        anthropic_error(
            "invalid_request_error", f"session {session.id!r} has ended; start a new one"
        ),
    )


async def test_a_wrong_key_is_a_401_and_the_sdk_raises_on_it(tokenizer):
    gw, session, _ = await open_session(tokenizer, ["hi"], api_key="secret")
    url = f"{gw.url}/sessions/{session.id}/v1/messages"
    body = {"model": "m", "max_tokens": 8, "messages": PROMPT}
    assert await post(url, body, {"x-api-key": "wrong"}) == (
        401,
        anthropic_error("authentication_error", "wrong API key (rollout.gateway.api_key)"),
    )
    with pytest.raises(anthropic.AuthenticationError):
        await client_for(gw, session, key="wrong").messages.create(**body)
    reply = await client_for(gw, session, key="secret").messages.create(**body)
    assert reply.content[0].text == "hi"


async def test_a_command_agent_on_the_anthropic_sdk_finds_its_session_in_the_environment(
    tokenizer, tmp_path
):
    script = tmp_path / "agent.py"
    script.write_text(
        "import json, os\n"
        "import anthropic\n"
        "row = json.load(open(os.environ['AGENTLOOP_ROW']))\n"
        "client = anthropic.Anthropic(timeout=60, max_retries=0)  # ANTHROPIC_BASE_URL/_API_KEY\n"
        "r = client.messages.create(model='m', max_tokens=16, messages=row['raw_prompt'])\n"
        "print('said', r.content[0].text, r.stop_reason, flush=True)\n"
    )
    command = f"{sys.executable} {script}"
    loop, _ = make_loop(
        tokenizer, ["Sunny."], command=command, log_dir=str(tmp_path / "logs"), api_key="secret"
    )
    out = await loop.run({}, raw_prompt=PROMPT, data_source="t", reward_model={"ground_truth": "x"})
    logs = tmp_path / "logs" / out.record.session_id
    assert (logs / "stdout.txt").read_text() == "said Sunny. end_turn\n", (
        logs / "stderr.txt"
    ).read_text()
    assert out.record.stop_reason != "agent_error"
