"""LangGraph agents on a real vLLM CPU engine (tiny-qwen3, the session's shared server):
``react_agent`` rows (and the langgraph_agent recipe's loop) through Ray AgentLoopWorkers with
exact trajectories and engine log-probs, and a ``ChatOpenAI`` ReAct graph against the
server's OpenAI-compatible endpoint (evaluation path)."""

from __future__ import annotations

import json
import re

import pytest
import ray
import yaml
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import ToolNode, tools_condition
from transformers import AutoTokenizer

from agentloop import AgentConfig, AgentLoopManager, MultiTurnConfig, RolloutConfig
from agentloop.langgraph import build_react_graph
from agentloop.tokens import mask_spans
from recipes.langgraph_agent.data import make_rows
from tests.integration.agentloop.helpers import ECHO_SCHEMA, max_logprob_gap

pytestmark = pytest.mark.integration

PROMPT_LEN, RESPONSE_LEN, TURN = 384, 96, 12
REPO_LOOPS = "recipes/langgraph_agent/agent.yaml"


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_path):
    return AutoTokenizer.from_pretrained(tiny_qwen3_path)


@pytest.fixture(scope="module")
def server(tiny_server):
    """The session's shared tiny-qwen3 server (``tests/ray_local.py``), 512 tokens long."""
    return tiny_server


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("langgraph")
    tool_entry = {
        "class_name": "tests.integration.agentloop.helpers.EchoTool",
        "config": {"type": "native", "latency_s": 0.02},
        "tool_schema": ECHO_SCHEMA,
    }
    (d / "tools.yaml").write_text(yaml.safe_dump({"tools": [tool_entry]}))
    loops = yaml.safe_load(open(REPO_LOOPS))
    loops.append(
        {
            "name": "echo_react",
            "_target_": "tests.integration.agentloop.helpers.CappedTurnsReactAgentLoop",
        }
    )
    (d / "loops.yaml").write_text(yaml.safe_dump(loops))
    return d


@pytest.fixture(scope="module")
def rows():
    echo = [
        {
            "raw_prompt": [{"role": "user", "content": f"Repeat item {i}."}],
            "agent_name": "echo_react",
            "tools_kwargs": {"echo": {"create_kwargs": {"prefix": f"r{i}:"}}},
            "index": i,
        }
        for i in range(3)
    ]
    math = [
        {"raw_prompt": r["prompt"], "agent_name": r["agent_name"], "index": 10 + i}
        for i, r in enumerate(make_rows(2, seed=0, split="val"))
    ]
    return echo + math


@pytest.fixture(scope="module")
def batch(server, files, rows, tiny_qwen3_path):
    config = RolloutConfig(
        prompt_length=PROMPT_LEN,
        response_length=RESPONSE_LEN,
        n=2,
        multi_turn=MultiTurnConfig(
            max_assistant_turns=4,
            max_tokens_per_turn=TURN,
            tool_config_path=str(files / "tools.yaml"),
        ),
        agent=AgentConfig(num_workers=2, agent_loop_config_path=str(files / "loops.yaml")),
        chat_template_kwargs={"enable_thinking": False},
    )
    manager = AgentLoopManager(config, [server], str(tiny_qwen3_path))
    manager.validate(rows)
    out = manager.generate_sequences(rows, sampling_params=config.sampling_params())
    manager.shutdown()
    return out


def test_react_rows_take_several_turns_with_tool_deltas_as_template_text(batch, tokenizer):
    assert batch.agent_name == ["echo_react"] * 6 + ["math_expression"] * 4
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for i in range(6):
        record = batch.records[i]
        assert record.user_turns >= 1 and record.tool_errors == 0
        # a last round of calls whose results do not fit ends the sample with "length"
        extra_round = int(record.stop_reason == "length")
        assert record.tool_calls - record.user_turns in (0, extra_round)
        assert batch.num_turns[i] == 1 + record.assistant_turns + record.user_turns
        assert record.stop_reason in ("max_assistant_turns", "length")
        n = int(batch.attention_mask[i, PROMPT_LEN:].sum())
        ids, mask = batch.responses[i, :n].tolist(), batch.response_mask[i, :n].tolist()
        prefix = f"r{batch.rows[i]['index']}:echo("
        for span in mask_spans(ids, mask, 0):
            text = tokenizer.decode(span, skip_special_tokens=False)
            if text == "<|im_end|>":  # the end-of-turn a cut turn was closed with
                continue
            assert text.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n" + prefix)
            # the generation prompt, with the empty reasoning block of enable_thinking=False
            assert text.endswith(
                " chars)\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
                "<think>\n\n</think>\n\n"
            )
        for span in mask_spans(ids, mask, 1):
            assert 1 <= len(span) <= TURN and eot not in span


def test_the_recipe_loop_runs_in_ray_workers_with_its_langchain_tool(batch, tokenizer):
    for i in range(6, 10):
        prompt = tokenizer.decode(batch.prompts[i][batch.attention_mask[i, :PROMPT_LEN].bool()])
        assert '"name": "custom_op"' in prompt and "Compute " in prompt
        assert batch.records[i].assistant_turns >= 1
        assert batch.response_mask[i].sum() >= 1


def test_engine_log_probs_match_a_transformers_forward(batch, tiny_qwen3_path):
    worst = max_logprob_gap(batch, tiny_qwen3_path, PROMPT_LEN)
    assert worst < 1e-3, f"max |engine - transformers| log-prob gap {worst:.4f}"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@pytest.mark.asyncio(loop_scope="module")
async def test_a_chat_openai_react_graph_runs_a_tool_round_trip_over_http(server):
    base_url = ray.get(server.address.remote())
    llm = ChatOpenAI(
        base_url=f"{base_url}/v1",
        api_key="unused",
        model="tiny-qwen3",
        temperature=0,
        max_tokens=64,
        max_retries=0,
    ).bind_tools([add])
    # The random tiny model is steered by the server's structured outputs: first a Hermes
    # tool call (parsed by the server into tool_calls), then a final answer.
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    steer = {
        "call": llm.bind(extra_body={"structured_outputs": {"regex": re.escape(call)}}),
        "answer": llm.bind(extra_body={"structured_outputs": {"regex": "The sum is 5\\."}}),
    }
    model = RunnableLambda(
        lambda messages: steer["answer" if isinstance(messages[-1], ToolMessage) else "call"]
    )
    graph = build_react_graph(model, ToolNode([add]), tools_condition)
    final = await graph.ainvoke({"messages": [HumanMessage("What is 2 + 3?")]})
    human, first, reply, answer = final["messages"]
    assert isinstance(first, AIMessage) and first.response_metadata["finish_reason"] == "tool_calls"
    assert [(c["name"], c["args"]) for c in first.tool_calls] == [("add", {"a": 2, "b": 3})]
    assert isinstance(reply, ToolMessage) and reply.content == "5"
    assert reply.tool_call_id == first.tool_calls[0]["id"]
    assert isinstance(answer, AIMessage) and answer.content == "The sum is 5."
    assert answer.usage_metadata["input_tokens"] > first.usage_metadata["input_tokens"]
    assert json.loads(json.dumps(answer.response_metadata))["finish_reason"] == "stop"
