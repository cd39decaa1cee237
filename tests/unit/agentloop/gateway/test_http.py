"""The gateway's HTTP contract with real clients (the ``openai`` SDK, aiohttp): every bad
input named by the issue answers with its status and the OpenAI error shape naming the field
or config key; streaming in both APIs; the Responses API's items; external sessions."""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp
import openai
import pytest

from agentloop.gateway.loop import gateway_of
from tests.unit.agentloop.gateway.helpers import WEATHER, hermes_call, make_loop, open_session

PROMPT = [{"role": "user", "content": "Weather in Paris?"}]


pytestmark = pytest.mark.usefixtures("stopped_gateways")


async def post(url, body, key="agentloop"):
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as http:
        data = body if isinstance(body, str) else json.dumps(body)
        async with http.post(url, data=data, headers=headers) as r:
            return r.status, (await r.json() if r.content_type == "application/json" else None)


async def test_bad_requests_answer_with_status_and_the_field(tokenizer):
    gw, session, _ = await open_session(tokenizer, ["hi"] * 4)
    url = f"{gw.base_url(session)}/chat/completions"
    cases = [
        ({"model": "m"}, "messages"),
        ({"messages": PROMPT, "n": 2}, "n"),
        ({"messages": PROMPT, "max_tokens": 0}, "max_tokens"),
        ({"messages": PROMPT, "temperature": "hot"}, "temperature"),
        ({"messages": PROMPT, "tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": PROMPT, "stop": [1]}, "stop"),
    ]
    for body, param in cases:
        status, error = await post(url, body)
        assert status == 400, body
        assert error["error"]["param"] == param
        assert error["error"]["type"] == "invalid_request_error"
    status, error = await post(url, "{not json")
    assert status == 400 and "not valid JSON" in error["error"]["message"]

    status, error = await post(url.replace(session.id, "nope"), {"messages": PROMPT})
    assert status == 404 and "no session 'nope'" in error["error"]["message"]
    status, _ = await post(f"{gw.url}/sessions/{session.id}/end", {})
    assert status == 200
    status, error = await post(url, {"messages": PROMPT})
    assert status == 409 and "has ended" in error["error"]["message"]


async def test_session_limits_name_their_keys(tokenizer):
    gw, session, _ = await open_session(tokenizer, ["hi"] * 4, max_calls_per_session=1)
    url = f"{gw.base_url(session)}/chat/completions"
    assert (await post(url, {"messages": PROMPT}))[0] == 200
    status, error = await post(url, {"messages": PROMPT})
    assert status == 400
    assert "actor_rollout_ref.rollout.gateway.max_calls_per_session" in error["error"]["message"]

    gw, session, _ = await open_session(tokenizer, ["hello there"] * 4, max_tokens_per_session=2)
    url = f"{gw.base_url(session)}/chat/completions"
    status, body = await post(url, {"messages": PROMPT, "max_tokens": 50})
    assert status == 200 and body["usage"]["completion_tokens"] == 2
    assert session.max_tokens_cuts == 1  # 50 asked, 2 left: the cut is recorded
    status, error = await post(url, {"messages": PROMPT})
    assert status == 400
    assert "actor_rollout_ref.rollout.gateway.max_tokens_per_session" in error["error"]["message"]


async def test_wrong_api_key_is_401_on_every_route(tokenizer):
    gw, session, _ = await open_session(tokenizer, ["hi"], api_key="secret")
    status, error = await post(f"{gw.base_url(session)}/chat/completions", {"messages": PROMPT})
    assert status == 401 and "rollout.gateway.api_key" in error["error"]["message"]
    url = f"{gw.base_url(session)}/chat/completions"
    assert (await post(url, {"messages": PROMPT}, key="secret"))[0] == 200
    for route in ("reward", "end"):  # every route wants the key
        status, error = await post(f"{gw.url}/sessions/{session.id}/{route}", {"reward": 1})
        assert status == 401 and error["error"]["type"] == "auth_error"
    assert (await post(f"{gw.url}/sessions", {}))[0] == 401


