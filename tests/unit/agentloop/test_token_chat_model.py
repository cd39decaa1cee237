"""AgentLoopChatModel driven by hand against a scripted generate client: the trajectory in
response_metadata, deltas for tool and human messages, sampling overrides, and the exact
errors for what it cannot do."""

from __future__ import annotations

import json

import pytest
from langchain_core.messages import HumanMessage, ToolMessage

from agentloop import AgentLoopContext, MultiTurnConfig, RolloutConfig, encode_delta
from agentloop.langgraph import (
    AgentLoopChatModel,
    ReactAgentLoop,
    TrajectoryLimitError,
    from_chat_dicts,
    trajectory_of,
)
from tests.unit.agentloop.scripted import CALC_SCHEMA, ScriptedServer

PROMPT = [{"role": "user", "content": "What is 1 + 2?"}]
CALL = '<tool_call>\n{"name": "calc", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


def make_model(tokenizer, turns, *, response_length=512, **multi_turn):
    server = ScriptedServer(tokenizer, turns)
    config = RolloutConfig(
        prompt_length=1024,
        response_length=response_length,
        multi_turn=MultiTurnConfig(**multi_turn),
    )
    loop = ReactAgentLoop(AgentLoopContext(server, tokenizer, config, {}))
    return AgentLoopChatModel.for_loop(loop, {"temperature": 1.0}), server


