"""Context compaction in ``tool_agent`` (``multi_turn.max_context_tokens``) on scripted turns
with the real tokenizer and chat template: off is today's trajectory; on, a turn that would
push the next call past the budget drops older tool outputs, the full segment closes with its
tokens as sampled and the sample goes on in a segment whose prompt is the fresh render of the
compacted history; reasons, weights, the trace span, the step metrics, the stop of a history
that cannot be compacted enough, and bad config values."""

from __future__ import annotations

import json

import mlflow
import pytest

from agentloop import AgentLoopContext, MultiTurnConfig, RolloutConfig, TraceContext, encode_delta
from agentloop.batch import rollout_metrics
from agentloop.config import AgentConfig, CompactionConfig, GatewayConfig, TraceConfig, from_dict
from agentloop.tool_agent import ToolAgentLoop
from agentloop.tools import BaseTool, ToolResult
from agentloop.worker import AgentLoopWorker
from tests.unit.agentloop.scripted import ScriptedServer

PROMPT = [{"role": "user", "content": "Read the pages and say done."}]
SAMPLING = {"temperature": 1.0}
PLACEHOLDER = "[tool output dropped to fit the context]"


class PageTool(BaseTool):
    """A long tool output: page ``n``, 60 words."""

    schema = {
        "type": "function",
        "function": {
            "name": "page",
            "description": "Read page n.",
            "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}},
        },
    }

    async def execute(self, instance_id, arguments):
        n = arguments["n"]
        return ToolResult(f"page {n}: " + " ".join(f"w{n}x{i}" for i in range(60)))


def call(n: int) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'page', 'arguments': {'n': n}})}\n</tool_call>"


TURNS = [f"Reading page {n}.\n{call(n)}" for n in (1, 2, 3)] + ["done"]


def make_loop(tokenizer, turns=TURNS, *, gateway=None, **multi_turn):
    server = ScriptedServer(tokenizer, turns)
    config = RolloutConfig(
        prompt_length=2048,
        response_length=2048,
        multi_turn=MultiTurnConfig(max_tool_response_length=4000, **multi_turn),
        gateway=gateway or GatewayConfig(),
    )
    return ToolAgentLoop(AgentLoopContext(server, tokenizer, config, {"page": PageTool()})), server


def render(tokenizer, messages) -> list[int]:
    return tokenizer.apply_chat_template(
        messages,
        tools=[PageTool.schema],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )


async def page_text(n: int) -> str:
    return (await PageTool().execute("i", {"n": n})).text


async def history(tokenizer, upto: int) -> list[dict]:
    """The uncompacted conversation after ``upto`` tool turns."""
    messages = list(PROMPT)
    for n in range(1, upto + 1):
        messages += [
            {"role": "assistant", "content": TURNS[n - 1]},
            {"role": "tool", "content": await page_text(n)},
        ]
    return messages


def delta(tokenizer, before, new) -> list[int]:
    return encode_delta(tokenizer, before, new, [PageTool.schema])


async def test_off_is_todays_trajectory_and_a_budget_never_reached_changes_nothing(tokenizer):
    off, off_server = make_loop(tokenizer)
    out = await off.run(SAMPLING, raw_prompt=PROMPT)
    on, _ = make_loop(tokenizer, max_context_tokens=100_000, max_tokens_per_turn=64)
    same = await on.run(SAMPLING, raw_prompt=PROMPT)

    # off: one trajectory, prompt + sampled turns + tool deltas, as before compaction existed
    msgs = await history(tokenizer, 3)
    expected = off_server.sampled[0]
    for n in (1, 2, 3):
        expected = expected + delta(tokenizer, msgs[: 2 * n], [msgs[2 * n]])
        expected = expected + off_server.sampled[n]
    assert out.prompt_ids == render(tokenizer, PROMPT)
    assert out.response_ids == expected
    assert out.segments == [] and "compactions" not in out.metrics
    assert (out.record.segment, out.record.branch_reason, out.record.weight) == (0, None, 1.0)
    assert out.record.stop_reason == "no_tool_call" and out.record.session_id is None
    # on but never full: the same sample, only the (zero) compaction count added
    assert (same.prompt_ids, same.response_ids, same.response_mask) == (
        out.prompt_ids,
        out.response_ids,
        out.response_mask,
    )
    assert same.response_log_probs == out.response_log_probs
    assert same.segments == [] and same.metrics["compactions"] == 0.0
    assert same.record.stop_reason == "no_tool_call"


