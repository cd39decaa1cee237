"""``agentloop-rollout``'s JSON lines from a batch of typed sample records: the same keys and
values as when the records were string-keyed dicts (each call a plain dict), plus each
sample's weight, gateway segment (session, index, branch reason and point) and error."""

from __future__ import annotations

import json

from agentloop.records import SampleRecord
from tests.unit.trainer.rewards.batch import make_batch, tool_call
from trainer.loop.trajectories import trajectory_records


def test_a_trajectory_line_has_exactly_the_rollout_keys_and_the_record_values(tokenizer):
    record = SampleRecord(
        stop_reason="no_tool_call",
        finish_reasons=["stop", "stop"],
        turn_ends=[2, 5],
        assistant_turns=2,
        user_turns=1,
        tool_calls=1,
        tool_errors=1,
        tool_error_kinds=["schema"],
        calls=[tool_call("calc", arguments={"a": 2, "b": 3}, seconds=0.5, reward=1.0)],
        tool_rewards={"calc": 1.0},
        trace_id="tr-7",
        weight=0.5,
        session_id="s1",
        segment=1,
        branch_reason="the system prompt changed",
        branch_point=0,
        error="AgentFailed: boom",
    )
    batch = make_batch(tokenizer, ["#### 42", "#### 41"], records=[record, SampleRecord()])
    lines = trajectory_records(batch, tokenizer)
    assert list(lines[0]) == [
        "uid",
        "rollout_n",
        "index",
        "data_source",
        "agent_name",
        "num_turns",
        "stop_reason",
        "finish_reasons",
        "tool_calls",
        "tool_errors",
        "tool_error_kinds",
        "calls",
        "tool_rewards",
        "weight",
        "session_id",
        "segment",
        "branch_reason",
        "branch_point",
        "error",
        "prompt_text",
        "response_text",
        "prompt_ids",
        "response_ids",
        "response_mask",
        "response_log_probs",
    ]
    first = {k: lines[0][k] for k in list(lines[0])[6:13]}
    assert first == {
        "stop_reason": "no_tool_call",
        "finish_reasons": ["stop", "stop"],
        "tool_calls": 1,
        "tool_errors": 1,
        "tool_error_kinds": ["schema"],
        "calls": [
            {
                "name": "calc",
                "arguments": {"a": 2, "b": 3},
                "ok": True,
                "seconds": 0.5,
                "repaired": False,
                "reward": 1.0,
                "turn": 0,
                "state_key": None,
            }
        ],
        "tool_rewards": {"calc": 1.0},
    }
    segment = {k: lines[0][k] for k in list(lines[0])[13:19]}
    assert segment == {
        "weight": 0.5,
        "session_id": "s1",
        "segment": 1,
        "branch_reason": "the system prompt changed",
        "branch_point": 0,
        "error": "AgentFailed: boom",
    }
    assert {k: lines[1][k] for k in list(lines[1])[13:19]} == {
        "weight": 1.0,
        "session_id": None,
        "segment": 0,
        "branch_reason": None,
        "branch_point": None,
        "error": None,
    }
    # a loop that reports nothing: the defaults the dict reader used to fill in
    second = {k: lines[1][k] for k in list(lines[1])[6:13]}
    assert second == {
        "stop_reason": None,
        "finish_reasons": None,
        "tool_calls": 0,
        "tool_errors": 0,
        "tool_error_kinds": [],
        "calls": [],
        "tool_rewards": {},
    }
    assert json.loads(json.dumps(lines)) == lines
