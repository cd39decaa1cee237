"""The critic's math against float64 references written here from the definitions (PPO's
clipped value loss, explained variance, GAE advantages whitened for the policy), and the
critic's config: verl's ``critic.enable: null`` rule and each bad input's exact error."""

from __future__ import annotations

import os

import pytest
import torch

from trainer.algos import compute_advantages, gae_advantages
from trainer.algos.value import explained_variance, gae_for_policy, value_loss_tokens
from trainer.config import ConfigError, load_config
from trainer.config.actor import CheckpointConfig
from trainer.config.critic import CriticConfig
from trainer.loop.checkpoint import CheckpointManager

MODEL = "actor_rollout_ref.model.path=tiny-qwen3"


def test_value_loss_is_half_the_larger_of_clipped_and_unclipped_squared_errors():
    g = torch.Generator().manual_seed(0)
    vpreds, old, returns = (torch.randn(5, 9, generator=g, dtype=torch.float64) for _ in "abc")
    clip = 0.3
    losses, clipped = value_loss_tokens(vpreds, old, returns, clip)
    for i in range(5):
        for t in range(9):
            v, v_old, r = float(vpreds[i, t]), float(old[i, t]), float(returns[i, t])
            v_clip = min(max(v, v_old - clip), v_old + clip)
            l1, l2 = (v - r) ** 2, (v_clip - r) ** 2
            assert float(losses[i, t]) == pytest.approx(0.5 * max(l1, l2), rel=1e-12)
            assert bool(clipped[i, t]) == (l2 > l1)
    assert clipped.any() and not clipped.all()  # both cases occur in this draw


def test_explained_variance_from_its_definition():
    g = torch.Generator().manual_seed(1)
    returns = torch.randn(4, 6, generator=g)
    values = returns + 0.3 * torch.randn(4, 6, generator=g)
    mask = (torch.rand(4, 6, generator=g) > 0.3).float()
    r = [float(returns[i, t]) for i in range(4) for t in range(6) if mask[i, t]]
    v = [float(values[i, t]) for i in range(4) for t in range(6) if mask[i, t]]

    def var(xs: list[float]) -> float:
        mean = sum(xs) / len(xs)
        return sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)

    expected = 1 - var([a - b for a, b in zip(r, v, strict=True)]) / var(r)
    assert explained_variance(values, returns, mask) == pytest.approx(expected, rel=1e-6)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    flat = torch.ones(4, 6)
    assert explained_variance(values, flat, mask) == 0.0  # returns that do not vary


def _spans(g: torch.Generator, rows: int, width: int) -> torch.Tensor:
    """Sampled turns separated by observation spans (tool output: mask 0)."""
    mask = torch.zeros(rows, width)
    for i in range(rows):
        t = 0
        while t < width - 2:
            turn = int(torch.randint(1, 5, (1,), generator=g))
            mask[i, t : t + turn] = 1
            t += turn + int(torch.randint(1, 4, (1,), generator=g))
    return mask


def test_gae_for_the_policy_is_gae_whitened_over_sampled_tokens_and_weighted():
    g = torch.Generator().manual_seed(2)
    mask = _spans(g, 6, 24)
    values = torch.randn(6, 24, generator=g)
    rewards = torch.randn(6, 24, generator=g) * mask
    raw, returns = gae_advantages(rewards, values, mask, 0.99, 0.95)
    advantages, returns_out = gae_for_policy(rewards, values, mask, gamma=0.99, lam=0.95)
    torch.testing.assert_close(returns_out, returns)  # the critic's targets stay unwhitened
    picked = raw[mask.bool()].double()
    expected = (raw.double() - picked.mean()) / (picked.var() + 1e-8).sqrt() * mask
    torch.testing.assert_close(advantages.double(), expected, atol=1e-5, rtol=1e-5)
    # weights: a sample of weight 0 leaves the whitening statistics; others scale
    weights = torch.tensor([1.0, 0.5, 0.5, 0.0, 1.0, 1.0])
    weighted, _ = gae_for_policy(rewards, values, mask, gamma=0.99, lam=0.95, weights=weights)
    kept = mask * (weights > 0).unsqueeze(1)
    picked = raw[kept.bool()].double()
    expected = (raw.double() - picked.mean()) / (picked.var() + 1e-8).sqrt() * kept
    expected = expected * weights.double().unsqueeze(1)
    torch.testing.assert_close(weighted.double(), expected, atol=1e-5, rtol=1e-5)
    same, _ = gae_for_policy(rewards, values, mask, gamma=0.99, lam=0.95, weights=torch.ones(6))
    torch.testing.assert_close(same, advantages)


