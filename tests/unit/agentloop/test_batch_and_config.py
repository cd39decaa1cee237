"""Padding outputs into a batch (left/right padding, masks, positions, budget errors), rollout
metrics, and strict config building from dicts."""

from __future__ import annotations

import pytest

from agentloop import (
    AgentLoopOutput,
    MultiTurnConfig,
    RolloutBatch,
    RolloutConfig,
    SampleRecord,
    collate,
    from_dict,
)
from agentloop.batch import rollout_metrics
from agentloop.config import _check
from agentloop.manager import expand_rows
from agentloop.records import ToolCallRecord


def output(prompt, response, mask, total_s=1.0) -> AgentLoopOutput:
    return AgentLoopOutput(
        prompt_ids=prompt,
        response_ids=response,
        response_mask=mask,
        response_log_probs=[-0.5 if m else 0.0 for m in mask],
        num_turns=2,
        record=SampleRecord(tool_calls=sum(1 - m for m in mask), tool_errors=0),
        metrics={"generate_s": total_s / 2, "tool_s": 0.1, "total_s": total_s},
    )


def test_collate_left_pads_prompts_and_right_pads_responses():
    outs = [output([1, 2, 3], [4, 5], [1, 0]), output([6], [7, 8, 9, 10], [1, 1, 0, 1])]
    rows = [{"uid": "a", "agent_name": "x"}, {"uid": "b", "agent_name": "y"}]
    b = collate(outs, rows, prompt_length=4, response_length=5, pad_token_id=0)
    assert b.prompts.tolist() == [[0, 1, 2, 3], [0, 0, 0, 6]]
    assert b.responses.tolist() == [[4, 5, 0, 0, 0], [7, 8, 9, 10, 0]]
    assert b.attention_mask.tolist() == [[0, 1, 1, 1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1, 1, 1, 0]]
    assert b.position_ids.tolist() == [[0, 0, 1, 2, 3, 4, 4, 4, 4], [0, 0, 0, 0, 1, 2, 3, 4, 4]]
    assert b.response_mask.tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 1, 0]]
    assert b.rollout_log_probs.tolist() == [[-0.5, 0, 0, 0, 0], [-0.5, -0.5, 0, -0.5, 0]]
    assert b.uid == ["a", "b"] and b.agent_name == ["x", "y"] and len(b) == 2
    assert b.tool_calls == [1, 1]


def test_collate_rejects_samples_over_the_budget():
    with pytest.raises(ValueError, match="sample 0 has 1 prompt / 3 response tokens, over the"):
        collate(
            [output([1], [1, 2, 3], [1, 1, 1])],
            [{"uid": "a", "agent_name": "x"}],
            prompt_length=4,
            response_length=2,
            pad_token_id=0,
        )


def test_rollout_metrics_report_the_slowest_sample():
    outs = [output([1], [2], [1], total_s=1.0), output([1, 2], [3, 4, 5], [1, 0, 1], total_s=4.0)]
    m = rollout_metrics(outs, wall_s=4.5)
    assert m["timing_s/gen"] == 4.5
    assert m["agent_loop/slowest/index"] == 1 and m["agent_loop/slowest/total_s"] == 4.0
    assert m["agent_loop/slowest/response_length"] == 3
    assert m["agent_loop/total_s/mean"] == 2.5 and m["agent_loop/total_s/min"] == 1.0


def test_rollout_metrics_count_the_repaired_calls_of_the_step():
    def calls(*repaired: bool) -> list[ToolCallRecord]:
        return [
            ToolCallRecord(
                name="calc", arguments={}, ok=True, seconds=0.1, repaired=r, reward=None, turn=0
            )
            for r in repaired
        ]

    outs = [output([1], [2], [1]), output([1], [2], [1]), output([1], [2], [1])]
    outs[0].record.calls = calls(True, False)
    outs[1].record.calls = calls(True, True)
    m = rollout_metrics(outs, wall_s=1.0)
    assert m["agent_loop/repaired_calls"] == 3.0
    assert m["agent_loop/repaired_calls/frac"] == 0.75
    assert rollout_metrics([output([1], [2], [1])], 1.0)["agent_loop/repaired_calls/frac"] == 0.0


