"""The example agents of ``examples/gateway/`` on a real vLLM CPU engine (tiny-qwen3, the
session's shared server): each framework's agent runs a scored rollout through the real
gateway, in this process over the server manager, with the unit tests' exactness checks on
the engine's own outputs (every request its segment's trajectory so far, the sampled ids and
engine log-probs kept in order, prompts the full render of each segment's first messages);
then all five through Ray AgentLoopWorkers from ``examples/gateway/agents.yaml``; and a
Claude-Code-like agent on the ``anthropic`` SDK through the Anthropic Messages routes; and the
real Claude Code and Codex CLIs as ``harness:`` agents in their sandboxes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
from typing import Any

import anthropic
import pytest
import yaml
from transformers import AutoTokenizer

from agentloop import AgentConfig, AgentLoopContext, AgentLoopManager, RolloutConfig
from agentloop.gateway import GatewayAgentLoop
from agentloop.gateway.harness import HarnessNotInstalled, HarnessSpec, resolve_binary
from agentloop.tokens import encode_prompt
from agentloop.worker import AgentLoopWorker
from examples.gateway.calc_tools import TOOLS
from examples.gateway.data import gateway_rows
from servers import AsyncLLMServerManager
from tests.integration.agentloop.helpers import max_logprob_gap
from tests.unit.agentloop.gateway.agents import LONG_SYSTEM
from tests.unit.agentloop.gateway.test_frameworks import check_exact

pytestmark = pytest.mark.integration

# the shared server is 512 tokens long: a prompt with both tools is ~290 of them
PROMPT_LEN, RESPONSE_LEN = 416, 96
SMOL_SYSTEM = "Solve the task with the tools; answer with final_answer.\n{{custom_instructions}}"
AGENTS = {
    "openai_sdk_agent": {},
    "agents_sdk_agent": {},
    "langgraph_agent": {},
    # smolagents' own system prompt is ~950 tokens: a short one, and one step
    "smolagents_agent": {"max_steps": 1, "system_prompt": SMOL_SYSTEM},
    "summarizing_agent": {"summarize_after": 1},
}


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_path):
    return AutoTokenizer.from_pretrained(tiny_qwen3_path)


def config(**agent) -> RolloutConfig:
    return RolloutConfig(
        prompt_length=PROMPT_LEN, response_length=RESPONSE_LEN, agent=AgentConfig(**agent)
    )


class RecordingClient:
    """The server manager, keeping each request's prompt ids and what the engine returned."""

    def __init__(self, manager: AsyncLLMServerManager) -> None:
        self.manager = manager
        self.calls: list[tuple[list[int], list[int], list[float]]] = []

    async def generate(self, request):
        out = await self.manager.generate(request)
        self.calls.append(
            (list(request.prompt_ids), list(out.token_ids), list(out.log_probs or []))
        )
        return out


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("name", list(AGENTS))
async def test_each_framework_agent_scores_an_exact_session_on_the_engine(
    tiny_server, tokenizer, name
):
    (row,) = gateway_rows(1, seed=3, split="val", agent=f"gateway_{name}")
    row["raw_prompt"] = row.pop("prompt")
    client = RecordingClient(AsyncLLMServerManager([tiny_server]))
    context = AgentLoopContext(client, tokenizer, config())
    loop = GatewayAgentLoop(context, agent=f"examples.gateway.{name}:agent", **AGENTS[name])
    try:
        out = await loop.run(context.config.sampling_params(), **row)
    finally:
        await context.gateway.stop()

    assert "agent_error" not in out.extra, out.extra.get("agent_error")
    assert out.reward_score in (0.0, 1.0)  # the agent's score of its answer
    session = loop.session
    assert session.calls == len(client.calls) >= 1
    check_exact(out, client.calls, session, tokenizer, {})
    first = session.segments[0]
    assert first.prompt_messages[-1]["content"] in (
        row["raw_prompt"][-1]["content"],
        "New task:\n" + row["raw_prompt"][-1]["content"],  # smolagents
        [{"type": "text", "text": "New task:\n" + row["raw_prompt"][-1]["content"]}],
    )
    if name in ("openai_sdk_agent", "summarizing_agent"):
        assert out.prompt_ids == encode_prompt(tokenizer, row["raw_prompt"], tools=TOOLS)
    weights = [o.record.weight for o in (out, *out.segments)]
    assert weights == [1 / len(weights)] * len(weights)


