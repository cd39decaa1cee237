"""Session-gateway benchmark (``make bench``): what does a call through the gateway add to the
same request sent straight to ``generate``?

One vLLM CPU engine (tiny-qwen3) behind a Ray ``AsyncServer`` and the server manager, one
event loop for both sides. Each round makes, in turn: a direct ``generate`` of a prompt's ids
(``max_tokens=1``, greedy); the same prompt as a first call through the gateway (full render
of the messages) and an extending call (the earlier call's messages + its reply + a user
turn: an ``encode_delta``), both sent with a plain HTTP client (aiohttp: what the gateway
adds) and with the ``openai`` SDK (what an agent on the SDK sees; the SDK's own client, a new
one per session as agents make them, costs its part against any OpenAI server). Reported:
p50/p95 of each and what each adds at p50 (target, printed and not asserted: <= 2 ms p50
added by the gateway). Writes bench_results/gateway.json.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path

import aiohttp
import openai

from agentloop import AgentLoopContext, RolloutConfig
from agentloop.gateway import GatewayAgentLoop, Session
from agentloop.gateway.loop import gateway_of
from agentloop.tools.calculator import CALCULATOR_SCHEMA
from servers import AsyncLLMServerManager, ServerConfig, launch_servers
from tests.ray_local import init_local_ray
from trainer.models import prepare

ROUNDS, WARMUP = 200, 20
PROMPT = [{"role": "user", "content": "What is 17 * 25? Use the calculator."}]
TOOL = CALCULATOR_SCHEMA


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


async def _measure(manager: AsyncLLMServerManager, model: str) -> dict[str, list[float]]:
    config = RolloutConfig(
        prompt_length=512, response_length=256, chat_template_kwargs={"enable_thinking": False}
    )
    config.temperature = 0.0
    context = AgentLoopContext(manager, model_tokenizer(model), config)
    loop = GatewayAgentLoop(context, agent=lambda row, llm: None)
    gateway = await gateway_of(context)
    prompt_ids = await loop.encode_prompt(PROMPT, [TOOL])
    params = {"temperature": 0.0, "max_tokens": 1}
    times: dict[str, list[float]] = {
        k: []
        for k in (
            "direct",
            "http_first_call",
            "http_extending_call",
            "sdk_first_call",
            "sdk_extending_call",
        )
    }
    http = aiohttp.ClientSession()
    for i in range(WARMUP + ROUNDS):
        start = time.perf_counter()
        await manager.generate(f"d{i}", prompt_ids=prompt_ids, sampling_params=params)
        direct = time.perf_counter() - start

        session = Session(loop)
        gateway.open(session)
        client = openai.AsyncOpenAI(base_url=gateway.base_url(session), api_key="k")
        start = time.perf_counter()
        reply = await client.chat.completions.create(
            model="m", messages=PROMPT, tools=[TOOL], max_tokens=1
        )
        first = time.perf_counter() - start
        messages = [
            *PROMPT,
            reply.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "Go on."},
        ]
        start = time.perf_counter()
        await client.chat.completions.create(
            model="m", messages=messages, tools=[TOOL], max_tokens=1
        )
        extending = time.perf_counter() - start
        gateway.close(session)
        await client.close()

        session = Session(loop)
        gateway.open(session)
        url = f"{gateway.base_url(session)}/chat/completions"
        body = {"messages": PROMPT, "tools": [TOOL], "max_tokens": 1}
        start = time.perf_counter()
        async with http.post(url, json=body) as response:
            reply_body = await response.json()
        http_first = time.perf_counter() - start
        body["messages"] = [
            *PROMPT,
            reply_body["choices"][0]["message"],
            {"role": "user", "content": "Go on."},
        ]
        start = time.perf_counter()
        async with http.post(url, json=body) as response:
            await response.json()
        http_extending = time.perf_counter() - start
        gateway.close(session)
        if i >= WARMUP:
            for name, value in (
                ("direct", direct),
                ("sdk_first_call", first),
                ("sdk_extending_call", extending),
                ("http_first_call", http_first),
                ("http_extending_call", http_extending),
            ):
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
    direct = statistics.median(times["direct"]) * 1000
    result: dict[str, float] = {}
    print(f"\ngateway overhead, {ROUNDS} calls each after {WARMUP} warm-up (tiny-qwen3, CPU):")
    for name, values in times.items():
        p50, p95 = _pct(values, 0.5), _pct(values, 0.95)
        result[f"{name}_p50_ms"], result[f"{name}_p95_ms"] = p50, p95
        added = f"  (+{p50 - direct:.2f} ms p50 vs direct)" if name != "direct" else ""
        print(f"  {name:15s} p50 {p50:7.2f} ms  p95 {p95:7.2f} ms{added}")
    added = result["http_extending_call_p50_ms"] - direct
    print(f"  target: <= 2 ms p50 added by the gateway (extending call, HTTP): {added:.2f} ms")
    out = Path("bench_results")
    out.mkdir(exist_ok=True)
    (out / "gateway.json").write_text(json.dumps(result, indent=2))
