"""LangGraph agents on a real vLLM CPU engine (tiny-qwen3, the session's shared server):
``react_agent`` rows (and the langgraph_agent recipe's loop) through Ray AgentLoopWorkers with
exact trajectories and engine log-probs, and a ``ChatOpenAI`` ReAct graph against the
server's OpenAI-compatible endpoint (evaluation path). On the same server, a ``tool_agent``
sample past ``multi_turn.max_context_tokens`` is compacted into segments that are
token-exact (each segment's prompt the render of its compacted history, engine log-probs
equal to a transformers forward), with older outputs dropped or summarized by the policy."""

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

from agentloop import (
    AgentConfig,
    AgentLoopContext,
    AgentLoopManager,
    MultiTurnConfig,
    RolloutConfig,
    collate,
)
from agentloop.compaction import summary_text, with_user_text
from agentloop.config import CompactionConfig
from agentloop.langgraph import build_react_graph
from agentloop.parsers import ParsedTurn, ToolCall
from agentloop.tokens import mask_spans
from agentloop.tool_agent import ToolAgentLoop
from agentloop.tools import BaseTool, ToolResult
from recipes.langgraph_agent.data import make_rows
from servers import AsyncLLMServerManager
from tests.integration.agentloop.helpers import ECHO_SCHEMA, ClosesCutTurns, max_logprob_gap

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


# ---- context compaction on the real engine --------------------------------------------------
PAGE_SCHEMA = {
    "type": "function",
    "function": {
        "name": "page",
        "description": "Read the next page.",
        "parameters": {"type": "object", "properties": {}},
    },
}


def page(n: int) -> str:
    return f"page {n}: " + " ".join(f"w{i}" for i in range(30))


class PageTool(BaseTool):
    """A long tool output: page n of the sample's session (numbered by its calls)."""

    schema = PAGE_SCHEMA

    def __init__(self, config=None, tool_schema=None) -> None:
        super().__init__(config, tool_schema)
        self.calls = 0

    async def execute(self, instance_id, arguments):
        self.calls += 1
        return ToolResult(page(self.calls))


class EveryTurnReadsAPage:
    def parse(self, text: str) -> ParsedTurn:
        return ParsedTurn(content=text, items=[ToolCall("page", {}, raw=text)])


class PagingLoop(ClosesCutTurns, ToolAgentLoop):
    """tool_agent on the tiny model: every turn reads a page, cut turns closed."""

    def __init__(self, context, **kwargs) -> None:
        super().__init__(context, **kwargs)
        self.parser = EveryTurnReadsAPage()


ROW = {"raw_prompt": [{"role": "user", "content": "Read every page."}]}


async def paged_sample(server, tokenizer, *, response_len, budget, turns, **compaction):
    """One PagingLoop sample on the engine at a context ``budget`` (prompts up to 320 tokens,
    12 per turn): its output and its samples, segments included, which must number two or
    more, each but the last closed by a compaction, each within the budget."""
    config = RolloutConfig(
        prompt_length=320,
        response_length=response_len,
        multi_turn=MultiTurnConfig(
            max_assistant_turns=turns,
            max_tokens_per_turn=12,
            max_context_tokens=budget,
            max_tool_response_length=4000,
            compaction=CompactionConfig(**compaction),
        ),
        chat_template_kwargs={"enable_thinking": False},
    )
    context = AgentLoopContext(
        AsyncLLMServerManager([server]), tokenizer, config, {"page": PageTool()}
    )
    out = await PagingLoop(context).run(config.sampling_params(), **ROW)
    samples = [out, *out.segments]
    seen = [(o.record.stop_reason, len(o.prompt_ids), len(o.response_ids)) for o in samples]
    assert len(samples) >= 2 and out.metrics["compactions"] == len(samples) - 1, (seen, out.extra)
    assert [o.record.stop_reason for o in samples[:-1]] == ["compacted"] * (len(samples) - 1)
    assert [o.record.segment for o in samples] == list(range(len(samples)))
    assert [o.record.weight for o in samples] == pytest.approx([1 / len(samples)] * len(samples))
    for sample in samples:
        assert len(sample.prompt_ids) + len(sample.response_ids) <= budget
    return out, samples