def test_the_agents_yaml_runs_every_framework_in_ray_workers(
    tiny_server, tokenizer, tiny_qwen3_path, tmp_path
):
    loops = yaml.safe_load(open("examples/gateway/agents.yaml"))
    for entry in loops:
        entry.update(AGENTS[entry["agent"].split(".")[-1].split(":")[0]])
    (tmp_path / "agents.yaml").write_text(yaml.safe_dump(loops))
    rows = [
        {**row, "raw_prompt": row.pop("prompt")}
        for i, entry in enumerate(loops)
        for row in gateway_rows(1, seed=10 + i, split="val", agent=entry["name"])
    ]
    cfg = config(num_workers=2, agent_loop_config_path=str(tmp_path / "agents.yaml"))
    manager = AgentLoopManager(cfg, [tiny_server], str(tiny_qwen3_path))
    try:
        manager.validate(rows)
        batch = manager.generate_sequences(rows, sampling_params=cfg.sampling_params())
    finally:
        manager.shutdown()

    names = [entry["name"] for entry in loops]
    assert set(batch.agent_name) == set(names)
    sessions: dict[str, float] = {}
    for record in batch.records:
        assert record.session_id and record.stop_reason != "agent_error"
        sessions[record.session_id] = sessions.get(record.session_id, 0.0) + record.weight
    # one session per row; its segments (smolagents: one per call) weigh one session together
    assert len(sessions) == len(rows) and all(w == pytest.approx(1.0) for w in sessions.values())
    assert all(score in (0.0, 1.0) for score in batch.reward_score)
    assert max_logprob_gap(batch, tiny_qwen3_path, PROMPT_LEN) < 1e-3


# ---- the Anthropic Messages dialect with the real ``anthropic`` SDK ----------------------------
WEATHER_TOOL = {
    "name": "weather",
    "description": "Weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
FORCED_CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'


class SteeringClient(RecordingClient):
    """Steers the random tiny model on the real engine: the first call writes ``FORCED_CALL``
    (each token a real engine sample of one token, its logit biased to the forced id), every
    later call samples 3 tokens and then its end-of-turn token (biased), so turns close."""

    def __init__(self, manager: AsyncLLMServerManager, forced: list[int], end_id: int) -> None:
        super().__init__(manager)
        self.forced, self.end_id = forced, end_id

    async def generate(self, request):
        if self.calls:
            bias = {"logit_bias": {self.end_id: 100.0}, "min_tokens": 3}
            params = request.sampling_params.merged(bias)
            out = await self.manager.generate(dataclasses.replace(request, sampling_params=params))
        else:
            out = await self._forced(request)
        self.calls.append((list(request.prompt_ids), list(out.token_ids), list(out.log_probs)))
        return out

    async def _forced(self, request):
        ids: list[int] = []
        log_probs: list[float] = []
        for i, token in enumerate(self.forced):
            last = i == len(self.forced) - 1  # the end token: room for the engine to stop
            bias = {"logit_bias": {token: 100.0}, "max_tokens": 2 if last else 1}
            step = dataclasses.replace(
                request,
                prompt_ids=[*request.prompt_ids, *ids],
                sampling_params=request.sampling_params.merged(bias),
            )
            out = await self.manager.generate(step)
            ids += out.token_ids
            log_probs += out.log_probs
        return dataclasses.replace(out, token_ids=ids, log_probs=log_probs, versions=None)


class ClaudeLikeAgent:
    """A tool loop on the ``anthropic`` SDK, pointed at the session the way Claude Code is
    (``ANTHROPIC_BASE_URL`` = the session without ``/v1``): async create (a tool_use), a
    count_tokens of the next call, ``messages.stream`` (the answer to the tool result), a
    ``stream=True`` call and a sync-client call, each extending the history."""

    def __init__(self) -> None:
        self.seen: dict[str, Any] = {}

    async def __call__(self, row: dict[str, Any], llm: Any) -> float:
        base, key = llm.anthropic_base_url, llm.api_key
        client = anthropic.AsyncAnthropic(base_url=base, api_key=key, max_retries=0)
        kwargs = {"model": llm.model, "max_tokens": 32, "tools": [WEATHER_TOOL]}
        messages = list(row["raw_prompt"])
        first = await client.messages.create(messages=messages, **kwargs)
        (use,) = [b for b in first.content if b.type == "tool_use"]
        result = {
            "type": "tool_result",
            "tool_use_id": use.id,
            "content": f"{use.input['city']}: sunny",
        }
        messages += [
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [result]},
        ]
        count = await client.messages.count_tokens(
            model=llm.model, messages=messages, tools=[WEATHER_TOOL]
        )
        async with client.messages.stream(messages=messages, **kwargs) as stream:
            answer = await stream.get_final_message()
        messages += [
            {"role": "assistant", "content": answer.content},
            {"role": "user", "content": "Thanks. And tomorrow?"},
        ]
        raw = [
            e async for e in await client.messages.create(messages=messages, stream=True, **kwargs)
        ]
        start, stop = raw[0].message, raw[-2]
        text = "".join(
            e.delta.text
            for e in raw
            if e.type == "content_block_delta" and e.delta.type == "text_delta"
        )
        messages += [
            {"role": "assistant", "content": [{"type": "text", "text": text}] if text else []},
            {"role": "user", "content": "Bye."},
        ]
        sync = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
        last = await asyncio.to_thread(sync.messages.create, messages=messages, **kwargs)
        self.seen.update(
            first=first, count=count, answer=answer, raw=raw, start=start, stop=stop, last=last
        )
        return float(first.stop_reason == "tool_use")


