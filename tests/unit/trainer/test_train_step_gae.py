"""``RayPPOTrainer.train_step`` with PPO + GAE, in one process on the stand-ins of
``test_train_step`` plus a one-process critic running the real critic math on a tiny value
model: values before the advantages, GAE from them, the critic's update on the returns before
the actor's, the critic's metrics under verl's names, and ``trainer.critic_warmup``. And
turn-level rewards reaching the advantages: per token through GAE, through
``algorithm.turn_credit`` for GRPO."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers

from tests.unit.trainer.test_train_step import (  # noqa: F401 - fixtures
    PROMPTS,
    STATS,
    OneProcessPolicy,
    make_run,
)
from trainer.algos import compute_advantages, scores_to_token_rewards
from trainer.algos.turns import turn_credit_term
from trainer.algos.value import explained_variance, gae_for_policy
from trainer.config.actor import ActorConfig, OptimConfig
from trainer.config.critic import CriticConfig
from trainer.config.schema import Config
from trainer.workers import TrainBatch
from trainer.workers.batch import pad_for_ranks
from trainer.workers.critic_math import update_critic, values_in_micro_batches


class OneProcessActorCritic(OneProcessPolicy):
    """``OneProcessPolicy`` with a critic: a tiny random Qwen3 value model (one output per
    token) run by the real critic math, as ``FSDPWorker.critic`` does on one rank."""

    def __init__(self, model: torch.nn.Module, actor: ActorConfig, events: list[str]) -> None:
        super().__init__(model, actor, events)
        torch.manual_seed(1)
        config = transformers.Qwen3Config(**{**model.config.to_dict(), "num_labels": 1})
        config.classifier_dropout = 0.0
        self.critic = transformers.Qwen3ForTokenClassification(config).float()
        self.critic_optimizer = torch.optim.AdamW(self.critic.parameters(), lr=1e-3)
        self.critic_updates: list[dict[str, Any]] = []

    def memory_stats(self) -> list[dict[str, float]]:
        from trainer.workers.model_state import state_mb

        trainable, optim = state_mb(self.critic, self.critic_optimizer)
        (rank,) = super().memory_stats()
        return [rank | {"critic_trainable_mb": trainable, "critic_optimizer_mb": optim}]

    def compute_values(self, batch: TrainBatch) -> torch.Tensor:
        self.events.append("values")
        return values_in_micro_batches(self.critic, batch, micro_batch_size=4)

    def update_critic(self, batch: TrainBatch, mini_batches: int, seed: int = 0) -> dict:
        self.events.append("update_critic")
        self.critic_updates.append({"batch": batch, "mini_batches": mini_batches})
        padded, _, per_mini = pad_for_ranks(batch, 1, mini_batches)
        spec = CriticConfig(optim=OptimConfig(lr=1e-3)).spec(self.actor, self.model_config)
        return update_critic(
            self.critic, self.critic_optimizer, padded, spec, samples_per_mini_batch=per_mini
        )


def gae(**algorithm: Any):
    def edit(cfg: Config) -> None:
        cfg.algorithm.adv_estimator = "gae"
        cfg.algorithm.gamma = algorithm.get("gamma", 1.0)
        cfg.algorithm.lam = algorithm.get("lam", 0.95)
        cfg.trainer.critic_warmup = algorithm.get("critic_warmup", 0)
        cfg.critic = CriticConfig(ppo_mini_batch_size=PROMPTS)

    return edit


@pytest.fixture()
def gae_run(make_run, monkeypatch):  # noqa: F811 - the imported fixture
    def make(**algorithm: Any):
        run = make_run(edit=gae(**algorithm), policy=OneProcessActorCritic)
        run.policy.model_config = run.config.actor_rollout_ref.model
        return run

    return make


def test_a_gae_step_computes_values_then_advantages_then_updates_critic_then_actor(gae_run):
    run = gae_run(gamma=0.99, lam=0.9)
    assert run.trainer.use_critic
    metrics = run.trainer.train_step(1)
    assert run.events == [
        "rollout",
        "release_servers",
        "reward",
        "old_log_prob",
        "values",
        "update_critic",
        "update",
        "weight_push",
    ]
    rollout, scores = run.rollout.batches[0], run.scored[0].scores
    mask = rollout.response_mask
    (critic_update,) = run.policy.critic_updates
    batch: TrainBatch = critic_update["batch"]
    assert batch.values is not None and batch.returns is not None
    # GAE over the sampled tokens from the values the critic gave before its update
    rewards = scores_to_token_rewards(scores, mask)
    advantages, returns = gae_for_policy(rewards, batch.values, mask, gamma=0.99, lam=0.9)
    torch.testing.assert_close(batch.advantages, advantages)
    torch.testing.assert_close(batch.returns, returns)
    (update,) = run.policy.updates
    torch.testing.assert_close(update["batch"].advantages, advantages)
    # one critic mini-batch (critic.ppo_mini_batch_size = all prompts), two for the actor
    assert critic_update["mini_batches"] == 1 and update["mini_batches"] == PROMPTS // 2
    picked = mask.bool()
    for name, tensor in (("values", batch.values), ("returns", returns)):
        assert metrics[f"critic/{name}/mean"] == pytest.approx(float(tensor[picked].mean()))
        assert metrics[f"critic/{name}/max"] == pytest.approx(float(tensor[picked].max()))
    assert metrics["critic/vf_explained_var"] == pytest.approx(
        explained_variance(batch.values, returns, mask)
    )
    for key in ("vf_loss", "vf_clipfrac", "vpred_mean", "grad_norm", "lr"):
        assert f"critic/{key}" in metrics, key
    assert metrics["critic/vf_loss"] > 0
    assert metrics["timing_s/values"] >= 0 and metrics["timing_s/update_critic"] > 0
    assert {f"critic/advantages/{stat}" for stat in STATS} <= set(metrics)
    # the critic's memory beside the actor's: the same architecture, Adam's two moments
    assert metrics["perf/critic_state_mb"] > 0 and metrics["perf/actor_state_mb"] > 0


def test_critic_warmup_trains_the_critic_alone_for_that_many_steps(gae_run):
    run = gae_run(critic_warmup=2)
    first = run.trainer.train_step(1)
    second = run.trainer.train_step(2)
    assert run.policy.updates == [] and len(run.policy.critic_updates) == 2
    for metrics in (first, second):
        assert "actor/pg_loss" not in metrics and "timing_s/update_actor" not in metrics
        assert "critic/vf_loss" in metrics
    assert all(torch.equal(v, run.initial[k]) for k, v in run.model.state_dict().items())
    third = run.trainer.train_step(3)
    assert len(run.policy.updates) == 1 and "actor/pg_loss" in third


# ---- turn-level rewards reach the loss ----------------------------------------------------------
TURN_REWARD = (
    "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
    "    n = len(solution_str)\n"
    "    return {'score': n / 10, 'turn_scores': [(n % 3) / 4, -(n % 2) / 8]}\n"
)


def test_turn_scores_reach_gae_per_token(make_run):  # noqa: F811 - the imported fixture
    run = make_run(reward=TURN_REWARD, edit=gae(), policy=OneProcessActorCritic)
    run.policy.model_config = run.config.actor_rollout_ref.model
    metrics = run.trainer.train_step(1)
    rollout, reward = run.rollout.batches[0], run.scored[0]
    mask = rollout.response_mask
    assert reward.turn_rewards is not None and reward.turn_rewards.abs().sum() > 0
    # each sample's turn rewards sit on the last token of its two model turns
    for i, record in enumerate(rollout.records):
        placed = torch.nonzero(reward.turn_rewards[i]).flatten().tolist()
        assert set(placed) <= set(record.turn_ends)
    (critic_update,) = run.policy.critic_updates
    batch = critic_update["batch"]
    token_rewards = scores_to_token_rewards(reward.scores, mask) + reward.turn_rewards
    advantages, returns = gae_for_policy(token_rewards, batch.values, mask, gamma=1.0, lam=0.95)
    torch.testing.assert_close(batch.advantages, advantages)
    torch.testing.assert_close(batch.returns, returns)
    assert "turn_reward/mean" in metrics and "turn_reward/first_turn_mean" in metrics


@pytest.mark.parametrize("coef", [0.0, 0.5])
def test_turn_credit_adds_the_turn_term_to_grpo(make_run, coef):  # noqa: F811
    def edit(cfg: Config) -> None:
        cfg.algorithm.turn_credit.coef = coef

    run = make_run(reward=TURN_REWARD, edit=edit)
    run.trainer.train_step(1)
    rollout, reward = run.rollout.batches[0], run.scored[0]
    mask = rollout.response_mask
    (update,) = run.policy.updates
    token_rewards = scores_to_token_rewards(reward.scores, mask) + reward.turn_rewards
    if coef == 0:  # turn rewards only add to each sample's outcome
        expected = compute_advantages(
            "grpo", reward.scores, mask, rollout.uid, token_rewards=token_rewards
        )
    else:  # the outcome advantage of the scores alone, plus coef x the turn term
        ends = [list(r.turn_ends) for r in rollout.records]
        expected = compute_advantages("grpo", reward.scores, mask, rollout.uid)
        expected = expected + coef * turn_credit_term(reward.turn_rewards, ends, mask, rollout.uid)
    assert torch.equal(update["batch"].advantages, expected)


# ---- remax: a greedy rollout per prompt as the baseline ------------------------------------------
def test_remax_rolls_out_one_greedy_response_per_prompt_as_the_baseline(make_run):  # noqa: F811
    def edit(cfg: Config) -> None:
        cfg.algorithm.adv_estimator = "remax"

    run = make_run(edit=edit)
    metrics = run.trainer.train_step(1)
    sampled, greedy = run.rollout.batches
    assert run.events[:4] == ["rollout", "rollout", "release_servers", "reward"]
    assert len(greedy) == PROMPTS and len(sampled) == PROMPTS * 2
    assert set(greedy.uid) == set(sampled.uid)  # the same prompts, one greedy response each
    assert run.rollout.params[0] is None  # the rollout's own sampling
    assert run.rollout.params[1]["temperature"] == 0.0
    reward, greedy_reward = run.scored
    baseline = dict(zip(greedy.uid, greedy_reward.scores.tolist(), strict=True))
    mask = sampled.response_mask
    expected = torch.zeros(mask.shape)
    for i, uid in enumerate(sampled.uid):  # the score on every sampled token, minus b
        expected[i] = (float(reward.scores[i]) - baseline[uid]) * mask[i]
    (update,) = run.policy.updates
    torch.testing.assert_close(update["batch"].advantages, expected)
    assert metrics["remax/baseline_mean"] == pytest.approx(sum(baseline.values()) / PROMPTS)
    assert metrics["timing_s/gen_max"] >= 0