def turn_text(tokenizer, text_ids: list[int]) -> str:
    """A sampled turn's text (without the end token, when the model closed the turn)."""
    ends = {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    if text_ids[-1] in ends:
        text_ids = text_ids[:-1]
    return tokenizer.decode(text_ids, skip_special_tokens=False)


def paged_render(tokenizer, messages) -> list[int]:
    return tokenizer.apply_chat_template(
        messages,
        tools=[PAGE_SCHEMA],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
        enable_thinking=False,
    )


def assert_engine_log_probs(out, samples, model_path, response_len) -> None:
    """Every sampled token of every segment has the log-prob a transformers forward
    (float32) over its whole trajectory gives it."""
    batch = collate(
        [out],
        [{**ROW, "uid": "c0", "agent_name": "tool_agent"}],
        prompt_length=320,
        response_length=response_len,
        pad_token_id=0,
    )
    assert len(batch) == len(samples)
    worst = max_logprob_gap(batch, model_path, 320)
    assert worst < 1e-3, f"max |engine - transformers| log-prob gap {worst:.4f}"


@pytest.mark.asyncio(loop_scope="module")
async def test_a_compacted_tool_agent_sample_is_token_exact_on_the_engine(
    server, tokenizer, tiny_qwen3_path
):
    out, samples = await paged_sample(server, tokenizer, response_len=192, budget=330, turns=6)
    # the history grows by a model turn and a placeholder per compaction: at this budget a
    # later one may not fit any more (context_full), or the turns run out first
    final = samples[-1].record.stop_reason
    assert final in ("max_assistant_turns", "no_tool_call", "context_full"), final

    # Rebuild the conversation from the sampled tokens: each segment's prompt is the render of
    # the history so far with every page but the newest replaced by the placeholder.
    placeholder = CompactionConfig().placeholder
    history = list(ROW["raw_prompt"])
    pages = 0
    for i, sample in enumerate(samples):
        if i:
            kept = [m for m in history if m["role"] == "tool" and m["content"] != placeholder]
            assert len(kept) == 1 and kept[0]["content"] == page(pages)  # keep=1: the newest
            expected = paged_render(tokenizer, history)
            assert sample.prompt_ids == expected
            assert sample.record.branch_reason.startswith("compaction: ")
            assert sample.record.branch_reason.endswith(f" -> {len(expected):,} tokens")
        for text_ids in mask_spans(sample.response_ids, sample.response_mask, 1):
            assert 1 <= len(text_ids) <= 12
            pages += 1
            history += [
                {"role": "assistant", "content": turn_text(tokenizer, text_ids)},
                {"role": "tool", "content": page(pages)},
            ]
        if i + 1 < len(samples):  # the compaction that opens the next segment
            history = [
                m
                if m["role"] != "tool" or m["content"] == page(pages)
                else {"role": "tool", "content": placeholder}
                for m in history
            ]
    assert_engine_log_probs(out, samples, tiny_qwen3_path, 192)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_summarized_tool_agent_sample_is_token_exact_on_the_engine(
    server, tokenizer, tiny_qwen3_path
):
    """``compaction.mode=summarize`` on the engine: each full segment ends with the policy's
    summary (engine log-probs equal to a transformers forward), and the next segment's prompt
    is the render of the row's prompt with that summary (and the last turn, when it was kept
    whole)."""
    compaction = {"mode": "summarize", "summary_tokens": 16, "summary_prompt": "Summarize."}
    out, samples = await paged_sample(
        server, tokenizer, response_len=256, budget=400, turns=7, **compaction
    )
    header = CompactionConfig().summary_header
    expected_prompt = list(ROW["raw_prompt"])
    pages = 0
    for i, sample in enumerate(samples):
        if i:
            assert sample.prompt_ids == paged_render(tokenizer, expected_prompt)
            assert sample.record.branch_reason.startswith("compaction: summarized by the policy")
        spans = list(mask_spans(sample.response_ids, sample.response_mask, 1))
        # a random model's summary may re-tokenize longer than sampled: a prompt made from it
        # that does not fit stops the sample with that summary as its last turn
        after = "after compaction" in sample.extra.get("context_full", "")
        full = i + 1 < len(samples) or after
        last_turn = ""
        for text_ids in spans[:-1] if full else spans:
            assert 1 <= len(text_ids) <= 12
            last_turn = turn_text(tokenizer, text_ids)
            pages += 1
        if full and not after:  # its last sampled span is the summary the next prompt carries
            assert 1 <= len(spans[-1]) <= 16
            summary = summary_text(turn_text(tokenizer, spans[-1]))
            expected_prompt = with_user_text(ROW["raw_prompt"], header + summary)
            if "the last turn kept whole" in samples[i + 1].record.branch_reason:
                expected_prompt += [
                    {"role": "assistant", "content": last_turn},
                    {"role": "tool", "content": page(pages)},
                ]
    assert_engine_log_probs(out, samples, tiny_qwen3_path, 256)