async def budget_for_two_pages(tokenizer, reserve: int) -> int:
    """A context budget that holds the prompt, two model turns and one page, but not two."""
    msgs = await history(tokenizer, 2)
    prompt = render(tokenizer, PROMPT)
    sampled = [tokenizer.encode(t, add_special_tokens=False) + [0] for t in TURNS[:2]]
    one = len(prompt) + len(sampled[0]) + len(delta(tokenizer, msgs[:2], [msgs[2]]))
    two = one + len(sampled[1]) + len(delta(tokenizer, msgs[:4], [msgs[4]]))
    assert one + reserve < two  # the second page does not fit
    return two + reserve - 1


async def test_a_full_context_drops_older_tool_outputs_and_goes_on_in_a_new_segment(tokenizer):
    reserve = 32
    budget = await budget_for_two_pages(tokenizer, reserve)
    loop, server = make_loop(tokenizer, max_context_tokens=budget, max_tokens_per_turn=reserve)
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    samples = [out, *out.segments]
    msgs = await history(tokenizer, 3)

    # segment 0: page 1 appended, the second page would not fit: it closes after turn 2
    d1 = delta(tokenizer, msgs[:2], [msgs[2]])
    s = server.sampled
    assert out.prompt_ids == render(tokenizer, PROMPT)
    assert out.response_ids == s[0] + d1 + s[1]
    assert out.response_mask == [1] * len(s[0]) + [0] * len(d1) + [1] * len(s[1])
    expected_logp = [-0.01 * (i + 1) for i in range(len(s[0]))] + [0.0] * len(d1)
    expected_logp += [-0.01 * (i + 1) for i in range(len(s[1]))]
    assert out.response_log_probs == pytest.approx(expected_logp)
    # segment 1: the fresh render of the history with page 1 dropped, page 2 kept (keep=1)
    compacted = list(msgs[:5])
    compacted[2] = {"role": "tool", "content": PLACEHOLDER}
    first = out.segments[0]
    assert first.prompt_ids == render(tokenizer, compacted)
    assert server.requests[2]["prompt_ids"] == first.prompt_ids
    # ...whose own turn 3 then does not fit with page 3 either: page 2 is dropped in turn
    d2 = delta(tokenizer, msgs[:4], [msgs[4]])
    assert first.response_ids == s[2] and first.response_mask == [1] * len(s[2])
    compacted2 = list(msgs)
    compacted2[2] = compacted2[4] = {"role": "tool", "content": PLACEHOLDER}
    last = out.segments[1]
    assert last.prompt_ids == render(tokenizer, compacted2)
    assert last.response_ids == s[3]
    # every call fits the budget with its turn's room
    for request in server.requests:
        assert len(request["prompt_ids"]) + request["max_tokens"] <= budget
        assert request["max_tokens"] <= reserve

    before = len(out.prompt_ids) + len(out.response_ids) + len(d2)
    reasons = [r.record.branch_reason for r in samples]
    assert reasons == [
        None,
        f"compaction: 1 tool output dropped, {before:,} -> {len(first.prompt_ids):,} tokens",
        reasons[2],
    ]
    before2 = len(first.prompt_ids) + len(first.response_ids)
    before2 += len(delta(tokenizer, [*compacted, msgs[5]], [msgs[6]]))
    assert reasons[2] == (
        f"compaction: 1 tool output dropped, {before2:,} -> {len(last.prompt_ids):,} tokens"
    )
    records = [o.record for o in samples]
    assert [r.segment for r in records] == [0, 1, 2]
    assert [r.branch_point for r in records] == [None, 2, 4]
    assert [r.weight for r in records] == pytest.approx([1 / 3] * 3)
    assert {r.session_id for r in records} == {server.requests[0]["session_id"]}
    assert [r.stop_reason for r in records] == ["compacted", "compacted", "no_tool_call"]
    assert [r.assistant_turns for r in records] == [2, 1, 1]
    assert [r.user_turns for r in records] == [1, 0, 0]
    assert [r.tool_calls for r in records] == [2, 1, 0]
    assert [[c.turn for c in r.calls] for r in records] == [[0, 1], [0], []]
    assert [r.turn_ends for r in records] == [
        [len(s[0]) - 1, len(out.response_ids) - 1],
        [len(s[2]) - 1],
        [len(s[3]) - 1],
    ]
    assert [o.num_turns for o in samples] == [1 + 2 + 1, 1 + 4 + 1, 1 + 6 + 1]
    assert out.metrics["compactions"] == 2.0
    metrics = rollout_metrics([out], 1.0)
    assert metrics["agent_loop/compactions"] == 2.0
    assert metrics["agent_loop/compacted_sessions/frac"] == 1.0
    assert metrics["agent_loop/context_full"] == 0.0
    assert metrics["agent_loop/samples"] == 3.0