@pytest.mark.asyncio(loop_scope="module")
async def test_the_anthropic_sdk_runs_an_exact_tool_round_trip_on_the_engine(
    tiny_server, tokenizer
):
    end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    forced = [*tokenizer.encode(FORCED_CALL, add_special_tokens=False), end_id]
    client = SteeringClient(AsyncLLMServerManager([tiny_server]), forced, end_id)
    cfg = RolloutConfig(prompt_length=PROMPT_LEN, response_length=160)
    cfg.temperature = 0.0
    context = AgentLoopContext(client, tokenizer, cfg)
    agent = ClaudeLikeAgent()
    loop = GatewayAgentLoop(context, agent=agent)
    row = {"raw_prompt": [{"role": "user", "content": "Weather in Paris?"}]}
    try:
        out = await loop.run(cfg.sampling_params(), **row)
    finally:
        await context.gateway.stop()

    assert "agent_error" not in out.extra, out.extra.get("agent_error")
    seen, session = agent.seen, loop.session
    first = seen["first"]
    assert first.stop_reason == "tool_use" and out.reward_score == 1.0
    assert [(b.name, b.input) for b in first.content] == [("weather", {"city": "Paris"})]
    assert first.usage.output_tokens == len(forced)
    # every call extended the one segment: the engine's ids exact, the tool result a delta
    assert len(session.segments) == 1 and session.calls == len(client.calls) == 4
    (deltas,) = check_exact(out, client.calls, session, tokenizer, {})
    assert out.response_ids[: len(forced)] == forced
    assert "Paris: sunny" in tokenizer.decode(deltas[0])
    # count_tokens is the prompt the next call was sampled after
    assert (
        seen["count"].input_tokens == seen["answer"].usage.input_tokens == len(client.calls[1][0])
    )
    assert seen["answer"].stop_reason == "end_turn" and seen["answer"].usage.output_tokens == 4
    assert seen["start"].usage.input_tokens == len(client.calls[2][0])
    assert (seen["stop"].type, seen["stop"].delta.stop_reason) == ("message_delta", "end_turn")
    assert seen["last"].usage.input_tokens == len(client.calls[3][0])


# ---- the Responses API as Codex sends it, and the gateway's two faults -------------------------
CODEX_TOOLS = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Run a command.",
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}},
            "required": ["cmd"],
        },
    },
    {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch."},
    {"type": "web_search", "external_web_access": False},
    {
        "type": "namespace",
        "name": "mcp__docs__",
        "description": "Tools in the mcp__docs__ namespace.",
        "tools": [{"type": "function", "name": "search_docs", "parameters": {}}],
    },
]
CODEX_FIELDS = {
    "instructions": "You are Codex, a coding agent.",
    "tools": CODEX_TOOLS,
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "codex-session-1",
}


