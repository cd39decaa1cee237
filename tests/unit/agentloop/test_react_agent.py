"""react_agent (LangGraph) against a scripted generate client: the same trajectory as the
equivalent tool_agent episode, error messages in call order, LangChain tools with timeouts
and errors, turn limits, and the response budget ending the graph cleanly."""

from __future__ import annotations

import asyncio
import json

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from transformers import AutoTokenizer

from agentloop import AgentLoopContext, MultiTurnConfig, RolloutConfig, get_agent_loop
from agentloop.langgraph import ReactAgentLoop
from agentloop.tokens import mask_spans
from agentloop.tool_agent import ToolAgentLoop
from tests.unit.agentloop.scripted import CalcTool, ScriptedServer

PROMPT = [{"role": "user", "content": "What is (2 + 3) + 4?"}]
SAMPLING = {"temperature": 0.7, "top_p": 0.9}


@pytest.fixture(scope="module", params=["tiny_qwen3_path", "smollm2_path"])
def tokenizer(request):
    return AutoTokenizer.from_pretrained(request.getfixturevalue(request.param))


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def run_both(tokenizer, turns, *, loop_cls=ReactAgentLoop, tools=None, **config_kwargs):
    """The same scripted episode through tool_agent and through ``loop_cls``."""
    multi_turn = MultiTurnConfig(**config_kwargs.pop("multi_turn", {}))
    config = RolloutConfig(prompt_length=1024, response_length=512, multi_turn=multi_turn)
    for key, value in config_kwargs.items():
        setattr(config, key, value)
    outs, servers = [], []
    for cls in (ToolAgentLoop, loop_cls):
        server = ScriptedServer(tokenizer, turns)
        context = AgentLoopContext(server, tokenizer, config, tools or {"calc": CalcTool()})
        outs.append(asyncio.run(cls(context).run(dict(SAMPLING), raw_prompt=PROMPT)))
        servers.append(server)
    return outs, servers


def same_extra(a, b, keys):
    return {k: getattr(a.record, k) for k in keys} == {k: getattr(b.record, k) for k in keys}


TOOL_KEYS = ["stop_reason", "finish_reasons", "turn_ends", "assistant_turns", "user_turns"]
CALL_KEYS = ["tool_calls", "tool_errors", "tool_error_kinds", "tool_rewards"]


def test_two_tool_call_episode_matches_tool_agent_ids_mask_and_extra(tokenizer):
    turns = [
        f"First 2 + 3.\n{call('calc', a=2, b=3)}",
        f"Now 5 + 4.\n{call('calc', a=5, b=4)}",
        "The answer is 9.",
    ]
    (tool_out, react_out), (tool_srv, react_srv) = run_both(tokenizer, turns)
    assert react_out.prompt_ids == tool_out.prompt_ids
    assert react_out.response_ids == tool_out.response_ids
    assert react_out.response_mask == tool_out.response_mask
    assert react_out.response_log_probs == tool_out.response_log_probs
    assert react_out.num_turns == tool_out.num_turns == 6
    assert same_extra(react_out, tool_out, TOOL_KEYS + CALL_KEYS)
    assert react_out.record.stop_reason == "no_tool_call"
    strip = [
        {k: getattr(c, k) for k in ("name", "arguments", "ok", "reward", "turn")}
        for c in react_out.record.calls
    ]
    assert strip == [
        {"name": "calc", "arguments": {"a": 2, "b": 3}, "ok": True, "reward": 0.5, "turn": 0},
        {"name": "calc", "arguments": {"a": 5, "b": 4}, "ok": True, "reward": 0.5, "turn": 1},
    ]
    # every turn went to the engine on exactly the same context, with one request id
    assert [r["prompt_ids"] for r in react_srv.requests] == [
        r["prompt_ids"] for r in tool_srv.requests
    ]
    assert len({r["session_id"] for r in react_srv.requests}) == 1
    assert react_srv.requests[0]["temperature"] == 0.7
    assert react_out.metrics["tool_s"] > 0 and react_out.metrics["generate_s"] > 0