async def test_segment_weight_segment_weighs_each_segment_one(tokenizer):
    reserve = 32
    budget = await budget_for_two_pages(tokenizer, reserve)
    loop, _ = make_loop(
        tokenizer,
        gateway=GatewayConfig(segment_weight="segment"),
        max_context_tokens=budget,
        max_tokens_per_turn=reserve,
    )
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    assert [o.record.weight for o in (out, *out.segments)] == [1.0, 1.0, 1.0]


async def test_keep_zero_drops_every_tool_output(tokenizer):
    reserve = 32
    budget = await budget_for_two_pages(tokenizer, reserve)
    loop, _ = make_loop(
        tokenizer,
        max_context_tokens=budget,
        max_tokens_per_turn=reserve,
        compaction=CompactionConfig(keep=0, placeholder="[gone]"),
    )
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    msgs = await history(tokenizer, 2)
    compacted = [m if m["role"] != "tool" else {"role": "tool", "content": "[gone]"} for m in msgs]
    assert out.segments[0].prompt_ids == render(tokenizer, compacted)
    assert out.segments[0].record.branch_reason.startswith("compaction: 2 tool outputs dropped, ")
    assert len(out.segments) == 1  # with both pages gone, the third fits


async def test_a_history_that_cannot_be_compacted_enough_stops_context_full(tokenizer):
    # keep=1 and one page over the budget: nothing older to drop
    msgs = await history(tokenizer, 1)
    prompt = render(tokenizer, PROMPT)
    sampled = len(tokenizer.encode(TURNS[0], add_special_tokens=False)) + 1
    pending = len(prompt) + sampled + len(delta(tokenizer, msgs[:2], [msgs[2]]))
    loop, server = make_loop(tokenizer, max_context_tokens=pending, max_tokens_per_turn=64)
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    assert out.segments == [] and len(server.requests) == 1
    assert out.record.stop_reason == "context_full"
    assert out.response_ids == server.sampled[0]
    assert out.extra["context_full"] == (
        f"the history ({pending} tokens with the last turn) has no tool output left to drop "
        f"(multi_turn.compaction.keep=1) and does not fit multi_turn.max_context_tokens={pending}"
    )
    assert out.metrics["compactions"] == 0.0
    assert rollout_metrics([out], 1.0)["agent_loop/context_full"] == 1.0


