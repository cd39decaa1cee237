"""tool_agent against a scripted generate function: exact trajectories, error tool messages
for every malformed-call kind, concurrency, turn limits and the response budget."""

from __future__ import annotations

import json

import pytest

from agentloop import AgentLoopContext, MultiTurnConfig, RolloutConfig, encode_delta
from agentloop.tokens import mask_spans
from agentloop.tool_agent import ToolAgentLoop
from servers import EngineConfig
from tests.unit.agentloop.scripted import BrokenTool, CalcTool, LongTool, ScriptedServer, SleepTool

PROMPT = [{"role": "user", "content": "What is 2 + 3?"}]
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "top_k": -1}


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def make_loop(
    tokenizer, turns, *, tools=None, response_length=512, max_model_len=None, **multi_turn
):
    server = ScriptedServer(tokenizer, turns)
    tools = tools if tools is not None else {"calc": CalcTool()}
    config = RolloutConfig(
        prompt_length=1024,
        response_length=response_length,
        engine=EngineConfig(max_model_len=max_model_len),
        multi_turn=MultiTurnConfig(**multi_turn),
    )
    return ToolAgentLoop(AgentLoopContext(server, tokenizer, config, tools)), server


def tool_texts(tokenizer, out) -> list[str]:
    """Contents of the <tool_response> blocks in the mask-0 part of the response."""
    ids = [t for t, m in zip(out.response_ids, out.response_mask, strict=True) if m == 0]
    text = tokenizer.decode(ids, skip_special_tokens=False)
    parts = text.split("<tool_response>\n")[1:]
    return [p.split("\n</tool_response>")[0] for p in parts]


