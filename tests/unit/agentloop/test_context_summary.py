"""Compaction by a summary the policy writes (``multi_turn.compaction.mode=summarize``) on
scripted turns with the real tokenizer and chat template: the full segment ends with the
pending turn and the summary request (mask 0) and the policy's summary (mask 1, its engine
log-probs); the next segment's prompt is the row's prompt with the summary as user text; a last
turn too long to summarize with is hidden behind the placeholder and follows the summary whole;
every call leaves room for a summary; records, reasons, the trace span, and bad settings."""

from __future__ import annotations

import mlflow
import pytest

from agentloop import AgentLoopContext, MultiTurnConfig, RolloutConfig, TraceContext
from agentloop.compaction import summary_text, with_user_text
from agentloop.config import (
    SUMMARY_HEADER,
    SUMMARY_PROMPT,
    AgentConfig,
    CompactionConfig,
    TraceConfig,
)
from agentloop.tool_agent import ToolAgentLoop
from agentloop.worker import AgentLoopWorker
from tests.unit.agentloop.scripted import ScriptedServer
from tests.unit.agentloop.test_context_compaction import (
    PLACEHOLDER,
    PROMPT,
    SAMPLING,
    TURNS,
    PageTool,
    delta,
    history,
    page_text,
    render,
)
from tests.unit.agentloop.test_context_compaction import (
    call as call_text,
)

RESERVE, SUMMARY_TOKENS = 32, 48
SUMMARY = "<think>what to keep</think>Pages 1 and 2 read: w1 and w2 words."
SUMMARIZED = "Pages 1 and 2 read: w1 and w2 words."
# read page 1, read page 2, (the summary), read page 3, answer
SCRIPT = [TURNS[0], TURNS[1], SUMMARY, TURNS[2], TURNS[3]]


def summarize(**kwargs) -> CompactionConfig:
    return CompactionConfig(mode="summarize", summary_tokens=SUMMARY_TOKENS, **kwargs)


def config_of(budget: int, reserve: int = RESERVE, **config) -> RolloutConfig:
    return RolloutConfig(
        prompt_length=2048,
        response_length=2048,
        multi_turn=MultiTurnConfig(
            max_tool_response_length=4000,
            max_context_tokens=budget,
            max_tokens_per_turn=reserve,
            compaction=summarize(**config.pop("compaction", {})),
        ),
        **config,
    )


def make_loop(tokenizer, budget: int, turns=SCRIPT, reserve=RESERVE, **compaction):
    server = ScriptedServer(tokenizer, turns)
    config = config_of(budget, reserve, compaction=compaction)
    loop = ToolAgentLoop(AgentLoopContext(server, tokenizer, config, {"page": PageTool()}))
    return loop, server


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]


async def shapes(tokenizer):
    """The conversation up to page 2 and the lengths the budgets are built from."""
    msgs = await history(tokenizer, 2)
    prompt = render(tokenizer, PROMPT)
    d1 = delta(tokenizer, msgs[:2], [msgs[2]])
    first = len(prompt) + len(ids(tokenizer, TURNS[0])) + len(d1)  # through page 1
    second = first + len(ids(tokenizer, TURNS[1]))  # through the model's second turn
    request = delta(tokenizer, msgs[:4], with_user_text([msgs[4]], SUMMARY_PROMPT))
    hidden = [{"role": "tool", "content": PLACEHOLDER}]
    hidden_request = delta(tokenizer, msgs[:4], with_user_text(hidden, SUMMARY_PROMPT))
    return msgs, d1, first, second, request, hidden_request