async def test_a_compacted_prompt_still_over_the_budget_stops_context_full(tokenizer):
    # keep=0 drops page 1, but the prompt with the model's turn and the placeholder still
    # leaves less than a turn's room
    msgs = [*PROMPT, {"role": "assistant", "content": TURNS[0]}]
    compacted = render(tokenizer, [*msgs, {"role": "tool", "content": PLACEHOLDER}])
    budget = len(compacted) + 64 - 1
    loop, server = make_loop(
        tokenizer,
        TURNS[:1],
        max_context_tokens=budget,
        max_tokens_per_turn=64,
        compaction=CompactionConfig(keep=0),
    )
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    assert out.record.stop_reason == "context_full" and out.segments == []
    assert out.extra["context_full"] == (
        f"after compaction, a prompt of {len(compacted)} tokens + "
        f"multi_turn.max_tokens_per_turn=64 does not fit the context limit {budget} "
        f"(multi_turn.max_context_tokens={budget})"
    )
    assert len(server.requests) == 1


async def test_a_prompt_over_the_budget_stops_before_any_call(tokenizer):
    prompt = render(tokenizer, PROMPT)
    loop, server = make_loop(tokenizer, max_context_tokens=len(prompt) + 3, max_tokens_per_turn=4)
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    assert server.requests == [] and out.response_ids == []
    assert out.record.stop_reason == "context_full"
    assert out.extra["context_full"] == (
        f"a prompt of {len(prompt)} tokens + multi_turn.max_tokens_per_turn=4 does not fit the "
        f"context limit {len(prompt) + 3} (multi_turn.max_context_tokens={len(prompt) + 3})"
    )


async def test_each_compaction_is_a_span_of_the_sample_trace(tokenizer, tmp_path):
    reserve = 32
    budget = await budget_for_two_pages(tokenizer, reserve)
    previous = mlflow.get_tracking_uri()
    store = f"sqlite:///{tmp_path / 'mlruns.db'}"
    try:
        config = RolloutConfig(
            prompt_length=2048,
            response_length=2048,
            multi_turn=MultiTurnConfig(
                max_tool_response_length=4000,
                max_context_tokens=budget,
                max_tokens_per_turn=reserve,
            ),
            trace=TraceConfig(backend="mlflow", tracking_uri=store, experiment_name="compaction"),
            agent=AgentConfig(default_agent_loop="tool_agent"),
        )
        worker = AgentLoopWorker(
            config, ScriptedServer(tokenizer, TURNS), tokenizer, tools={"page": PageTool()}
        )
        (out,) = await worker.generate_sequences(
            [{"raw_prompt": PROMPT}], None, TraceContext(step=1)
        )
        worker.tracer.flush()
        spans = [s for s in mlflow.get_trace(out.record.trace_id).data.spans]
    finally:
        mlflow.set_tracking_uri(previous)
    compactions = [s for s in spans if s.name == "compaction"]
    assert [s.span_type for s in compactions] == ["MEMORY", "MEMORY"]
    samples = [out, *out.segments]
    for i, span in enumerate(compactions, start=1):
        seg = samples[i]
        assert span.attributes["segment"] == str(i)
        assert span.attributes["mode"] == "drop_tool_outputs"
        assert span.attributes["dropped"] == "1"
        assert span.attributes["after_tokens"] == str(len(seg.prompt_ids))
        assert span.outputs == {"tokens": len(seg.prompt_ids), "reason": seg.record.branch_reason}
        assert span.inputs["tokens"] == int(span.attributes["before_tokens"])
    assert [o.record.trace_id for o in samples[:1]] == [out.record.trace_id]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"max_context_tokens": 0, "max_tokens_per_turn": 8},
            "multi_turn.max_context_tokens must be >= 1 or null, got 0",
        ),
        (
            {"max_context_tokens": 512},
            "multi_turn.max_context_tokens needs multi_turn.max_tokens_per_turn: the room the "
            "next model turn is given (the history is compacted when the context plus it would "
            "pass max_context_tokens)",
        ),
        (
            {"max_context_tokens": 512, "max_tokens_per_turn": 512},
            "multi_turn.max_tokens_per_turn=512 must be < multi_turn.max_context_tokens=512",
        ),
    ],
)
def test_bad_context_budgets_are_refused_naming_the_key(kwargs, message):
    with pytest.raises(ValueError) as info:
        MultiTurnConfig(**kwargs)
    assert str(info.value) == message


