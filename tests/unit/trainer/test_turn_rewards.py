"""Turn-level rewards: a reward's ``turn_scores`` and a loop's ``SampleRecord.turn_scores`` land
on the last token of their model turn and reach the loss: per token through GAE and
REINFORCE++ (the outcome kept across observation spans), and through ``algorithm.turn_credit``
for the group estimators, checked against float64 references written here from the
definitions; bad ``turn_scores`` stop with an error naming the function and the sample."""

from __future__ import annotations

import pytest
import torch

from agentloop.records import SampleRecord
from tests.unit.trainer.rewards.batch import make_batch
from tests.unit.trainer.rewards.test_reward_manager import manager_with
from trainer.algos import reinforce_plus_plus_advantages
from trainer.algos.turns import turn_credit_term
from trainer.config import ConfigError, load_config
from trainer.rewards import RewardFunctionError

TEXT = "#### 42 and some more words to fill ten tokens"


def score(fn, tokenizer, records, **rule):
    batch = make_batch(tokenizer, [TEXT] * len(records), records=records)
    manager = manager_with(fn, tokenizer, **rule)
    try:
        return batch, manager.score(batch)
    finally:
        manager.close()


def test_turn_scores_land_on_the_last_token_of_each_turn(tokenizer):
    def fn(data_source, solution_str, ground_truth, extra_info):
        assert extra_info["assistant_turns"] == 3
        return {"score": 1.0, "turn_scores": [0.5, -0.25]}  # turns 0 and 1 of 3

    records = [
        SampleRecord(turn_ends=[2, 6, 9], assistant_turns=3, turn_scores=[0.0, 0.0, 2.0]),
        SampleRecord(turn_ends=[3, 5, 8], assistant_turns=3),
    ]
    batch, out = score(fn, tokenizer, records)
    tokens = out.token_rewards(batch.response_mask)
    last = int(batch.response_mask[0].sum()) - 1
    got = [{int(j): float(v) for j, v in enumerate(row) if v != 0} for row in tokens]
    # the reward's turn scores, the loop's (turn 2 of sample 0), the score on the last token
    assert got[0] == pytest.approx({2: 0.5, 6: -0.25, 9: 2.0, last: 1.0})
    assert got[1] == pytest.approx({3: 0.5, 5: -0.25, last: 1.0})
    assert out.scores.tolist() == [1.0, 1.0]  # the outcome is the score alone
    # turn_reward/*: per model turn: 0.5, -0.25, 2 and 0.5, -0.25, 0
    per_turn = [0.5, -0.25, 2.0, 0.5, -0.25, 0.0]
    assert out.metrics["turn_reward/mean"] == pytest.approx(sum(per_turn) / 6)
    assert out.metrics["turn_reward/max"] == 2.0 and out.metrics["turn_reward/min"] == -0.25
    assert out.metrics["turn_reward/per_sample_mean"] == pytest.approx((2.25 + 0.25) / 2)
    assert out.metrics["turn_reward/scored_frac"] == pytest.approx(5 / 6)
    assert out.metrics["turn_reward/first_turn_mean"] == 0.5
    assert out.metrics["turn_reward/last_turn_mean"] == pytest.approx(1.0)


def test_a_loop_without_turn_ends_made_one_turn_ending_at_its_last_token(tokenizer):
    def fn(data_source, solution_str, ground_truth, extra_info):
        return {"score": 0.0, "turn_scores": [0.75]}

    batch, out = score(fn, tokenizer, [SampleRecord()])
    last = int(batch.response_mask[0].sum()) - 1
    assert float(out.turn_rewards[0, last]) == 0.75
    assert float(out.turn_rewards.sum()) == 0.75


def test_no_turn_rewards_leave_the_scores_alone(tokenizer):
    batch, out = score(lambda **_: 1.0, tokenizer, [SampleRecord(turn_ends=[3, 7])])
    assert out.turn_rewards is None and out.token_rewards(batch.response_mask) is None
    assert not any(k.startswith("turn_reward/") for k in out.metrics)


def test_more_turn_scores_than_turns_stop_with_the_function_and_sample_named(tokenizer):
    def fn(data_source, solution_str, ground_truth, extra_info):
        return {"score": 1.0, "turn_scores": [1.0, 1.0, 1.0]}

    with pytest.raises(RewardFunctionError) as info:
        score(fn, tokenizer, [SampleRecord(turn_ends=[3, 7], assistant_turns=2)])
    message = str(info.value)
    assert message.endswith(
        "returned 3 turn_scores for sample 0 (data_source='gsm8k'), which made 2 model turn(s): "
        "return at most one score per model turn (extra_info['num_turns'] counts tool turns too)"
    ), message


def test_turn_scores_that_are_not_numbers_stop_with_the_function_named(tokenizer):
    def fn(data_source, solution_str, ground_truth, extra_info):
        return {"score": 1.0, "turn_scores": [0.5, float("nan")]}

    with pytest.raises(RewardFunctionError) as info:
        score(fn, tokenizer, [SampleRecord(turn_ends=[3, 7], assistant_turns=2)])
    assert (
        "returned turn_scores=[0.5, nan] for sample 0 (data_source='gsm8k'); it must be a "
        "list of finite numbers, one per model turn in order" in str(info.value)
    )