@pytest.mark.parametrize("loop_cls", [ToolAgentLoop, ReactAgentLoop])
def test_each_sample_opens_its_tools_under_the_one_new_request_id_of_its_turns(tokenizer, loop_cls):
    """Both loops start a sample with ``tool_session``: a new request id, used by every turn
    and by the tool instances, which get the row's ``create_kwargs``."""
    calc = CalcTool()
    config = RolloutConfig(prompt_length=1024, response_length=512)
    tools_kwargs = {"calc": {"create_kwargs": {"offset": 10}}}
    request_ids = []
    for _ in range(2):
        server = ScriptedServer(tokenizer, [call("calc", a=2, b=3), "It is 15."])
        loop = loop_cls(AgentLoopContext(server, tokenizer, config, {"calc": calc}))
        out = asyncio.run(loop.run(dict(SAMPLING), raw_prompt=PROMPT, tools_kwargs=tools_kwargs))
        assert out.record.tool_calls == 1
        (request_id,) = {r["session_id"] for r in server.requests}
        request_ids.append(request_id)
    assert request_ids[0] != request_ids[1]
    assert calc.created == {f"{rid}-calc": {"offset": 10} for rid in request_ids}
    assert calc.released == [f"{rid}-calc" for rid in request_ids]


def test_malformed_unknown_and_schema_failing_calls_answer_in_order_like_tool_agent(tokenizer):
    turns = [
        "\n".join(
            [
                call("calc", a=1, b=2),
                "<tool_call>\n{not json\n</tool_call>",
                call("search", q="x"),
                call("calc", a="one", b=2),
                call("calc", a=3, b=0),  # runs and raises ToolError
            ]
        ),
        "Done.",
    ]
    (tool_out, react_out), _ = run_both(tokenizer, turns, multi_turn={"max_parallel_calls": 8})
    assert react_out.response_ids == tool_out.response_ids
    assert react_out.response_mask == tool_out.response_mask
    assert same_extra(react_out, tool_out, TOOL_KEYS + ["tool_calls", "tool_errors"])
    assert sorted(react_out.record.tool_error_kinds) == sorted(
        ["bad_json", "unknown_tool", "schema", "tool_failed"]
    )


def test_tool_messages_answer_calls_by_id_with_error_status_for_failures(tokenizer):
    turns = [f"{call('calc', a=1, b=2)}\n{call('calc', a=3, b=0)}\n{call('nope')}", "ok"]
    server = ScriptedServer(tokenizer, turns)
    config = RolloutConfig(
        prompt_length=1024,
        response_length=512,
        multi_turn=MultiTurnConfig(max_parallel_calls=4),
    )
    loop = ReactAgentLoop(AgentLoopContext(server, tokenizer, config, {"calc": CalcTool()}))
    asyncio.run(loop.run(dict(SAMPLING), raw_prompt=PROMPT))
    ai, *replies = loop.messages[1:5]
    ids = [c["id"] for c in ai.tool_calls] + [c["id"] for c in ai.invalid_tool_calls]
    assert [m.tool_call_id for m in replies] == ids
    assert [m.status for m in replies] == ["success", "error", "error"]
    assert [m.content for m in replies] == [
        "3",
        "Error: b must not be 0",
        "Error: unknown tool 'nope'; available tools: calc",
    ]


def test_too_many_calls_per_turn_are_answered_with_errors_like_tool_agent(tokenizer):
    turns = ["\n".join(call("calc", a=i, b=1) for i in range(3)), "ok"]
    (tool_out, react_out), _ = run_both(tokenizer, turns, multi_turn={"max_parallel_calls": 2})
    assert react_out.response_ids == tool_out.response_ids
    assert react_out.record.tool_error_kinds == ["too_many_calls"]
    assert react_out.record.tool_calls == 2


def test_max_assistant_turns_ends_the_graph_without_running_the_last_calls(tokenizer):
    turns = [call("calc", a=1, b=1)] * 5
    (tool_out, react_out), (_, react_srv) = run_both(
        tokenizer, turns, multi_turn={"max_assistant_turns": 2}
    )
    assert react_out.response_ids == tool_out.response_ids
    assert react_out.record.stop_reason == "max_assistant_turns"
    assert react_out.record.assistant_turns == 2 and react_out.record.tool_calls == 1
    assert len(react_srv.requests) == 2


def test_a_delta_past_the_response_budget_ends_the_graph_with_the_trajectory_so_far(tokenizer):
    turns = [call("calc", a=1, b=1), "never sampled"]
    probe, _ = run_both(tokenizer, turns)
    first_turn = probe[0].response_mask.index(0)  # the first turn's sampled tokens
    for loop_out in run_both(tokenizer, turns, response_length=first_turn + 5)[0]:
        assert loop_out.record.stop_reason == "length"
        assert loop_out.response_mask == [1] * first_turn
        assert len(loop_out.response_ids) <= first_turn + 5