async def test_trajectory_is_prompt_plus_sampled_turns_plus_tool_deltas(tokenizer):
    turns = [f"Let me add.\n{call('calc', a=2, b=3)}", "The answer is 5."]
    loop, server = make_loop(tokenizer, turns)
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)

    tools = [CalcTool.schema]
    prompt = tokenizer.apply_chat_template(
        PROMPT, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    history = [*PROMPT, {"role": "assistant", "content": turns[0]}]
    delta = encode_delta(tokenizer, history, [{"role": "tool", "content": "5"}], tools)
    assert out.prompt_ids == prompt
    assert out.response_ids == server.sampled[0] + delta + server.sampled[1]
    assert out.response_mask == [1] * len(server.sampled[0]) + [0] * len(delta) + [1] * len(
        server.sampled[1]
    )
    # engine log-probs align with their tokens; 0 under mask 0
    expected_logp = [-0.01 * (i + 1) for i in range(len(server.sampled[0]))]
    expected_logp += [0.0] * len(delta)
    expected_logp += [-0.01 * (i + 1) for i in range(len(server.sampled[1]))]
    assert out.response_log_probs == pytest.approx(expected_logp)
    # decoding the mask-1 spans gives exactly the sampled text
    decoded = [
        tokenizer.decode(s, skip_special_tokens=False)
        for s in mask_spans(out.response_ids, out.response_mask, 1)
    ]
    assert decoded == [t + "<|im_end|>" for t in turns]
    # turn 2 was generated on exactly prompt + the response so far
    assert server.requests[1]["prompt_ids"] == prompt + server.sampled[0] + delta
    assert out.num_turns == 4
    assert out.record.stop_reason == "no_tool_call"
    assert out.record.tool_calls == 1 and out.record.tool_errors == 0
    assert out.record.tool_rewards == {"calc": 1.0}
    assert out.metrics["generate_s"] > 0
    # where per-turn rewards go: the last token of each model turn; calls know their turn
    first_end = len(server.sampled[0]) - 1
    assert out.record.turn_ends == [first_end, len(out.response_ids) - 1]
    assert [c.turn for c in out.record.calls] == [0]


async def test_every_turn_samples_with_the_configured_params(tokenizer):
    turns = [call("calc", a=1, b=1), call("calc", a=2, b=2), "done"]
    loop, server = make_loop(tokenizer, turns, response_length=300)
    await loop.run(SAMPLING, raw_prompt=PROMPT)
    assert len(server.requests) == 3
    for req in server.requests:
        assert (req["temperature"], req["top_p"], req["top_k"]) == (0.7, 0.9, -1)
    # max_tokens is the budget left, shrinking every turn
    budgets = [r["max_tokens"] for r in server.requests]
    assert budgets[0] == 300 and budgets[0] > budgets[1] > budgets[2]
    assert len({r["session_id"] for r in server.requests}) == 1  # sticky routing key


ERROR_CASES = [
    (
        '<tool_call>\n{"name": "calc", "arguments": {"a": 1 2}}\n</tool_call>',
        "bad_json",
        "Error: tool call 1 is not valid JSON (Expecting ',' delimiter at char 38); write "
        '{"name": <tool name>, "arguments": {...}} inside <tool_call></tool_call>',
    ),
    (
        '<tool_call>\n{"arguments": {"a": 1, "b": 2}}\n</tool_call>',
        "missing_name",
        'Error: tool call 1 has no "name"; write {"name": <tool name>, "arguments": {...}} '
        "inside <tool_call></tool_call>",
    ),
    (
        '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>',
        "unknown_tool",
        "Error: unknown tool 'nope'; available tools: calc",
    ),
    (
        '<tool_call>\n{"name": "calc", "arguments": [1, 2]}\n</tool_call>',
        "bad_arguments",
        "Error: arguments of tool call 1 (calc) must be a JSON object, got an array",
    ),
    (
        '<tool_call>\n{"name": "calc", "arguments": {"a": 1}}\n</tool_call>',
        "schema",
        "Error: arguments of 'calc' do not match its schema at arguments: 'b' is a required "
        "property",
    ),
    (
        '<tool_call>\n{"name": "calc", "arguments": {"a": 1, "b": "x"}}\n</tool_call>',
        "schema",
        "Error: arguments of 'calc' do not match its schema at b: 'x' is not of type 'integer'",
    ),
]


@pytest.mark.parametrize(("turn", "kind", "message"), ERROR_CASES, ids=[c[1] for c in ERROR_CASES])
async def test_malformed_call_becomes_error_message_and_rollout_continues(
    tokenizer, turn, kind, message
):
    loop, server = make_loop(tokenizer, [turn, "ok, final answer"])
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    assert tool_texts(tokenizer, out) == [message]
    assert out.record.tool_error_kinds == [kind]
    assert out.record.tool_calls == 0
    assert len(server.requests) == 2  # the model got a second turn
    assert out.record.stop_reason == "no_tool_call"


async def test_repaired_call_runs_and_is_marked(tokenizer):
    turn = "<tool_call>\n{'name': 'calc', 'arguments': {'a': 2, 'b': 3,}\n</tool_call>"
    loop, _ = make_loop(tokenizer, [turn, "5"])
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    assert tool_texts(tokenizer, out) == ["5"]
    assert out.record.calls[0].repaired is True


async def test_with_repair_off_a_repairable_call_is_the_error_the_served_model_would_get(
    tokenizer,
):
    turn = "<tool_call>\n{'name': 'calc', 'arguments': {'a': 2, 'b': 3,}\n</tool_call>"
    loop, server = make_loop(tokenizer, [turn, "5"], repair_tool_calls=False)
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    (message,) = tool_texts(tokenizer, out)
    assert message.startswith("Error: tool call 1 is not valid JSON (Expecting property name")
    assert out.record.tool_error_kinds == ["bad_json"] and out.record.calls == []
    assert len(server.requests) == 2


async def test_tool_exceptions_timeouts_and_non_text_become_error_messages(tokenizer):
    tools = {"broken": BrokenTool(), "sleep": SleepTool(), "calc": CalcTool()}
    turn = "\n".join(
        [call("broken"), call("sleep", s=5), call("broken", mode="bytes"), call("calc", a=1, b=0)]
    )
    loop, server = make_loop(
        tokenizer, [turn, "giving up"], tools=tools, max_parallel_calls=4, tool_timeout_s=0.3
    )
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    assert tool_texts(tokenizer, out) == [
        "Error: tool 'broken' failed: RuntimeError: disk on fire",
        "Error: tool 'sleep' timed out after 0.3 s",
        "Error: tool 'broken' failed: TypeError: returned text of type bytes, not str",
        "Error: b must not be 0",
    ]
    assert out.record.tool_error_kinds == [
        "tool_failed",
        "tool_timeout",
        "tool_failed",
        "tool_failed",
    ]
    assert len(server.requests) == 2


async def test_the_record_counts_attempted_succeeded_malformed_and_failed_calls(tokenizer):
    tools = {"broken": BrokenTool(), "calc": CalcTool()}
    turn = "\n".join(
        [
            call("calc", a=2, b=3),
            "<tool_call>\n{not json}\n</tool_call>",
            call("nope"),
            call("broken"),
        ]
    )
    loop, _ = make_loop(tokenizer, [turn, "done"], tools=tools, max_parallel_calls=4)
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    r = out.record
    assert (r.calls_attempted, r.tool_calls, r.calls_malformed, r.calls_failed) == (4, 1, 2, 1)
    assert r.assistant_turns == 2 and out.num_turns == 4  # messages: user, model, tools, model


async def test_calls_over_max_parallel_calls_get_an_error_and_the_rest_run_concurrently(tokenizer):
    tools = {"sleep": SleepTool()}
    turn = "\n".join([call("sleep", s=0.3), call("sleep", s=0.3), call("sleep", s=0.3)])
    loop, _ = make_loop(tokenizer, [turn, "done"], tools=tools, max_parallel_calls=2)
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    assert tool_texts(tokenizer, out) == [
        "slept",
        "slept",
        "Error: only 2 tool call(s) run per turn; call 'sleep' was skipped",
    ]
    assert out.metrics["tool_s"] < 0.55  # two 0.3 s calls overlapped


async def test_max_assistant_turns_stops_before_running_tools(tokenizer):
    turns = [call("calc", a=1, b=1)] * 5
    loop, server = make_loop(tokenizer, turns, max_assistant_turns=2)
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    assert len(server.requests) == 2
    assert out.record.stop_reason == "max_assistant_turns"
    assert out.record.assistant_turns == 2 and out.record.user_turns == 1
    assert out.response_mask[-1] == 1  # ends on the model's turn, no dangling delta


async def test_max_user_turns_stops_after_that_many_tool_turns(tokenizer):
    loop, server = make_loop(tokenizer, [call("calc", a=1, b=1)] * 5, max_user_turns=1)
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    assert out.record.stop_reason == "max_user_turns"
    assert out.record.user_turns == 1 and len(server.requests) == 2


@pytest.mark.parametrize("budget", [20, 40, 64, 90, 120])
async def test_response_never_exceeds_budget_and_never_ends_in_a_template_header(tokenizer, budget):
    turns = [f"step {i}\n{call('calc', a=i, b=1)}" for i in range(10)]
    loop, _ = make_loop(tokenizer, turns, response_length=budget)
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    assert len(out.response_ids) <= budget
    assert out.response_mask[-1] == 1  # the last segment is sampled, not a cut delta
    assert out.record.stop_reason == "length"


async def test_tool_response_is_truncated_on_the_configured_side(tokenizer):
    for side, expected in [
        ("right", "A" * 10 + "...(truncated)"),
        ("left", "(truncated)..." + "B" * 10),
        ("middle", "A" * 5 + "\n...(truncated)...\n" + "B" * 5),
    ]:
        loop, _ = make_loop(
            tokenizer,
            [call("long"), "ok"],
            tools={"long": LongTool()},
            max_tool_response_length=10,
            tool_response_truncate_side=side,
        )
        out = await loop.run(SAMPLING, raw_prompt=PROMPT)
        assert tool_texts(tokenizer, out) == [expected], side


async def test_create_kwargs_from_the_row_reach_the_tool_and_instances_are_released(tokenizer):
    calc = CalcTool()
    loop, _ = make_loop(tokenizer, [call("calc", a=2, b=3), "done"], tools={"calc": calc})
    out = await loop.run(
        SAMPLING, raw_prompt=PROMPT, tools_kwargs={"calc": {"create_kwargs": {"offset": 100}}}
    )
    assert tool_texts(tokenizer, out) == ["105"]
    (instance,) = calc.created
    assert calc.created[instance] == {"offset": 100}
    assert calc.released == [instance]


async def test_turn_cut_by_length_ends_the_rollout_without_a_delta(tokenizer):
    loop, _ = make_loop(tokenizer, ["x " * 200 + call("calc", a=1, b=1)], response_length=50)
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    assert out.record.stop_reason == "length"
    assert out.response_mask == [1] * 50


async def test_engine_context_limit_stops_the_rollout_before_the_response_budget(tokenizer):
    prompt_len = len(
        tokenizer.apply_chat_template(
            PROMPT,
            tools=[CalcTool.schema],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
    )
    turns = [call("calc", a=1, b=1)] * 5
    loop, server = make_loop(tokenizer, turns, response_length=500, max_model_len=prompt_len + 80)
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    assert len(out.prompt_ids) + len(out.response_ids) <= prompt_len + 80
    assert out.record.stop_reason == "length"
    assert all(len(r["prompt_ids"]) + r["max_tokens"] <= prompt_len + 80 for r in server.requests)


async def test_each_turn_is_sent_with_a_priority_that_ranks_stragglers_first(tokenizer):
    """Priority (lower runs first) drops by 1 s per turn done and by the time spent on tools,
    so the sample held back most goes first; a sample admitted later starts behind."""
    turns = [call("sleep", s=0.2), call("calc", a=1, b=2), "done"]
    tools = {"sleep": SleepTool(), "calc": CalcTool()}
    loop, server = make_loop(tokenizer, turns, tools=tools)
    await loop.run(SAMPLING, raw_prompt=PROMPT)
    assert len(server.priorities) == 3
    first, second, third = server.priorities
    assert first == loop.admitted_ms
    assert 1000 + 200 <= first - second < 1000 + 400  # one turn and the 0.2 s tool
    assert 1000 <= second - third < 1000 + 200  # one turn and a fast tool
    later, _ = make_loop(tokenizer, ["done"])
    assert later.priority() >= first  # admitted later, no turns yet: behind the first


class _ThreadOfRender:
    """The shared tokenizer, recording the thread each chat-template render runs on."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self.threads: list[int] = []

    def apply_chat_template(self, *args, **kwargs):
        import threading

        self.threads.append(threading.get_ident())
        return self._tokenizer.apply_chat_template(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


async def test_short_renders_run_on_the_loop_and_long_ones_in_a_thread(tokenizer):
    import threading

    from agentloop.base import INLINE_RENDER_CHARS

    recording = _ThreadOfRender(tokenizer)
    loop, _ = make_loop(recording, [])
    here = threading.get_ident()
    long = [{"role": "user", "content": "x" * (INLINE_RENDER_CHARS + 1)}]
    await loop.encode_prompt(PROMPT)
    await loop.encode_prompt(long)
    assert recording.threads[0] == here and recording.threads[1] != here  # one render each
    history = [*PROMPT, {"role": "assistant", "content": "Hi."}]
    recording.threads.clear()
    await loop.encode_delta(history, [{"role": "user", "content": "More."}], head=1)
    await loop.encode_delta(history, long, head=1)
    assert set(recording.threads[:2]) == {here}  # each delta renders twice
    assert len(recording.threads) == 4 and all(t != here for t in recording.threads[2:])