def test_rollout_metrics_aggregate_each_tools_calls_failures_and_seconds():
    def call(name: str, ok: bool, seconds: float) -> ToolCallRecord:
        return ToolCallRecord(
            name=name, arguments={}, ok=ok, seconds=seconds, repaired=False, reward=None, turn=0
        )

    outs = [output([1], [2], [1]), output([1], [2], [1])]
    outs[0].record.calls = [call("search", True, 0.5), call("calc", False, 0.25)]
    outs[1].record.calls = [call("search", False, 1.5), call("search", True, 1.0)]
    m = rollout_metrics(outs, wall_s=1.0)
    assert {k: v for k, v in m.items() if k.startswith("tool/")} == {
        "tool/calc/calls": 1.0,
        "tool/calc/failures": 1.0,
        "tool/calc/seconds_mean": 0.25,
        "tool/calc/seconds_max": 0.25,
        "tool/search/calls": 3.0,
        "tool/search/failures": 1.0,
        "tool/search/seconds_mean": 1.0,
        "tool/search/seconds_max": 1.5,
    }


def test_rollout_metrics_say_what_happened_to_the_calls_and_count_model_turns():
    outs = [output([1], [2], [1]) for _ in range(4)]
    outs[0].record = SampleRecord(tool_calls=2, assistant_turns=3)
    outs[1].record = SampleRecord(
        tool_errors=3, tool_error_kinds=["bad_json", "tool_timeout", "unknown_tool"]
    )
    outs[2].record = SampleRecord(tool_calls=1, tool_errors=1, tool_error_kinds=["tool_failed"])
    outs[3].record = SampleRecord(assistant_turns=1)  # answered without a call
    m = rollout_metrics(outs, wall_s=1.0)
    assert m["agent_loop/calls_attempted/mean"] == (2 + 3 + 2 + 0) / 4
    assert m["agent_loop/tool_calls/mean"] == (2 + 0 + 1 + 0) / 4  # succeeded
    assert m["agent_loop/calls_malformed/mean"] == 2 / 4
    assert m["agent_loop/calls_failed/mean"] == 2 / 4
    assert m["agent_loop/samples_with_calls"] == 3 / 4
    assert m["agent_loop/assistant_turns/max"] == 3.0


def test_expand_rows_repeats_each_row_n_times_with_one_uid():
    rows = expand_rows(
        [{"raw_prompt": [], "uid": "q1"}, {"raw_prompt": []}], 3, "single_turn_agent"
    )
    assert [r["uid"] for r in rows[:3]] == ["q1"] * 3
    assert len({r["uid"] for r in rows[3:]}) == 1 and rows[3]["uid"] != "q1"
    assert [r["rollout_n"] for r in rows] == [0, 1, 2, 0, 1, 2]
    assert {r["agent_name"] for r in rows} == {"single_turn_agent"}


@pytest.mark.parametrize(
    ("hint", "value", "expected"),
    [
        (str, 2024, "2024"),  # Hydra reads name=2024 as an int; a str field takes its text
        (str, 1.5, "1.5"),
        (str | None, 7, "7"),
        (list[str] | str | None, 8, "8"),  # the union's only member for a number is str
        (list[str], [1, "a"], ["1", "a"]),
        (str | int | None, 4, 4),  # a numeric member takes the number as it is
        (str | int | None, "0-3", "0-3"),
        (float, 2, 2.0),
    ],
)
def test_check_gives_a_str_field_the_text_of_a_number(hint, value, expected):
    checked = _check("k", hint, value)
    assert checked == expected and type(checked) is type(expected)