async def test_turns_carry_the_exact_trajectory_and_append_only_deltas(tokenizer):
    model, server = make_model(tokenizer, [f"Adding.\n{CALL}", "It is 3.", "Yes."])
    bound = model.bind_tools([CALC_SCHEMA])
    messages = from_chat_dicts(PROMPT)
    first = await bound.ainvoke(messages)
    assert first.content == "Adding."
    assert [(c["name"], c["args"]) for c in first.tool_calls] == [("calc", {"a": 1, "b": 2})]
    assert first.response_metadata["finish_reason"] == "tool_calls"
    state = trajectory_of(first)
    prompt = tokenizer.apply_chat_template(
        PROMPT, tools=[CALC_SCHEMA], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert state["prompt_ids"] == prompt
    assert state["response_ids"] == server.sampled[0]
    assert state["response_mask"] == [1] * len(server.sampled[0])
    assert state["response_log_probs"] == pytest.approx(
        [-0.01 * (i + 1) for i in range(len(server.sampled[0]))]
    )
    assert first.usage_metadata["output_tokens"] == len(server.sampled[0])

    tool_reply = ToolMessage("3", tool_call_id=first.tool_calls[0]["id"])
    messages = [*messages, first, tool_reply]
    second = await bound.ainvoke(messages)
    state2 = trajectory_of(second)
    history = [*PROMPT, {"role": "assistant", "content": f"Adding.\n{CALL}"}]
    delta = encode_delta(tokenizer, history, [{"role": "tool", "content": "3"}], [CALC_SCHEMA])
    assert state2["response_ids"] == server.sampled[0] + delta + server.sampled[1]
    assert state2["response_mask"] == (
        [1] * len(server.sampled[0]) + [0] * len(delta) + [1] * len(server.sampled[1])
    )
    assert server.requests[1]["prompt_ids"] == prompt + server.sampled[0] + delta
    assert second.tool_calls == [] and second.content == "It is 3."
    assert (state2["assistant_turns"], state2["user_turns"]) == (2, 1)

    # a human turn is a delta too (mask 0), ending with the generation prompt
    messages = [*messages, second, HumanMessage("Sure?")]
    third = await bound.ainvoke(messages)
    state3 = trajectory_of(third)
    human = encode_delta(
        tokenizer,
        [*history, {"role": "tool", "content": "3"}, {"role": "assistant", "content": "It is 3."}],
        [{"role": "user", "content": "Sure?"}],
        [CALC_SCHEMA],
    )
    assert state3["response_ids"] == state2["response_ids"] + human + server.sampled[2]
    assert tokenizer.decode(human).endswith("<|im_start|>assistant\n")
    assert len({r["session_id"] for r in server.requests}) == 1


async def test_bound_sampling_keys_override_the_rollout_params(tokenizer):
    model, server = make_model(tokenizer, ["hi"])
    await model.bind(temperature=0.0, top_k=5).ainvoke(from_chat_dicts(PROMPT))
    assert server.requests[0]["temperature"] == 0.0 and server.requests[0]["top_k"] == 5


async def test_a_cut_turn_cannot_be_continued(tokenizer):
    model, _ = make_model(tokenizer, ["word " * 50], response_length=8)
    first = await model.ainvoke(from_chat_dicts(PROMPT))
    assert first.response_metadata["finish_reason"] == "length"
    assert len(trajectory_of(first)["response_ids"]) == 8
    with pytest.raises(TrajectoryLimitError) as info:
        await model.ainvoke([*from_chat_dicts(PROMPT), first, HumanMessage("go on")])
    assert info.value.reason == "length"
    assert str(info.value) == (
        "the last model turn ended with 'length', not its end-of-turn token; no message can "
        "be appended after it"
    )


async def test_a_delta_that_does_not_fit_raises_the_length_limit(tokenizer):
    model, server = make_model(tokenizer, ["ok"], response_length=12)
    first = await model.ainvoke(from_chat_dicts(PROMPT))
    used = len(server.sampled[0])
    with pytest.raises(TrajectoryLimitError) as info:
        await model.ainvoke([*from_chat_dicts(PROMPT), first, HumanMessage("more " * 20)])
    assert info.value.reason == "length"
    assert f"({12 - used} of rollout.response_length=12 tokens left)" in str(info.value)
    assert model.last_trajectory == trajectory_of(first)


async def test_turn_limits_raise_with_the_config_key(tokenizer):
    model, _ = make_model(tokenizer, ["a", "b"], max_assistant_turns=1)
    first = await model.ainvoke(from_chat_dicts(PROMPT))
    with pytest.raises(TrajectoryLimitError) as info:
        await model.ainvoke([*from_chat_dicts(PROMPT), first, HumanMessage("again")])
    assert info.value.reason == "max_assistant_turns"
    assert str(info.value) == "multi_turn.max_assistant_turns=1 reached: no more turns"


async def test_changed_history_before_the_last_turn_is_a_clear_error(tokenizer):
    model, _ = make_model(tokenizer, ["a", "b"])
    prompt = from_chat_dicts([{"role": "system", "content": "Be brief."}, *PROMPT])
    first = await model.ainvoke(prompt)
    with pytest.raises(ValueError) as info:
        await model.ainvoke([prompt[1], first, HumanMessage("next")])
    assert str(info.value) == (
        "the model turn at message 1 was sampled after 2 messages but now follows 1: the graph "
        "changed the messages before the last model turn; a token trajectory can only grow by "
        "appending messages"
    )


async def test_unsupported_requests_fail_with_what_to_use(tokenizer):
    model, _ = make_model(tokenizer, ["a"])
    with pytest.raises(ValueError) as info:
        model.bind_tools([CALC_SCHEMA], tool_choice="required")
    assert str(info.value) == (
        "tool_choice='required' is not supported: the token chat model samples freely and "
        "cannot force a call; use 'auto' (default) or 'none'"
    )
    with pytest.raises(ValueError, match="^stop sequences are not supported"):
        await model.ainvoke(from_chat_dicts(PROMPT), stop=["\n"])
    with pytest.raises(NotImplementedError, match="async only"):
        model.invoke(from_chat_dicts(PROMPT))


async def test_tool_choice_none_leaves_calls_as_text(tokenizer):
    model, _ = make_model(tokenizer, [CALL])
    message = await model.bind_tools([CALC_SCHEMA], tool_choice="none").ainvoke(
        from_chat_dicts(PROMPT)
    )
    assert message.tool_calls == [] and json.loads(message.content.split("\n")[1])["name"]
