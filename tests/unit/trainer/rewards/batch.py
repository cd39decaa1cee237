"""A real collated rollout batch for reward tests (real tokenizer, real ``collate``)."""

from __future__ import annotations

from typing import Any

from agentloop.base import AgentLoopOutput
from agentloop.batch import RolloutBatch, collate
from agentloop.records import SampleRecord, ToolCallRecord


def make_batch(
    tokenizer: Any,
    responses: list[str],
    truths: list[Any] | None = None,
    reward_scores: list[float | None] | None = None,
    data_source: str = "gsm8k",
    records: list[SampleRecord] | None = None,
    extra_info: list[dict[str, Any]] | None = None,
    response_length: int = 48,
) -> RolloutBatch:
    """A batch whose i-th response decodes to ``responses[i]``."""
    n = len(responses)
    truths = truths or ["42"] * n
    reward_scores = reward_scores or [None] * n
    records = records or [SampleRecord(tool_calls=1, tool_rewards={"calc": 0.5}) for _ in range(n)]
    extra_info = extra_info or [{} for _ in range(n)]
    outputs, rows = [], []
    for i in range(n):
        prompt = tokenizer.encode("What is 6 x 7?")
        response = tokenizer.encode(responses[i])
        outputs.append(
            AgentLoopOutput(
                prompt_ids=prompt,
                response_ids=response,
                response_mask=[1] * len(response),
                response_log_probs=[0.0] * len(response),
                num_turns=2,
                reward_score=reward_scores[i],
                record=records[i],
            )
        )
        rows.append(
            {
                "uid": f"u{i}",
                "agent_name": "tool_agent",
                "data_source": data_source,
                "prompt": [{"role": "user", "content": f"question {i}"}],
                "reward_model": {"ground_truth": truths[i]},
                "extra_info": {"index": i, **extra_info[i]},
            }
        )
    return collate(outputs, rows, prompt_length=16, response_length=response_length, pad_token_id=0)


def tool_call(name: str, **fields: Any) -> ToolCallRecord:
    """A call record with defaults for what a test does not care about."""
    defaults: dict[str, Any] = dict(
        arguments={}, ok=True, seconds=0.0, repaired=False, reward=None, turn=0
    )
    return ToolCallRecord(name=name, **(defaults | fields))