@pytest.mark.parametrize(
    ("hint", "value", "message"),
    [
        (str, True, "k must be str, got bool True"),
        (str | None, False, "k must be str, got bool False"),
        (str, [1], "k must be str, got list [1]"),
        (str | int | None, 1.5, "k must be int, got float 1.5"),
    ],
)
def test_check_never_takes_a_bool_or_a_container_as_text(hint, value, message):
    with pytest.raises(ValueError) as info:
        _check("k", hint, value)
    assert str(info.value) == message


def test_from_dict_builds_nested_configs():
    cfg = from_dict(RolloutConfig, {"n": 4, "top_p": 1, "multi_turn": {"max_parallel_calls": 3}})
    assert cfg.n == 4 and cfg.top_p == 1.0 and isinstance(cfg.top_p, float)
    assert cfg.multi_turn == MultiTurnConfig(max_parallel_calls=3)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"multi_turn": {"fromat": "hermes"}},
            "unknown config key rollout.multi_turn.fromat; known keys under rollout.multi_turn: ",
        ),
        ({"n": "4"}, "rollout.n must be int, got str '4'"),
        ({"n": True}, "rollout.n must be int, got bool True"),
        (
            {"multi_turn": {"tool_response_truncate_side": "top"}},
            "rollout.multi_turn.tool_response_truncate_side must be one of 'left', 'middle', "
            "'right', got 'top'",
        ),
        ({"mode": "sync"}, "actor_rollout_ref.rollout.mode='sync' is not supported"),
        (
            {"multi_turn": {"max_parallel_calls": 0}},
            "multi_turn.max_parallel_calls must be >= 1, got 0",
        ),
        (
            {"engine": {"scheduling_policy": "lifo"}},
            "rollout.scheduling_policy must be 'priority' or 'fcfs', got 'lifo'",
        ),
        ({"engine": {"max_num_seqs": 0}}, "rollout.max_num_seqs must be >= 1 or null, got 0"),
        (
            {"engine": {"max_num_batched_tokens": 0}},
            "rollout.max_num_batched_tokens must be >= 1 or null, got 0",
        ),
        ({"num_servers": 0}, "rollout.num_servers must be >= 1 or null, got 0"),
        (
            {"engine": {"enforce_eager": "yes"}},
            "rollout.engine.enforce_eager must be bool, got str 'yes'",
        ),
        (
            {"engine": {"engine_kwargs": ["max_logprobs"]}},
            "rollout.engine.engine_kwargs must be a mapping, got list",
        ),
        (
            {"engine_kwargs": {"vllm": {}}},
            "unknown config key rollout.engine_kwargs; known keys under rollout: ",
        ),
    ],
)
def test_from_dict_errors_name_the_key(data, message):
    with pytest.raises(ValueError) as info:
        from_dict(RolloutConfig, data, path="rollout")
    assert str(info.value).startswith(message)


# ---- a session's segments (gateway): one row each, right after the session ---------------
def segmented(weight: float = 1 / 3) -> AgentLoopOutput:
    """A session of three segments: its first sample and two with their own prompts."""
    first = output([1, 2], [3, 4], [1, 1], total_s=3.0)
    first.segments = [output([5], [6, 7, 8], [1, 0, 1]), output([9, 10, 11], [12], [1])]
    for j, sample in enumerate([first, *first.segments]):
        sample.record.weight, sample.record.segment = weight, j
    return first