async def test_an_engine_fault_is_a_500_in_the_openai_shape(tokenizer, caplog):
    gw, session, server = await open_session(tokenizer, ["hi"])

    async def down(*args, **kwargs):
        raise RuntimeError("no healthy server")

    server.generate = down
    status, error = await post(f"{gw.base_url(session)}/chat/completions", {"messages": PROMPT})
    assert status == 500 and error["error"]["type"] == "server_error"
    assert error["error"]["message"] == "RuntimeError: no healthy server"
    assert "gateway call on session" in caplog.text  # logged with its traceback
    server.generate = type(server).generate.__get__(server)
    assert (await post(f"{gw.base_url(session)}/chat/completions", {"messages": PROMPT}))[0] == 200


async def test_streamed_chat_gives_the_same_tool_calls(tokenizer):
    turns = [hermes_call("weather", city="Paris")] * 2
    gw, session, _ = await open_session(tokenizer, turns)
    client = openai.AsyncOpenAI(base_url=gw.base_url(session), api_key="k", max_retries=0)
    plain = await client.chat.completions.create(model="m", messages=PROMPT, tools=[WEATHER])
    stream = await client.chat.completions.create(
        model="m",
        messages=PROMPT,
        tools=[WEATHER],
        stream=True,
        stream_options={"include_usage": True},
    )
    calls, finish, usage = {}, None, None
    async for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for tc in choice.delta.tool_calls or []:
                calls[tc.index] = (tc.function.name, tc.function.arguments)
    call = plain.choices[0].message.tool_calls[0]
    assert calls == {0: (call.function.name, call.function.arguments)}
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert finish == plain.choices[0].finish_reason == "tool_calls"
    assert usage.completion_tokens == plain.usage.completion_tokens


async def test_responses_api_items_extend_one_segment(tokenizer):
    turns = [hermes_call("weather", city="Paris"), "Sunny in Paris."]
    gw, session, server = await open_session(tokenizer, turns)
    client = openai.AsyncOpenAI(base_url=gw.base_url(session), api_key="k", max_retries=0)
    tools = [{"type": "function", **WEATHER["function"]}]
    first = await client.responses.create(model="m", input="Weather in Paris?", tools=tools)
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "weather" and json.loads(call.arguments) == {"city": "Paris"}
    items = [
        {"role": "user", "content": "Weather in Paris?"},
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
    ]
    stream = await client.responses.create(model="m", input=items, tools=tools, stream=True)
    done = [event async for event in stream if event.type == "response.completed"]
    assert done[0].response.output[0].content[0].text == "Sunny in Paris."
    assert len(session.segments) == 1 and session.segments[0].user_turns == 1
    assert server.requests[1]["prompt_ids"][-1] != server.sampled[0][-1]  # a delta came between


async def test_previous_response_id_is_refused_with_the_field(tokenizer):
    gw, session, _ = await open_session(tokenizer, ["hi"])
    url = f"{gw.base_url(session)}/responses"
    status, error = await post(url, {"input": "hi", "previous_response_id": "resp_1"})
    assert status == 400 and error["error"]["param"] == "previous_response_id"
    status, error = await post(url, {"input": [{"type": "web_search_call"}]})
    assert status == 400 and error["error"]["param"] == "input[0].type"


async def test_external_agent_claims_a_session_and_ends_it(tokenizer):
    loop, server = make_loop(tokenizer, ["Sunny."], external=True)
    rollout = asyncio.create_task(loop.run({}, raw_prompt=PROMPT, data_source="t"))
    gw = await gateway_of(loop.context)
    for _ in range(100):
        status, claim = await post(f"{gw.url}/sessions", {})
        if status == 200:
            break
        await asyncio.sleep(0.01)
    assert claim["row"]["raw_prompt"] == PROMPT
    sid = claim["session_id"]
    assert (await post(f"{gw.url}/sessions/{sid}/state", {"state_key": "paris"}))[0] == 200
    for body in ({"state_key": ""}, {"state_key": 3}, {}):
        status, error = await post(f"{gw.url}/sessions/{sid}/state", body)
        assert status == 400 and error["error"]["param"] == "state_key"
        assert error["error"]["message"] == "state_key must be a non-empty string"
    client = openai.AsyncOpenAI(base_url=claim["base_url"], api_key=claim["api_key"])
    await client.chat.completions.create(model=claim["model"], messages=PROMPT)
    assert (await post(f"{gw.url}/sessions/{sid}/reward", {"reward": 0.5}))[0] == 200
    status, error = await post(f"{gw.url}/sessions/{sid}/reward", {"reward": "high"})
    assert status == 400 and error["error"]["param"] == "reward"
    assert (await post(f"{gw.url}/sessions/{sid}/end", {}))[0] == 200
    out = await asyncio.wait_for(rollout, 10)
    assert out.reward_score == 0.5 and out.response_ids == server.sampled[0]
    assert out.record.turn_states == ["paris"]  # the state its one call acted on
    status, _ = await post(f"{gw.url}/sessions/{sid}/state", {"state_key": "late"})
    assert status in (404, 409)  # the session is over
    assert (await post(f"{gw.url}/sessions", {}))[0] == 204  # nothing else waits


