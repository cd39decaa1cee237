"""Session-gateway benchmark (``make bench``): what does a call through the gateway add to the
same request sent straight to ``generate``?

One vLLM CPU engine (tiny-qwen3) behind a Ray ``AsyncServer`` and the server manager, one
event loop for both sides. Each round makes a first call through the gateway (full render of
the messages) and an extending call (the first call's messages + its reply + a user turn: an
``encode_delta``), sent with a plain HTTP client (aiohttp: what the gateway adds) and with
the ``openai`` SDK (what an agent on the SDK sees; the SDK's own client, a new one per
session as agents make them, costs its part against any OpenAI server). The direct side
replays, in the same round, exactly the request the gateway sent the engine for each call
(the same ids and sampling params), so both sides see the same prefix cache. Reported: p50/p95
of each and what each adds at p50 (target, printed and not asserted: <= 2 ms p50 added by
the gateway). The same round also makes both calls on the Anthropic Messages route (aiohttp,
the same messages as Anthropic blocks: the same prompt ids, checked), reported beside the
chat route with the ratio of their p50s. Writes bench_results/gateway.json.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import openai

from agentloop import AgentLoopContext, RolloutConfig
from agentloop.gateway import GatewayAgentLoop, Session
from agentloop.gateway.loop import gateway_of
from agentloop.tools.calculator import CALCULATOR_SCHEMA
from servers import AsyncLLMServerManager, ServerConfig, launch_servers
from servers.types import GenerateRequest, TokenOutput
from tests.ray_local import init_local_ray
from trainer.models import prepare

ROUNDS, WARMUP = 200, 20
PROMPT = [{"role": "user", "content": "What is 17 * 25? Use the calculator."}]
TOOL = CALCULATOR_SCHEMA
FOLLOW_UP = {"role": "user", "content": "Go on."}


class _Recorder:
    """The server manager, keeping the requests the gateway sends it (to replay them). Each
    turn samples the end-of-turn token (a logit bias on both sides, as the replay is the same
    request), so a turn closes and the next call extends it: tiny-qwen3 rarely ends a turn."""

    def __init__(self, manager: AsyncLLMServerManager, end_id: int) -> None:
        self.manager = manager
        self.end_id = end_id
        self.requests: list[GenerateRequest] = []

    async def generate(self, request: GenerateRequest) -> TokenOutput:
        params = request.sampling_params.merged({"logit_bias": {self.end_id: 100.0}})
        request = dataclasses.replace(request, sampling_params=params)
        self.requests.append(request)
        return await self.manager.generate(request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.manager, name)


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


async def _timed(call: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = await call
    return time.perf_counter() - start, result


async def _http_session(http: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    body: dict[str, Any] = {"messages": PROMPT, "tools": [TOOL], "max_tokens": 1}

    async def post() -> dict[str, Any]:
        async with http.post(url, json=body) as response:
            return await response.json()

    first, reply = await _timed(post())
    body["messages"] = [*PROMPT, reply["choices"][0]["message"], FOLLOW_UP]
    extending, _ = await _timed(post())
    return first, extending


async def _anthropic_session(http: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    tool = {"name": TOOL["function"]["name"], "input_schema": TOOL["function"]["parameters"]}
    tool["description"] = TOOL["function"]["description"]
    body: dict[str, Any] = {"messages": PROMPT, "tools": [tool], "max_tokens": 1}

    async def post() -> dict[str, Any]:
        async with http.post(url, json=body) as response:
            return await response.json()

    first, reply = await _timed(post())
    assistant = {"role": "assistant", "content": reply["content"]}
    body["messages"] = [*PROMPT, assistant, FOLLOW_UP]
    extending, _ = await _timed(post())
    return first, extending


async def _sdk_session(base_url: str) -> tuple[float, float]:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="k")
    create = client.chat.completions.create
    first, reply = await _timed(create(model="m", messages=PROMPT, tools=[TOOL], max_tokens=1))
    messages = [*PROMPT, reply.choices[0].message.model_dump(exclude_none=True), FOLLOW_UP]
    extending, _ = await _timed(create(model="m", messages=messages, tools=[TOOL], max_tokens=1))
    await client.close()
    return first, extending


async def _measure(manager: AsyncLLMServerManager, model: str) -> dict[str, list[float]]:
    config = RolloutConfig(
        prompt_length=512, response_length=256, chat_template_kwargs={"enable_thinking": False}
    )
    config.temperature = 0.0
    tokenizer = model_tokenizer(model)
    recorder = _Recorder(manager, tokenizer.convert_tokens_to_ids("<|im_end|>"))
    context = AgentLoopContext(recorder, tokenizer, config)
    loop = GatewayAgentLoop(context, agent=lambda row, llm: None)
    gateway = await gateway_of(context)
    names = ("direct_first_call", "direct_extending_call", "http_first_call")
    names += ("http_extending_call", "sdk_first_call", "sdk_extending_call")
    names += ("anthropic_first_call", "anthropic_extending_call")
    times: dict[str, list[float]] = {k: [] for k in names}
    http = aiohttp.ClientSession()
    for i in range(WARMUP + ROUNDS):
        recorder.requests.clear()
        session = Session(loop)
        gateway.open(session)
        http_times = await _http_session(http, f"{gateway.base_url(session)}/chat/completions")
        gateway.close(session)
        assert len(session.segments) == 1, "the extending call must extend the first call"
        first_request, extending_request = recorder.requests
        direct = []
        for n, request in enumerate((first_request, extending_request)):
            request = dataclasses.replace(request, session_id=f"d{i}-{n}")
            seconds, _ = await _timed(manager.generate(request))
            direct.append(seconds)

        session = Session(loop)
        gateway.open(session)
        sdk_times = await _sdk_session(gateway.base_url(session))
        gateway.close(session)
        assert len(session.segments) == 1, "the extending call must extend the first call"

        chat_prompts = [r.prompt_ids for r in (first_request, extending_request)]
        recorder.requests.clear()
        session = Session(loop)
        gateway.open(session)
        url = f"{gateway.url}/sessions/{session.id}/v1/messages"
        anthropic_times = await _anthropic_session(http, url)
        gateway.close(session)
        assert len(session.segments) == 1, "the extending call must extend the first call"
        assert [r.prompt_ids for r in recorder.requests] == chat_prompts, "not the same prompts"
        if i >= WARMUP:
            values = (*direct, *http_times, *sdk_times, *anthropic_times)
            for name, value in zip(names, values, strict=True):
                times[name].append(value)
    await http.close()
    await gateway.stop()
    return times


def model_tokenizer(model: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


def test_bench_gateway_overhead_per_call():
    model = str(prepare("tiny-qwen3"))
    init_local_ray()
    (server,) = launch_servers(ServerConfig(model=model, max_model_len=1024), 1)
    manager = AsyncLLMServerManager([server])
    times = asyncio.run(_measure(manager, model))
    result: dict[str, float] = {}
    print(f"\ngateway overhead, {ROUNDS} calls each after {WARMUP} warm-up (tiny-qwen3, CPU):")
    for name, values in times.items():
        p50, p95 = _pct(values, 0.5), _pct(values, 0.95)
        result[f"{name}_p50_ms"], result[f"{name}_p95_ms"] = p50, p95
        line = f"  {name:24s} p50 {p50:7.2f} ms  p95 {p95:7.2f} ms"
        if not name.startswith("direct"):
            same = "direct_" + name.split("_", 1)[1]
            added = p50 - result[f"{same}_p50_ms"]
            result[f"{name}_added_p50_ms"] = added
            line += f"  (+{added:.2f} ms p50 vs {same})"
        print(line)
    added = result["http_extending_call_added_p50_ms"]
    print(f"  target: <= 2 ms p50 added by the gateway (extending call, HTTP): {added:.2f} ms")
    for call in ("first_call", "extending_call"):
        ratio = result[f"anthropic_{call}_p50_ms"] / result[f"http_{call}_p50_ms"]
        result[f"anthropic_vs_chat_{call}_p50_ratio"] = ratio
        added = result[f"anthropic_{call}_added_p50_ms"] - result[f"http_{call}_added_p50_ms"]
        print(f"  anthropic/chat route, {call:14s}: p50 x{ratio:.3f} ({added:+.2f} ms added)")
    out = Path("bench_results")
    out.mkdir(exist_ok=True)
    (out / "gateway.json").write_text(json.dumps(result, indent=2))