# ---- through the estimators --------------------------------------------------------------------
def test_reinforce_plus_plus_keeps_the_outcome_across_observation_spans():
    """Returns over the sampled tokens only (an observation span is no step): token t's
    return is the discounted sum of the rewards of the sampled tokens from t on, so the
    outcome on the last token reaches turn 0 across the tool output; then whitened."""
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0, 1, 1], [1, 1, 1, 0, 0, 1, 1, 1, 0]])
    rewards = torch.zeros(2, 9, dtype=torch.float64)
    rewards[0, 1], rewards[0, 5], rewards[0, 8] = 0.5, -0.2, 1.0  # turns 0, 1, outcome
    rewards[1, 2], rewards[1, 7] = 0.3, 0.0
    gamma = 0.9
    expected = torch.zeros(2, 9, dtype=torch.float64)
    for i in range(2):
        steps = [t for t in range(9) if mask[i, t]]
        for k, t in enumerate(steps):
            expected[i, t] = sum(
                gamma ** (j - k) * float(rewards[i, steps[j]]) for j in range(k, len(steps))
            )
    picked = expected[mask.bool()]
    whitened = (expected - picked.mean()) / (picked.var() + 1e-8).sqrt() * mask
    got = reinforce_plus_plus_advantages(rewards.float(), mask, gamma)
    torch.testing.assert_close(got.double(), whitened, atol=1e-5, rtol=1e-5)


def _turn_term_reference(rewards, ends, mask, groups, gamma, norm, weights, eps=1e-6):
    """The module docstring's definition, written out in float64 with loops."""
    n, width = mask.shape
    returns = []
    for i in range(n):
        r = [float(rewards[i, e]) for e in ends[i]]
        returns.append(
            [sum(gamma ** (j - k) * r[j] for j in range(k, len(r))) for k in range(len(r))]
        )
    out = torch.zeros(n, width, dtype=torch.float64)
    for g in set(groups):
        members = [i for i in range(n) if groups[i] == g]
        if sum(weights[i] for i in members) <= 1 + 1e-4:
            continue
        cells = [(returns[i][k], weights[i]) for i in members for k in range(len(ends[i]))]
        total = sum(w for _, w in cells)
        mean = sum(v * w for v, w in cells) / total
        std = (sum(w * (v - mean) ** 2 for v, w in cells) / max(total - 1, 1)) ** 0.5
        for i in members:
            for t in range(width):
                if not mask[i, t]:
                    continue
                k = sum(1 for e in ends[i] if t > e)
                if k >= len(ends[i]):
                    continue
                value = returns[i][k] - mean
                if norm:
                    value /= std + eps
                out[i, t] = value * weights[i]
    return out


@pytest.mark.parametrize(("gamma", "norm"), [(1.0, True), (0.8, True), (0.9, False)])
def test_the_turn_credit_term_follows_its_definition(gamma, norm):
    g = torch.Generator().manual_seed(3)
    n, width = 7, 30
    groups = ["a", "a", "a", "b", "b", "b", "solo"]
    weights = [1.0, 0.5, 0.5, 1.0, 1.0, 0.0, 1.0]  # a gateway session of 2 segments, a drop
    mask = torch.zeros(n, width)
    ends: list[list[int]] = []
    for i in range(n):  # turns of 1-4 sampled tokens separated by observation spans
        t, mine = 0, []
        for _ in range(int(torch.randint(1, 5, (1,), generator=g))):
            length = int(torch.randint(1, 5, (1,), generator=g))
            mask[i, t : t + length] = 1
            mine.append(t + length - 1)
            t += length + int(torch.randint(1, 4, (1,), generator=g))
        ends.append(mine)
    rewards = torch.zeros(n, width)
    for i, mine in enumerate(ends):
        for e in mine:
            rewards[i, e] = float(torch.randn(1, generator=g))
    got = turn_credit_term(
        rewards,
        ends,
        mask,
        groups,
        gamma=gamma,
        norm_by_std=norm,
        weights=torch.tensor(weights),
    )
    expected = _turn_term_reference(rewards, ends, mask, groups, gamma, norm, weights)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)
    assert got[6].abs().sum() == 0  # a group of one sample: nothing to compare with
    assert got[5].abs().sum() == 0  # weight 0


def test_turn_credit_is_for_group_estimators():
    model = "actor_rollout_ref.model.path=tiny-qwen3"
    config, _ = load_config([model, "algorithm.turn_credit.coef=0.5"])
    assert config.algorithm.turn_credit.coef == 0.5
    with pytest.raises(ConfigError) as info:
        load_config(
            [model, "algorithm.adv_estimator=reinforce_plus_plus", "algorithm.turn_credit.coef=1"]
        )
    assert (
        "algorithm.turn_credit.coef=1.0 adds a turn term to a group estimator's advantages, but "
        "algorithm.adv_estimator=reinforce_plus_plus reads turn rewards per token already"
    ) in str(info.value)
