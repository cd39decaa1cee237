"""Turn-level rewards: scores of single model turns, placed on the last sampled token of their
turn ([batch, response] tensors), so that they reach the loss per token (GAE, REINFORCE++) or
through ``algorithm.turn_credit`` (group estimators).

Where they come from, per sample:

- a reward's dict result with ``turn_scores``: one finite number per model turn, in order (the
  rule function, an extra rule, the verify hook; fewer than the turns is fine: the first
  turns); weighted like the reward that returned them (``reward_model.weights``);
- the loop's ``SampleRecord.turn_scores`` (a simulated user's or an environment's score of
  each turn), as they are;
- each tool call's own reward x ``reward_model.process_reward_coef``, on the turn that made
  the call (``process_rewards``).

A model turn ends at ``SampleRecord.turn_ends[k]``; a loop that records no turn ends made one
turn, ending at the sample's last sampled token.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch

from agentloop.records import SampleRecord
from trainer.rewards.types import RewardFunctionError, RewardSample

__all__ = [
    "as_turn_scores",
    "place_turn_scores",
    "process_rewards",
    "turn_ends",
    "turn_reward_metrics",
]


def turn_ends(record: SampleRecord, mask_row: torch.Tensor) -> list[int]:
    """The response index of each model turn's last token (one turn ending at the last
    sampled token when the loop recorded none; no turn without sampled tokens)."""
    if record.turn_ends:
        return list(record.turn_ends)
    sampled = torch.nonzero(mask_row).flatten()
    return [int(sampled[-1])] if sampled.numel() else []


def as_turn_scores(
    value: Any, describe: str, sample: RewardSample, turns: int
) -> list[float] | None:
    """The ``turn_scores`` of one reward result (None when it has none), checked: a list of
    finite numbers, at most one per model turn of the sample."""
    if not isinstance(value, dict) or "turn_scores" not in value:
        return None
    scores = value["turn_scores"]
    where = f"for sample {sample.index} (data_source={sample.data_source!r})"
    if not isinstance(scores, (list, tuple)) or not all(
        isinstance(s, numbers.Real) and math.isfinite(float(s)) for s in scores
    ):
        raise RewardFunctionError(
            f"{describe} returned turn_scores={scores!r} {where}; it must be a list of finite "
            "numbers, one per model turn in order"
        )
    if len(scores) > turns:
        raise RewardFunctionError(
            f"{describe} returned {len(scores)} turn_scores {where}, which made {turns} model "
            f"turn(s): return at most one score per model turn (extra_info['num_turns'] counts "
            "tool turns too)"
        )
    return [float(s) for s in scores]


def place_turn_scores(
    records: list[SampleRecord], mask: torch.Tensor, scores: list[list[float] | None]
) -> torch.Tensor:
    """[batch, response]: sample i's k-th turn score on the last token of its k-th turn."""
    out = torch.zeros(mask.shape, dtype=torch.float32)
    for i, (record, turn_scores) in enumerate(zip(records, scores, strict=True)):
        if turn_scores:
            ends = turn_ends(record, mask[i])
            for end, score in zip(ends, turn_scores, strict=False):
                out[i, end] += score
    return out


def process_rewards(batch: Any, coef: float) -> torch.Tensor:
    """[batch, response]: each tool call's reward x ``coef`` at the last token of the model
    turn that made it (the record's ``turn_ends`` and each call's ``turn``)."""
    out = torch.zeros(batch.response_mask.shape, dtype=torch.float32)
    for i, record in enumerate(batch.records):
        ends = record.turn_ends
        for call in record.calls:
            if call.reward is None or call.turn >= len(ends):
                continue
            out[i, ends[call.turn]] += coef * float(call.reward)
    return out


def turn_reward_metrics(
    turn_rewards: torch.Tensor, records: list[SampleRecord], mask: torch.Tensor
) -> dict[str, float]:
    """``turn_reward/*``: the turn rewards' mean, max and min over the model turns of the
    batch, each sample's sum averaged, the share of turns with a non-zero one, and the mean
    of the first and the last turn's."""
    per_turn: list[float] = []
    first: list[float] = []
    last: list[float] = []
    for i, record in enumerate(records):
        values = [float(turn_rewards[i, end]) for end in turn_ends(record, mask[i])]
        if values:
            per_turn.extend(values)
            first.append(values[0])
            last.append(values[-1])
    if not per_turn:
        return {}
    return {
        "turn_reward/mean": sum(per_turn) / len(per_turn),
        "turn_reward/max": max(per_turn),
        "turn_reward/min": min(per_turn),
        "turn_reward/per_sample_mean": float(turn_rewards.sum(-1).mean()),
        "turn_reward/scored_frac": sum(v != 0 for v in per_turn) / len(per_turn),
        "turn_reward/first_turn_mean": sum(first) / len(first),
        "turn_reward/last_turn_mean": sum(last) / len(last),
    }