def test_collate_puts_each_segment_right_after_its_session_with_the_sessions_row():
    outs = [segmented(), output([13], [14, 15], [1, 1])]
    rows = [
        {"uid": "a", "agent_name": "gw", "rollout_n": 0, "data_source": "s"},
        {"uid": "a", "agent_name": "gw", "rollout_n": 1, "data_source": "s"},
    ]
    b = collate(outs, rows, prompt_length=3, response_length=3, pad_token_id=0)
    assert len(b) == 4 and b.num_sessions == 2
    assert b.segment == [0, 1, 2, 0]
    assert b.prompts.tolist() == [[0, 1, 2], [0, 0, 5], [9, 10, 11], [0, 0, 13]]
    assert b.responses.tolist() == [[3, 4, 0], [6, 7, 8], [12, 0, 0], [14, 15, 0]]
    assert b.response_mask.tolist() == [[1, 1, 0], [1, 0, 1], [1, 0, 0], [1, 1, 0]]
    assert b.attention_mask.sum(-1).tolist() == [4, 4, 4, 3]
    assert b.position_ids[1].tolist() == [0, 0, 0, 1, 2, 3]
    assert b.uid == ["a"] * 4 and b.agent_name == ["gw"] * 4
    assert [r["rollout_n"] for r in b.rows] == [0, 0, 0, 1]
    assert b.rows[1] == rows[0] and b.rows[1] is not rows[0]  # a copy per segment
    assert b.records == [outs[0].record, *(s.record for s in outs[0].segments), outs[1].record]
    assert b.weights == pytest.approx([1 / 3, 1 / 3, 1 / 3, 1.0])
    assert b.num_turns == [2, 2, 2, 2] and b.reward_score == [None] * 4


def test_concatenated_batches_keep_their_segments():
    rows = [{"uid": "a", "agent_name": "gw"}]
    one = collate([segmented()], rows, prompt_length=3, response_length=3, pad_token_id=0)
    two = collate([output([1], [2], [1])], rows, prompt_length=3, response_length=3, pad_token_id=0)
    both = RolloutBatch.cat([one, two])
    assert both.segment == [0, 1, 2, 0] and both.num_sessions == 2 and len(both) == 4


def collate_error(session, prompt_length: int) -> str:
    """The ValueError ``collate`` raises for one session (response_length 3)."""
    with pytest.raises(ValueError) as err:
        collate(
            [session],
            [{"uid": "a", "agent_name": "x"}],
            prompt_length=prompt_length,
            response_length=3,
            pad_token_id=0,
        )
    return str(err.value)


def test_collate_names_the_segment_over_the_budget():
    assert collate_error(segmented(), prompt_length=2) == (
        "sample 0 segment 2 has 3 prompt / 1 response tokens, over the "
        "prompt_length=2 / response_length=3 budget"
    )


def test_collate_rejects_segments_of_a_segment():
    session = segmented()
    session.segments[0].segments = [output([1], [2], [1])]
    assert collate_error(session, prompt_length=3) == (
        "sample 0 segment 1 has segments of its own: a session's further samples are one "
        "flat list, AgentLoopOutput.segments of its first"
    )


def test_rollout_metrics_count_sessions_and_segments_and_samples():
    dropped = output([1], [2, 3], [1, 1], total_s=1.0)
    dropped.record.weight = 0.0
    outs = [segmented(), dropped]
    m = rollout_metrics(outs, wall_s=5.0)
    assert m["agent_loop/sessions"] == 2.0 and m["agent_loop/samples"] == 4.0
    assert m["agent_loop/segments_per_session/mean"] == 2.0
    assert m["agent_loop/segments_per_session/max"] == 3.0
    assert m["agent_loop/zero_weight_samples"] == 1.0
    # lengths and turns per training sample (the batch's rows), timings per session
    assert m["agent_loop/response_length/mean"] == (2 + 3 + 1 + 2) / 4
    assert m["agent_loop/response_length/min"] == 1.0
    assert m["agent_loop/tool_calls/mean"] == (0 + 1 + 0 + 0) / 4
    assert m["agent_loop/total_s/mean"] == 2.0 and m["agent_loop/slowest/index"] == 0.0
    plain = rollout_metrics([output([1], [2], [1])], 1.0)
    assert plain["agent_loop/segments_per_session/mean"] == 1.0
    assert plain["agent_loop/sessions"] == plain["agent_loop/samples"] == 1.0