async def test_the_policy_summarizes_a_full_history_and_the_sample_goes_on_from_it(tokenizer):
    msgs, d1, first, second, request, _ = await shapes(tokenizer)
    budget = second + len(request) + SUMMARY_TOKENS  # the summary fits with page 2 in it
    loop, server = make_loop(tokenizer, budget)
    assert first + RESERVE + loop.summary_room <= budget  # page 1: no compaction yet
    assert second + len(delta(tokenizer, msgs[:4], [msgs[4]])) + RESERVE + loop.summary_room > (
        budget
    )
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    samples = [out, *out.segments]
    s = server.sampled
    assert [len(x) for x in s] == [len(ids(tokenizer, t)) for t in SCRIPT]

    # segment 0: its turns, then page 2 and the request as one delta, then the summary sampled
    assert out.prompt_ids == render(tokenizer, PROMPT)
    assert out.response_ids == s[0] + d1 + s[1] + request + s[2]
    assert out.response_mask == (
        [1] * len(s[0]) + [0] * len(d1) + [1] * len(s[1]) + [0] * len(request) + [1] * len(s[2])
    )
    logp = [lp for x in s[:3] for lp in [-0.01 * (i + 1) for i in range(len(x))]]
    assert [lp for lp, m in zip(out.response_log_probs, out.response_mask, strict=True) if m] == (
        pytest.approx(logp)
    )
    summary_call = server.requests[2]
    assert summary_call["prompt_ids"] == out.prompt_ids + s[0] + d1 + s[1] + request
    assert summary_call["max_tokens"] == SUMMARY_TOKENS
    assert summary_call["temperature"] == 1.0
    # segment 1: the row's prompt with the summary (reasoning dropped) in its user message
    nxt = out.segments[0]
    expected = [{"role": "user", "content": f"{PROMPT[0]['content']}\n\n{SUMMARY_HEADER}"}]
    expected[0]["content"] += SUMMARIZED
    assert nxt.prompt_ids == render(tokenizer, expected)
    assert server.requests[3]["prompt_ids"] == nxt.prompt_ids
    d3 = delta(
        tokenizer,
        [*expected, {"role": "assistant", "content": TURNS[2]}],
        [{"role": "tool", "content": (await history(tokenizer, 3))[6]["content"]}],
    )
    assert nxt.response_ids == s[3] + d3 + s[4]
    for request_ in server.requests:
        assert len(request_["prompt_ids"]) + request_["max_tokens"] <= budget

    records = [o.record for o in samples]
    before = second + len(delta(tokenizer, msgs[:4], [msgs[4]]))
    assert records[1].branch_reason == (
        f"compaction: summarized by the policy in {len(s[2])} tokens, "
        f"{before:,} -> {len(nxt.prompt_ids):,} tokens"
    )
    assert [r.branch_point for r in records] == [None, 0]
    assert [r.stop_reason for r in records] == ["compacted", "no_tool_call"]
    assert [r.assistant_turns for r in records] == [3, 2]  # the summary is a model turn
    assert [r.user_turns for r in records] == [2, 1]  # page 2 is in segment 0's tokens
    assert [r.tool_calls for r in records] == [2, 1]
    assert records[0].turn_ends == [
        len(s[0]) - 1,
        len(s[0]) + len(d1) + len(s[1]) - 1,
        len(out.response_ids) - 1,
    ]
    assert records[0].finish_reasons == ["stop", "stop", "stop"]
    assert [r.weight for r in records] == pytest.approx([0.5, 0.5])
    assert out.metrics["compactions"] == 1.0


async def test_a_second_summary_replaces_the_first(tokenizer):
    msgs, _, _, second, request, _ = await shapes(tokenizer)
    budget = second + len(request) + SUMMARY_TOKENS
    page4 = TURNS[2].replace("Reading page 3", "Reading page 4").replace('"n": 3', '"n": 4')
    script = [*SCRIPT[:4], page4, "Pages 1-4 read.", "done"]
    loop, server = make_loop(tokenizer, budget, script)
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    assert len(out.segments) == 2, [o.record.branch_reason for o in out.segments]
    last = out.segments[1]
    expected = with_user_text(PROMPT, SUMMARY_HEADER + "Pages 1-4 read.")
    if "the last turn kept whole" in last.record.branch_reason:
        expected += [
            {"role": "assistant", "content": page4},
            {"role": "tool", "content": await page_text(4)},
        ]
    assert last.prompt_ids == render(tokenizer, expected)  # the first summary is gone
    assert server.requests[-1]["prompt_ids"] == last.prompt_ids
    assert [o.record.stop_reason for o in (out, *out.segments)] == [
        "compacted",
        "compacted",
        "no_tool_call",
    ]


async def test_a_last_turn_too_long_to_summarize_with_follows_the_summary_whole(tokenizer):
    msgs, d1, first, second, request, hidden = await shapes(tokenizer)
    # room for the request with page 2 as the placeholder, not with page 2 itself
    budget = second + len(hidden) + SUMMARY_TOKENS + 40
    assert len(hidden) + 40 < len(request)
    loop, server = make_loop(tokenizer, budget, summary_header="Notes: ")
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    s = server.sampled
    assert out.response_ids == s[0] + d1 + s[1] + hidden + s[2]
    nxt = out.segments[0]
    # the summary, then the model's last turn and its output whole
    expected = [
        {"role": "user", "content": f"{PROMPT[0]['content']}\n\nNotes: {SUMMARIZED}"},
        msgs[3],
        msgs[4],
    ]
    assert nxt.prompt_ids == render(tokenizer, expected)
    assert nxt.record.branch_reason.startswith(
        f"compaction: summarized by the policy in {len(s[2])} tokens, the last turn kept whole, "
    )
    assert [o.record.user_turns for o in (out, nxt)] == [2, 1]


async def test_every_call_leaves_room_for_a_summary(tokenizer):
    prompt = render(tokenizer, PROMPT)
    loop, server = make_loop(tokenizer, len(prompt) + RESERVE + SUMMARY_TOKENS + 1)
    room = loop.summary_room
    request = len(tokenizer.encode(SUMMARY_PROMPT, add_special_tokens=False))
    hidden = len(tokenizer.encode(PLACEHOLDER, add_special_tokens=False))
    assert room == SUMMARY_TOKENS + request + 16 + (hidden + 16)  # max_parallel_calls=1
    _, _, _, _, _, hidden_request = await shapes(tokenizer)
    assert len(hidden_request) <= room - SUMMARY_TOKENS  # the request with a placeholder fits
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    budget = len(prompt) + RESERVE + SUMMARY_TOKENS + 1
    assert server.requests == [] and out.record.stop_reason == "context_full"
    assert out.extra["context_full"] == (
        f"a prompt of {len(prompt)} tokens + multi_turn.max_tokens_per_turn={RESERVE} + {room} "
        f"for a summary (multi_turn.compaction.summary_tokens={SUMMARY_TOKENS} and its "
        f"request) does not fit the context limit {budget} (multi_turn.max_context_tokens="
        f"{budget})"
    )