@pytest.mark.parametrize("exit_code", [0, 3])
async def test_command_agent_gets_its_session_in_the_environment(tokenizer, tmp_path, exit_code):
    script = tmp_path / "agent.py"
    script.write_text(
        "import json, os, sys, urllib.request\n"
        "import openai\n"
        "row = json.load(open(os.environ['AGENTLOOP_ROW']))\n"
        "client = openai.OpenAI(timeout=60)\n"
        "r = client.chat.completions.create(model=os.environ['OPENAI_MODEL'],"
        " messages=row['raw_prompt'])\n"
        "print('said', r.choices[0].message.content, flush=True)\n"
        "req = urllib.request.Request(os.environ['AGENTLOOP_REWARD_URL'],"
        " data=json.dumps({'reward': 0.25}).encode(), method='POST')\n"
        "urllib.request.urlopen(req, timeout=60)\n"
        f"sys.exit({exit_code})\n"
    )
    command = f"{sys.executable} {script}"
    loop, server = make_loop(tokenizer, ["Sunny."], command=command, log_dir=str(tmp_path / "logs"))
    out = await loop.run({}, raw_prompt=PROMPT, data_source="t")
    logs = tmp_path / "logs" / out.record.session_id
    assert (logs / "stdout.txt").read_text() == "said Sunny.\n"
    if exit_code == 0:
        assert out.reward_score == 0.25 and out.record.stop_reason != "agent_error"
    else:
        assert out.reward_score == 0.0 and out.record.stop_reason == "agent_error"
        assert "exited with 3" in out.extra["agent_error"]


async def test_hung_command_agent_is_killed_at_its_time_limit(tokenizer, tmp_path):
    loop, _ = make_loop(
        tokenizer, [], command=["sleep", "30"], agent_timeout_s=0.5, log_dir=str(tmp_path)
    )
    start = asyncio.get_running_loop().time()
    out = await loop.run({}, raw_prompt=PROMPT, data_source="t")
    assert asyncio.get_running_loop().time() - start < 5
    assert "agent_timeout_s=0.5" in out.extra["agent_error"] and out.reward_score == 0.0
    assert out.response_ids == [] and out.record.weight == 1.0


@pytest.mark.parametrize("agent_sets", [False, True])
async def test_temperature_follows_the_rollout_unless_the_agent_may_choose(tokenizer, agent_sets):
    gw, session, server = await open_session(tokenizer, ["hi"], agent_sets_temperature=agent_sets)
    body = {"messages": PROMPT, "temperature": 0.0, "top_p": 0.5}
    assert (await post(f"{gw.base_url(session)}/chat/completions", body))[0] == 200
    sent = server.requests[0]
    rollout = session.loop.config  # RolloutConfig defaults: temperature 1.0, top_p 1.0
    expected = (0.0, 0.5) if agent_sets else (rollout.temperature, rollout.top_p)
    assert (sent["temperature"], sent["top_p"]) == expected


async def test_models_lists_the_served_model_of_an_open_session(tokenizer):
    gw, session, _ = await open_session(tokenizer, [])
    client = openai.AsyncOpenAI(base_url=gw.base_url(session), api_key="k", max_retries=0)
    models = await client.models.list()
    assert [m.id for m in models.data] == [gw.model]
    gone = openai.AsyncOpenAI(
        base_url=gw.base_url(session).replace(session.id, "nope"), api_key="k", max_retries=0
    )
    with pytest.raises(openai.NotFoundError, match="no open session 'nope'"):
        await gone.models.list()