@pytest.mark.asyncio(loop_scope="module")
async def test_a_codex_shaped_responses_session_is_exact_on_the_engine(tiny_server, tokenizer):
    events: list[Any] = []
    developer = {
        "type": "message",
        "role": "developer",
        "content": [{"type": "input_text", "text": "Sandbox: workspace-write."}],
    }

    async def codex_agent(row: dict[str, Any], llm: Any) -> float:
        task = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": row["raw_prompt"][-1]["content"]}],
        }
        items: list[Any] = [developer, task]
        stream = await llm.client.responses.create(
            model=llm.model, input=items, stream=True, **CODEX_FIELDS
        )
        events.extend([event async for event in stream])
        items += [item.model_dump(exclude_none=True) for item in events[-1].response.output]
        items.append({"role": "user", "content": "Check it."})
        async with llm.client.responses.stream(
            model=llm.model, input=items, instructions=CODEX_FIELDS["instructions"]
        ) as second:
            await second.get_final_response()
        return 1.0

    row = {"raw_prompt": [{"role": "user", "content": "Fix calc.py"}], "data_source": "t"}
    client = RecordingClient(AsyncLLMServerManager([tiny_server]))
    context = AgentLoopContext(client, tokenizer, config())
    loop = GatewayAgentLoop(context, agent=codex_agent)
    try:
        out = await loop.run(context.config.sampling_params(), **row)
    finally:
        await context.gateway.stop()

    assert "agent_error" not in out.extra, out.extra.get("agent_error")
    types = [event.type for event in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    done = events[-1].response
    for index, item in enumerate(done.output):  # each item opened and closed, in order
        added = [e for e in events if e.type == "response.output_item.added"][index]
        closed = [e for e in events if e.type == "response.output_item.done"][index]
        assert added.output_index == closed.output_index == index
        assert closed.item.model_dump() == item.model_dump()
    texts = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(texts) == "".join(
        part.text for item in done.output if item.type == "message" for part in item.content
    )
    prompt_ids, sampled, _ = client.calls[0]
    assert done.usage.input_tokens == len(prompt_ids)
    assert done.usage.output_tokens == len(sampled)
    assert done.usage.input_tokens_details.cached_tokens == 0
    prompt = tokenizer.decode(prompt_ids)
    assert prompt.startswith(
        "<|im_start|>system\nYou are Codex, a coding agent.\n\nSandbox: workspace-write."
    )
    assert "search_docs" in prompt and "apply_patch" in prompt and "web_search" not in prompt
    session = loop.session
    assert session.recorded == {
        "reasoning": {"effort": "medium", "summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        "store": False,
        "parallel_tool_calls": True,
        "prompt_cache_key": "codex-session-1",
        "dropped_tools": ["web_search"],
    }
    check_exact(out, client.calls, session, tokenizer, {})
    # a first turn closed by its end token is extended by the echoed output (reasoning
    # included); one cut by the length budget cannot be, and the second call branches
    closed = sampled[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert len(session.segments) == (1 if closed else 2)


@pytest.mark.asyncio(loop_scope="module")
async def test_an_over_budget_first_prompt_fails_its_sample_and_the_batch_goes_on(
    tiny_server, tokenizer, tmp_path
):
    loops = [
        {
            "name": "gw_ok",
            "_target_": "agentloop.gateway.GatewayAgentLoop",
            "agent": "examples.gateway.openai_sdk_agent:agent",
        },
        {
            "name": "gw_overlong",
            "_target_": "agentloop.gateway.GatewayAgentLoop",
            "agent": "tests.unit.agentloop.gateway.agents:overlong_agent",
        },
    ]
    (tmp_path / "loops.yaml").write_text(yaml.safe_dump(loops))
    cfg = config(agent_loop_config_path=str(tmp_path / "loops.yaml"))
    client = RecordingClient(AsyncLLMServerManager([tiny_server]))
    worker = AgentLoopWorker(cfg, client, tokenizer, tools={})
    (ok_row,) = gateway_rows(1, seed=5, split="val", agent="gw_ok")
    ok_row["raw_prompt"] = ok_row.pop("prompt")
    prompt = [{"role": "user", "content": "Weather in Paris?"}]
    rows = [ok_row, {"raw_prompt": prompt, "agent_name": "gw_overlong", "data_source": "t"}]
    try:
        ok, failed = await worker.generate_sequences(rows, cfg.sampling_params())
    finally:
        if worker.context.gateway is not None:
            await worker.context.gateway.stop()

    assert "agent_error" not in ok.extra, ok.extra.get("agent_error")
    assert ok.response_ids and ok.reward_score in (0.0, 1.0)
    tokens = len(encode_prompt(tokenizer, [{"role": "system", "content": LONG_SYSTEM}, *prompt]))
    assert failed.extra["agent_error"] == (
        "the agent made no completed model call (1 refused or failed); the last call was "
        f"answered: ContextLengthError: the prompt has {tokens} tokens, over the limit of "
        f"{PROMPT_LEN} tokens (set actor_rollout_ref.rollout.prompt_length higher, or shorten it)"
    )
    assert failed.reward_score == 0.0 and failed.record.stop_reason == "agent_error"
    assert failed.response_ids == [] and failed.prompt_ids == encode_prompt(tokenizer, prompt)


def _harness_processes(binaries: list[str]) -> list[int]:
    """Live processes running one of ``binaries`` (a sandboxed CLI keeps its host path)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if os.path.realpath(f"/proc/{pid}/exe") in binaries:
                found.append(int(pid))
    return found


@pytest.mark.asyncio(loop_scope="module")
async def test_the_real_claude_code_and_codex_clis_fail_their_samples_at_the_window(
    tiny_server, tokenizer, tmp_path
):
    """Claude Code and Codex as installed by ``make harnesses``, sandboxed per sample, beside a
    framework agent in one batch: their first prompts (~19k and ~8k tokens rendered) are over
    the budget, so the gateway answers the context-length 400 before the engine; each CLI
    exits non-zero, its sample fails with the 400 in its reason, the batch goes on."""
    binaries = {}
    for name in ("claude-code", "codex"):
        try:
            binaries[name] = str(resolve_binary(HarnessSpec.of(name)).resolve())
        except HarnessNotInstalled as e:
            pytest.skip(f"the harness CLIs are not installed (make harnesses needs npm): {e}")
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "app.py").write_text("def add(a, b):\n    return a - b\n")
    task = {"workspace": "repo", "check": "python -c 'import app; assert app.add(1, 2) == 3'"}
    harness = {"workspace_dir": str(tmp_path), "timeout_s": 300}
    loops = [
        {"name": "gw_ok", "_target_": "agentloop.gateway.GatewayAgentLoop",
         "agent": "examples.gateway.openai_sdk_agent:agent"},
        *({"name": f"gw_{name}", "_target_": "agentloop.gateway.GatewayAgentLoop",
           "harness": {"name": name, **harness}} for name in binaries),
    ]  # fmt: skip
    (tmp_path / "loops.yaml").write_text(yaml.safe_dump(loops))
    cfg = config(agent_loop_config_path=str(tmp_path / "loops.yaml"))
    cfg = dataclasses.replace(cfg, gateway=dataclasses.replace(cfg.gateway, log_dir=str(tmp_path)))
    client = RecordingClient(AsyncLLMServerManager([tiny_server]))
    worker = AgentLoopWorker(cfg, client, tokenizer, tools={})
    (ok_row,) = gateway_rows(1, seed=6, split="val", agent="gw_ok")
    ok_row["raw_prompt"] = ok_row.pop("prompt")
    prompt = [{"role": "user", "content": "Fix add in app.py."}]
    rows = [ok_row] + [
        {"raw_prompt": prompt, "agent_name": f"gw_{name}", "extra_info": {"workspace_task": task}}
        for name in binaries
    ]
    try:
        ok, *failed = await worker.generate_sequences(rows, cfg.sampling_params())
    finally:
        await worker.close_workspaces()  # the CLIs' workspace pools go with the worker
        if worker.context.gateway is not None:
            await worker.context.gateway.stop()

    assert "agent_error" not in ok.extra, ok.extra.get("agent_error")
    assert ok.response_ids and ok.reward_score in (0.0, 1.0)
    engine_prompts = {tuple(ids) for ids, _, _ in client.calls}
    for name, out in zip(binaries, failed, strict=True):
        error = out.extra["agent_error"]
        assert out.reward_score == 0.0 and out.record.stop_reason == "agent_error"
        assert out.response_ids == [] and tuple(out.prompt_ids) not in engine_prompts
        assert f"agentloop.gateway.endpoint.AgentFailed: the harness '{name}' exited with 1: " in (
            error
        )
        assert error.endswith("; the check then scored 0"), error  # add was not fixed
        said = (
            rf"API Error: 400 the prompt has \d+ tokens, over the limit of {PROMPT_LEN} tokens"
            if name == "claude-code"
            else r"Codex ran out of room in the model's context window"
        )
        assert re.search(said, error), error
        logs = tmp_path / out.record.session_id
        transcript = (logs / "transcript.txt").read_text()
        assert re.search(said, transcript)
        session_log = "home/.claude/projects/*/*.jsonl" if name == "claude-code" else (
            "home/codex/sessions/*/*/*/rollout-*.jsonl")  # fmt: skip
        assert list(logs.glob(session_log)), sorted(logs.rglob("*"))
    assert _harness_processes(list(binaries.values())) == []