def test_the_gae_estimator_needs_values_and_gives_gae_for_the_policy():
    mask = torch.ones(2, 4)
    scores = torch.tensor([1.0, 0.0])
    with pytest.raises(ValueError) as info:
        compute_advantages("gae", scores, mask, ["a", "a"])
    assert str(info.value) == (
        "algorithm.adv_estimator=gae needs the critic's values: set critic.enable=null "
        "(on for gae) or True"
    )
    values = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.0, -0.1, 0.2, 0.1]])
    out = compute_advantages("gae", scores, mask, ["a", "a"], values=values, lam=0.5)
    rewards = torch.zeros(2, 4)
    rewards[:, -1] = scores
    torch.testing.assert_close(out, gae_for_policy(rewards, values, mask, gamma=1.0, lam=0.5)[0])


# ---- config --------------------------------------------------------------------------------------
def test_critic_enable_null_means_on_exactly_for_gae():
    config, _ = load_config([MODEL, "algorithm.adv_estimator=gae"])
    assert config.use_critic
    assert config.critic.optim.lr == 1e-5 and config.critic.cliprange_value == 0.5
    config, _ = load_config([MODEL, "algorithm.adv_estimator=rloo"])
    assert not config.use_critic


def _error(*overrides: str) -> str:
    config, _ = load_config([MODEL, *overrides])
    with pytest.raises(ValueError) as info:
        config.check()
    return str(info.value)


def test_gae_with_the_critic_off_says_what_to_set():
    assert _error("algorithm.adv_estimator=gae", "critic.enable=False") == (
        "algorithm.adv_estimator=gae learns from a critic's values but critic.enable=False: "
        "set critic.enable=null (on for gae) or True"
    )


def test_a_critic_beside_an_estimator_that_ignores_it_is_refused():
    assert _error("critic.enable=True", "actor_rollout_ref.rollout.n=2") == (
        "critic.enable=True with algorithm.adv_estimator=grpo: only gae uses a critic's "
        "values, so it would train for nothing; set algorithm.adv_estimator=gae, or "
        "critic.enable=null"
    )


def test_critic_batches_must_split_as_the_actors_do():
    gae = ("algorithm.adv_estimator=gae", "data.train_batch_size=8")
    assert _error(*gae, "critic.ppo_mini_batch_size=3") == (
        "data.train_batch_size=8 is not divisible by critic.ppo_mini_batch_size=3: make it a "
        "multiple"
    )
    assert _error(*gae, "critic.ppo_micro_batch_size_per_gpu=3") == (
        "8 samples per rank per critic mini-batch is not divisible by "
        "critic.ppo_micro_batch_size_per_gpu=3: make it a divisor (or set "
        "critic.use_dynamic_bsz=True)"
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "critic.cliprange_value=0",
            "critic.cliprange_value must be > 0 (a large value: no clipping), got 0",
        ),
        (
            "critic.loss_agg_mode=mean",
            "critic.loss_agg_mode='mean' is not supported; use one of token-mean, "
            "seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm",
        ),
        ("critic.ppo_epochs=0", "critic.ppo_epochs must be >= 1 (or null: the actor's), got 0"),
        ("trainer.critic_warmup=-1", "trainer.critic_warmup must be >= 0, got -1"),
        ("critic.optim.lr=-1", "critic.optim.lr must be > 0, got -1.0"),
        ("algorithm.lam=1.5", "algorithm.gamma=1.0 and algorithm.lam=1.5 must be in [0, 1]"),
    ],
)
def test_a_bad_critic_key_names_itself(override, message):
    with pytest.raises(ConfigError) as info:
        load_config([MODEL, "algorithm.adv_estimator=gae", override])
    assert message in str(info.value)


