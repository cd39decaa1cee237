"""Advantages, loss aggregation, the PPO loss, KL penalties and entropy against values
computed by hand; the policy gradient is exactly zero on masked (tool) tokens."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.algos import (
    agg_loss,
    apply_kl_in_reward,
    compute_advantages,
    entropy_from_logits,
    grpo_advantages,
    kl_penalty,
    policy_loss,
    reinforce_plus_plus_advantages,
    rloo_advantages,
    scores_to_token_rewards,
)


def test_grpo_normalises_within_each_group_with_unbiased_std():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 5.0])
    groups = ["a", "a", "a", "b", "b", "c"]
    adv = grpo_advantages(scores, groups)
    # group a: mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3)
    std_a = math.sqrt(1 / 3)
    expected = [
        (2 / 3) / (std_a + 1e-6),
        (-1 / 3) / (std_a + 1e-6),
        (-1 / 3) / (std_a + 1e-6),
        0.0,
        0.0,
        0.0,
    ]
    assert adv.tolist() == pytest.approx(expected, rel=1e-6)
    # b: identical scores -> 0; c: a group of one -> 0


def test_grpo_without_std_normalisation_is_the_centred_score():
    adv = grpo_advantages(torch.tensor([3.0, 1.0, 2.0]), ["g"] * 3, norm_by_std=False)
    assert adv.tolist() == pytest.approx([1.0, -1.0, 0.0])


def test_rloo_subtracts_the_mean_of_the_others():
    adv = rloo_advantages(torch.tensor([3.0, 1.0, 2.0, 7.0]), ["g", "g", "g", "solo"])
    assert adv.tolist() == pytest.approx([3 - 1.5, 1 - 2.5, 2 - 2.0, 0.0])


def test_token_advantages_are_zero_off_the_mask():
    mask = torch.tensor([[1, 1, 0, 1], [1, 0, 0, 0]])
    adv = compute_advantages("grpo", torch.tensor([1.0, 0.0]), mask, ["g", "g"])
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(adv, torch.tensor([[a, a, 0, a], [-a, 0, 0, 0]]))


def test_scores_land_on_the_last_sampled_token():
    mask = torch.tensor([[1, 1, 0, 1, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
    rewards = scores_to_token_rewards(torch.tensor([2.0, 3.0, 4.0]), mask)
    assert rewards.tolist() == [[0, 0, 0, 2, 0], [3, 0, 0, 0, 0], [0, 0, 0, 0, 0]]


def test_reinforce_plus_plus_discounts_over_sampled_tokens_then_whitens():
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 1]])
    rewards = scores_to_token_rewards(torch.tensor([1.0, 0.0]), mask)
    adv = reinforce_plus_plus_advantages(rewards, mask, gamma=0.5)
    # returns: row 0 sampled tokens 0.25, 0.5, (tool), 1.0; row 1 all 0
    returns = torch.tensor([0.25, 0.5, 1.0, 0.0, 0.0, 0.0, 0.0])
    whitened = (returns - returns.mean()) / returns.std()
    expected = [[whitened[0], whitened[1], 0.0, whitened[2]], whitened[3:].tolist()]
    assert adv[0].tolist() == pytest.approx([float(x) for x in expected[0]], rel=1e-4)
    assert adv[1].tolist() == pytest.approx(expected[1], rel=1e-4)


def test_agg_loss_modes_match_their_formulas():
    loss = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]])
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx((1 + 2 + 5 + 6 + 7) / 5)
    assert agg_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx((3 + 18 + 0) / 3)
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx((1.5 + 6.0) / 2)
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(21 / 4)
    with pytest.raises(
        ValueError, match="loss_agg_mode='sum' is not supported; use one of token-mean"
    ):
        agg_loss(loss, mask, "sum")


def test_ppo_loss_clips_asymmetrically_and_dual_clips_negative_advantages():
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 5.0]]))  # ratios
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    mask = torch.ones(1, 4)
    loss, metrics = policy_loss(
        logp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0
    )
    # A>0, r=1.5 -> max(-1.5, -1.28) = -1.28 ; A<0, r=0.5 -> max(0.5, 0.8) = 0.8 (clipped low)
    # A>0, r=1.1 -> -1.1 (inside) ; A<0, r=5 -> max(5, 1.28) = 5 -> dual clip min(3, 5) = 3
    assert loss.item() == pytest.approx((-1.28 + 0.8 - 1.1 + 3.0) / 4)
    assert metrics["pg_clipfrac"] == pytest.approx(2 / 4)
    assert metrics["pg_clipfrac_lower"] == pytest.approx(1 / 4)


def test_policy_gradient_ignores_tool_tokens():
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 11, requires_grad=True)
    tokens = torch.randint(0, 11, (2, 6))
    mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 0, 0, 1, 1, 0]])
    adv = torch.randn(2, 6)
    old = torch.randn(2, 6) * 0.1 - 2

    def grad(perturb: bool) -> torch.Tensor:
        lg = logits.detach().clone().requires_grad_(True)
        toks, old_lp, a = tokens.clone(), old.clone(), adv.clone()
        if perturb:  # change everything about the masked positions
            toks[mask == 0] = (toks[mask == 0] + 3) % 11
            old_lp[mask == 0] += 5.0
            a[mask == 0] *= -7.0
        logp = torch.log_softmax(lg, -1).gather(-1, toks.unsqueeze(-1)).squeeze(-1)
        loss, _ = policy_loss(logp, old_lp, a, mask)
        loss.backward()
        return lg.grad

    g = grad(False)
    assert torch.equal(g, grad(True))
    assert torch.all(g[mask == 0] == 0) and torch.any(g[mask == 1] != 0)


def test_kl_penalties_and_kl_in_reward():
    logp, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    assert kl_penalty(logp, ref, "kl")[0].tolist() == pytest.approx([0.5, -1.0])
    assert kl_penalty(logp, ref, "abs")[0].tolist() == pytest.approx([0.5, 1.0])
    assert kl_penalty(logp, ref, "mse")[0].tolist() == pytest.approx([0.125, 0.5])
    k3 = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1]
    assert kl_penalty(logp, ref, "low_var_kl")[0].tolist() == pytest.approx(k3)
    rewards, mean_kl = apply_kl_in_reward(
        torch.tensor([[0.0, 1.0]]), logp, ref, torch.tensor([[1, 0]]), beta=0.1
    )
    assert rewards[0].tolist() == pytest.approx([-0.05, 1.0]) and mean_kl == pytest.approx(0.5)
    with pytest.raises(ValueError, match="KL type 'k9' is not supported"):
        kl_penalty(logp, ref, "k9")


def test_entropy_of_uniform_and_peaked_logits():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]])
    assert entropy_from_logits(logits).tolist() == pytest.approx([math.log(4), 0.0], abs=1e-6)


def test_unknown_estimator_is_named():
    with pytest.raises(ValueError) as info:
        compute_advantages("gae", torch.zeros(1), torch.ones(1, 1), ["g"])
    assert str(info.value) == (
        "algorithm.adv_estimator='gae' is not supported; use one of grpo, rloo, reinforce_plus_plus"
    )