class WordTool:
    """LangChain tools for the loop below: one fine, one raising, one slow."""

    @staticmethod
    @tool
    def shout(text: str) -> str:
        """Upper-case a text."""
        return text.upper() * 40

    @staticmethod
    @tool
    def explode(text: str) -> str:
        """Always fails."""
        raise RuntimeError("kaboom")

    @staticmethod
    @tool
    async def dawdle(text: str) -> str:
        """Takes too long."""
        await asyncio.sleep(5)
        return "late"


class WordLoop(ReactAgentLoop):
    def langchain_tools(self):
        return [WordTool.shout, WordTool.explode, WordTool.dawdle]


def test_langchain_tools_errors_and_timeouts_become_tool_messages_and_the_graph_goes_on(
    tokenizer,
):
    turns = [
        "\n".join([call("shout", text="hi"), call("explode", text="x"), call("dawdle", text="y")]),
        "Finished.",
    ]
    config = RolloutConfig(
        prompt_length=1024,
        response_length=512,
        multi_turn=MultiTurnConfig(
            tool_timeout_s=0.3,
            max_tool_response_length=60,
            tool_response_truncate_side="right",
            max_parallel_calls=3,
        ),
    )
    server = ScriptedServer(tokenizer, turns)
    loop = WordLoop(AgentLoopContext(server, tokenizer, config, {}))
    out = asyncio.run(loop.run(dict(SAMPLING), raw_prompt=PROMPT))
    assert out.record.stop_reason == "no_tool_call"
    assert out.record.tool_calls == 1
    assert out.record.tool_error_kinds == ["tool_failed", "tool_timeout"]
    # ToolNode runs the calls at once: they are recorded as they finish (the sync tools run
    # in threads, so shout and explode may finish in either order); the messages are in
    # call order (the decoded text below).
    assert sorted(c.name for c in out.record.calls) == ["dawdle", "explode", "shout"]
    delta = [t for t, m in zip(out.response_ids, out.response_mask, strict=True) if m == 0]
    text = tokenizer.decode(delta, skip_special_tokens=False)
    assert "HI" * 30 + "...(truncated)\n</tool_response>" in text
    assert "Error: tool 'explode' failed: RuntimeError: kaboom" in text
    assert "Error: tool 'dawdle' timed out after 0.3 s" in text
    # the tools were shown to the model in the prompt
    prompt = tokenizer.decode(out.prompt_ids)
    assert '"shout"' in prompt and '"dawdle"' in prompt


def test_react_agent_is_registered_and_loaded_on_first_use():
    spec = get_agent_loop("react_agent")
    assert spec.cls is ReactAgentLoop


class DoubleCheckLoop(ReactAgentLoop):
    """A custom graph: after the model answers, a node asks it once to check its answer."""

    def build_graph(self, model, tools_node):
        async def agent(state):
            return {"messages": [await model.ainvoke(state["messages"])]}

        def check(state):
            return {"messages": [HumanMessage("Check your answer.")]}

        def route(state):
            if self.route(state) == "tools":
                return "tools"
            asked = sum(isinstance(m, HumanMessage) for m in state["messages"]) > 1
            return END if asked else "check"

        graph = StateGraph(MessagesState)
        graph.add_node("agent", agent)
        graph.add_node("tools", tools_node)
        graph.add_node("check", check)
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", route, ["tools", "check", END])
        graph.add_edge("tools", "agent")
        graph.add_edge("check", "agent")
        return graph.compile()


def test_a_custom_graph_appends_its_human_messages_as_masked_deltas(tokenizer):
    turns = [call("calc", a=1, b=2), "It is 3.", "Checked: 3."]
    config = RolloutConfig(prompt_length=1024, response_length=512)
    server = ScriptedServer(tokenizer, turns)
    loop = DoubleCheckLoop(AgentLoopContext(server, tokenizer, config, {"calc": CalcTool()}))
    out = asyncio.run(loop.run(dict(SAMPLING), raw_prompt=PROMPT))
    assert (out.record.assistant_turns, out.record.user_turns) == (3, 2)
    assert out.num_turns == 6 and out.record.stop_reason == "no_tool_call"
    spans = mask_spans(out.response_ids, out.response_mask, 0)
    assert "Check your answer." in tokenizer.decode(spans[1])
    sampled = mask_spans(out.response_ids, out.response_mask, 1)
    assert sampled == server.sampled