def test_bad_compaction_settings_are_refused_naming_the_key():
    with pytest.raises(ValueError) as info:
        CompactionConfig(mode="summarise")  # type: ignore[arg-type]
    assert str(info.value) == (
        "multi_turn.compaction.mode must be one of drop_tool_outputs, summarize, got 'summarise'"
    )
    with pytest.raises(ValueError) as info:
        CompactionConfig(keep=-1)
    assert str(info.value) == "multi_turn.compaction.keep must be an int >= 0, got -1"
    # from a config dict (the CLI's path), the full key is named
    with pytest.raises(ValueError) as info:
        from_dict(MultiTurnConfig, {"compaction": {"mode": "summarise"}}, path="rollout.multi_turn")
    assert str(info.value) == (
        "rollout.multi_turn.compaction.mode must be one of 'drop_tool_outputs', 'summarize', "
        "got 'summarise'"
    )


async def test_a_users_turn_that_does_not_fit_compacts_too(tokenizer):
    from tests.unit.agentloop import verl_api_interactions as verl_api

    verl_api.Gsm8kInteraction.calls = []
    user = verl_api.Gsm8kInteraction({"name": "gsm8k"})
    turns = [TURNS[0], "#### 4", "#### 5"]
    prompt = [{"role": "system", "content": "Answer as #### <n>."}, *PROMPT]
    msgs = [*prompt, {"role": "assistant", "content": TURNS[0]}]
    msgs.append({"role": "tool", "content": await page_text(1)})
    msgs.append({"role": "assistant", "content": turns[1]})
    reply = {"role": "user", "content": "Your response is incorrect! Try again."}
    sampled = [len(tokenizer.encode(t, add_special_tokens=False)) + 1 for t in turns[:2]]
    context = (
        len(render(tokenizer, prompt)) + sum(sampled) + len(delta(tokenizer, msgs[:3], [msgs[3]]))
    )
    budget = context + len(delta(tokenizer, msgs, [reply])) + 32 - 1  # the reply does not fit
    server = ScriptedServer(tokenizer, turns)
    config = RolloutConfig(
        prompt_length=2048,
        response_length=2048,
        multi_turn=MultiTurnConfig(
            max_tool_response_length=4000,
            max_context_tokens=budget,
            max_tokens_per_turn=32,
            compaction=CompactionConfig(keep=0),
        ),
    )
    context = AgentLoopContext(
        server, tokenizer, config, {"page": PageTool()}, interactions={"gsm8k": user}
    )
    row = {"extra_info": {"interaction_kwargs": {"name": "gsm8k", "ground_truth": "5"}}}
    out = await ToolAgentLoop(context).run(SAMPLING, raw_prompt=prompt, **row)

    assert len(out.segments) == 1
    last = out.segments[0]
    compacted = [*msgs, reply]
    compacted[3] = {"role": "tool", "content": PLACEHOLDER}
    assert last.prompt_ids == render(tokenizer, compacted)
    assert last.response_ids == server.sampled[2]
    assert out.response_ids[-len(server.sampled[1]) :] == server.sampled[1]
    assert [o.record.stop_reason for o in (out, last)] == ["compacted", "interaction_done"]
    assert [o.record.user_turns for o in (out, last)] == [1, 0]
    assert out.record.turn_scores == [] and last.record.turn_scores == [1.0]
    assert out.record.interaction is None and last.record.interaction.final_score == 1.0
    assert last.record.branch_point == 3