async def test_a_summary_request_that_cannot_fit_stops_context_full(tokenizer):
    # one turn of four calls (max_parallel_calls=1: three answered as errors) whose four
    # placeholders pass the room reserved for one
    calls = "".join(call_text(n) for n in (1, 2, 3, 4))
    reserve = len(ids(tokenizer, calls))  # the turn takes all of its room
    prompt = render(tokenizer, PROMPT)
    loop, server = make_loop(tokenizer, 10**6, [calls], reserve=reserve)
    budget = len(prompt) + reserve + loop.summary_room  # the first call just fits
    loop, server = make_loop(tokenizer, budget, [calls], reserve=reserve)
    out = await loop.run(SAMPLING, raw_prompt=PROMPT)
    (s0,) = server.sampled
    assert len(s0) <= reserve and out.response_ids == s0 and out.segments == []
    used = len(prompt) + len(s0)
    hidden = [{"role": "tool", "content": PLACEHOLDER}] * 4
    before = [*PROMPT, {"role": "assistant", "content": calls}]
    request = delta(tokenizer, before, with_user_text(hidden, SUMMARY_PROMPT))
    room = budget - used - SUMMARY_TOKENS
    assert out.record.stop_reason == "context_full" and len(request) > room
    assert out.extra["context_full"] == (
        f"the history ({used} tokens) leaves {room} tokens for the summary request of "
        f"{len(request)} after multi_turn.compaction.summary_tokens={SUMMARY_TOKENS} "
        f"(multi_turn.max_context_tokens={budget})"
    )


async def test_a_summary_compaction_is_a_span_with_the_summary_length(tokenizer, tmp_path):
    _, _, _, second, request, _ = await shapes(tokenizer)
    budget = second + len(request) + SUMMARY_TOKENS
    previous = mlflow.get_tracking_uri()
    try:
        config = config_of(
            budget,
            trace=TraceConfig(
                backend="mlflow",
                tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}",
                experiment_name="summary",
            ),
            agent=AgentConfig(default_agent_loop="tool_agent"),
        )
        server = ScriptedServer(tokenizer, SCRIPT)
        worker = AgentLoopWorker(config, server, tokenizer, tools={"page": PageTool()})
        (out,) = await worker.generate_sequences(
            [{"raw_prompt": PROMPT}], None, TraceContext(step=1)
        )
        worker.tracer.flush()
        spans = mlflow.get_trace(out.record.trace_id).data.spans
    finally:
        mlflow.set_tracking_uri(previous)
    (span,) = [s for s in spans if s.name == "compaction"]
    assert span.attributes["mode"] == "summarize"
    assert span.attributes["summary_tokens"] == str(len(server.sampled[2]))
    assert span.attributes["kept_turn"] == "false"
    assert span.attributes["dropped"] == "0"
    assert span.outputs["reason"] == out.segments[0].record.branch_reason


def test_user_text_joins_a_last_user_message_or_follows_as_one():
    system = {"role": "system", "content": "s"}
    user = {"role": "user", "content": "task"}
    merged = with_user_text([system, user], "more")
    assert merged == [system, {"role": "user", "content": "task\n\nmore"}]
    assert merged[0] is system and user == {"role": "user", "content": "task"}  # not changed
    tool = {"role": "tool", "content": "out"}
    assert with_user_text([user, tool], "more") == [user, tool, {"role": "user", "content": "more"}]
    parts = {"role": "user", "content": [{"type": "text", "text": "task"}]}
    assert with_user_text([parts], "more")[1] == {"role": "user", "content": "more"}
    assert summary_text("<think>a</think>\n\nkeep this <tool_call>x</tool_call>") == (
        "keep this <tool_call>x</tool_call>"
    )


def test_bad_summary_settings_are_refused_naming_the_key():
    with pytest.raises(ValueError) as info:
        CompactionConfig(mode="summarize", summary_tokens=0)
    assert str(info.value) == "multi_turn.compaction.summary_tokens must be an int >= 1, got 0"
    with pytest.raises(ValueError) as info:
        CompactionConfig(mode="summarize", summary_prompt="  ")
    assert str(info.value) == (
        "multi_turn.compaction.summary_prompt must not be empty with mode=summarize: it is the "
        "message that asks the policy for its summary"
    )
    with pytest.raises(ValueError) as info:
        MultiTurnConfig(
            max_context_tokens=512,
            max_tokens_per_turn=256,
            compaction=CompactionConfig(mode="summarize", summary_tokens=256),
        )
    assert str(info.value) == (
        "multi_turn.max_tokens_per_turn=256 + multi_turn.compaction.summary_tokens=256 must be "
        "< multi_turn.max_context_tokens=512: with mode=summarize every model call leaves room "
        "for the summary"
    )