def test_unset_critic_keys_take_the_actors():
    config, _ = load_config(
        [
            MODEL,
            "algorithm.adv_estimator=gae",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.ppo_epochs=3",
            "critic.forward_micro_batch_size_per_gpu=8",
        ]
    )
    actor, model = config.actor_rollout_ref.actor, config.actor_rollout_ref.model
    spec = config.critic.spec(actor, model)
    assert (spec.micro_batch_size, spec.forward_micro_batch_size, spec.ppo_epochs) == (4, 8, 3)
    assert spec.model_path == model.path and spec.model.lora_rank == 0
    with pytest.raises(ValueError) as info:
        CriticConfig(checkpoint=CheckpointConfig(save_contents=["model", "hf_merged"]))
    assert "critic.checkpoint.save_contents has hf_merged" in str(info.value)


def test_older_checkpoints_lose_their_critic_folder_first(tmp_path):
    class Saver:
        def save_checkpoint(self, directory: str, contents: list[str]) -> None:
            os.makedirs(directory, exist_ok=True)

        def save_critic(self, directory: str, contents: list[str]) -> None:
            os.makedirs(f"{directory}/dcp", exist_ok=True)

    manager = CheckpointManager(tmp_path / "run", max_keep=3, max_critic_keep=1)
    for step in (1, 2, 3, 4):
        manager.save(step, Saver(), ["model"], {}, critic_contents=["model", "optimizer"])
    kept = sorted(p.name for p in (tmp_path / "run").iterdir() if p.name.startswith("global"))
    assert kept == ["global_step_2", "global_step_3", "global_step_4"]
    with_critic = [s for s in (2, 3, 4) if (manager.step_dir(s) / "critic" / "dcp").is_dir()]
    assert with_critic == [4]


def test_remax_is_reward_to_go_minus_the_greedy_baseline():
    from trainer.algos.estimators import AdvantageInputs, remax_advantages

    g = torch.Generator().manual_seed(4)
    mask = _spans(g, 4, 12)
    rewards = torch.randn(4, 12, generator=g, dtype=torch.float64) * mask
    baselines = torch.tensor([0.5, -0.25, 0.0, 1.0])
    weights = torch.tensor([1.0, 0.5, 0.5, 0.0])
    x = AdvantageInputs(
        scores=torch.zeros(4),
        mask=mask,
        group_ids=["a", "b", "b", "c"],
        token_rewards=rewards.float(),
        weights=weights,
        baselines=baselines,
    )
    got = remax_advantages(x)
    for i in range(4):
        for t in range(12):
            to_go = sum(float(rewards[i, j]) for j in range(t, 12) if mask[i, j])
            want = (to_go - float(baselines[i])) * float(weights[i]) if mask[i, t] else 0.0
            assert float(got[i, t]) == pytest.approx(want, abs=1e-5)
    with pytest.raises(ValueError) as info:
        remax_advantages(AdvantageInputs(torch.zeros(4), mask, ["a"] * 4))
    assert str(info.value).startswith("algorithm.adv_estimator=remax needs the greedy baselines")


def test_remax_is_refused_in_async_training():
    assert _error("algorithm.adv_estimator=remax", "async_training.enable=True") == (
        "algorithm.adv_estimator=remax rolls out one greedy response per prompt beside each "
        "step's samples, which the async stream does not: set async_training.enable=False, or "
        "use another estimator"
    )
