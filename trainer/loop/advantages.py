"""The advantage phase of a training step: the token rewards (scores on each last sampled
token, turn-level rewards, an optional KL penalty), then the estimator's advantages: GAE from
the critic's values (with the critic's returns), or ``algorithm.adv_estimator`` over the
step's groups (GiGPO's with each sample's turns and their anchor keys), plus the turn term of
``algorithm.turn_credit`` (``trainer.algos.turns``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentloop import RolloutBatch
from agentloop.records import SampleRecord
from trainer.algos import apply_kl_in_reward, compute_advantages, scores_to_token_rewards
from trainer.algos.gigpo import TurnSteps, anchor_keys, step_group_metrics
from trainer.algos.turns import turn_credit_term
from trainer.algos.value import gae_for_policy
from trainer.config.run import AlgorithmConfig
from trainer.rewards.manager import RewardOutput
from trainer.rewards.turn_rewards import turn_ends
from trainer.workers import TrainBatch

__all__ = [
    "StepRewards",
    "credit_groups",
    "gigpo_steps",
    "role_metrics",
    "sample_roles",
    "step_advantages",
]


@dataclass(frozen=True, slots=True)
class StepRewards:
    """What the advantages were computed from, for verl's metrics."""

    token_scores: torch.Tensor | None
    """[batch, response] the scores on each last sampled token plus the turn rewards; None:
    the scores alone."""
    token_rewards: torch.Tensor | None
    """``token_scores`` after the KL-in-reward penalty (None: the scores alone)."""


def step_advantages(
    algo: AlgorithmConfig,
    batch: TrainBatch,
    rollout: RolloutBatch,
    reward: RewardOutput,
    metrics: dict[str, float],
    *,
    use_critic: bool,
    baselines: torch.Tensor | None = None,
) -> StepRewards:
    """Set ``batch.advantages`` (and with a critic ``batch.returns``; its ``values`` must be
    set) from the step's rewards (``baselines``: remax's greedy scores); metrics go into
    ``metrics``."""
    mask, scores, weights = batch.response_mask, reward.scores, batch.weights
    roles = sample_roles(rollout)
    groups = credit_groups(rollout.uid, roles)
    metrics.update(role_metrics(roles, scores))
    token_scores = reward.token_rewards(mask)  # None: the scores alone
    credit = algo.turn_credit
    turn_rewards = reward.turn_rewards if credit.coef > 0 and not use_critic else None
    # with turn credit the estimator reads the scores alone: the turn term carries the rest
    token_rewards = token_scores if turn_rewards is None else None
    if algo.use_kl_in_reward:
        assert batch.ref_log_probs is not None and batch.old_log_probs is not None
        if token_rewards is None:
            token_rewards = scores_to_token_rewards(scores, mask)
        token_rewards, kl = apply_kl_in_reward(
            token_rewards,
            batch.old_log_probs,
            batch.ref_log_probs,
            mask,
            beta=algo.kl_ctrl.kl_coef,
            kind=algo.kl_penalty,
        )
        metrics["actor/reward_kl_penalty"] = kl
    if use_critic:  # GAE: advantages and the critic's targets together
        assert batch.values is not None
        if token_rewards is None:
            token_rewards = scores_to_token_rewards(scores, mask)
        batch.advantages, batch.returns = gae_for_policy(
            token_rewards, batch.values, mask, gamma=algo.gamma, lam=algo.lam, weights=weights
        )
        return StepRewards(token_scores, token_rewards)
    steps = None
    if algo.adv_estimator == "gigpo":
        steps = gigpo_steps(batch, rollout, reward.turn_rewards)
        metrics.update(step_group_metrics(steps, groups))
    batch.advantages = compute_advantages(
        algo.adv_estimator,
        scores,
        mask,
        groups,
        norm_by_std=algo.norm_adv_by_std_in_grpo,
        gamma=algo.gamma,
        token_rewards=token_rewards,
        weights=weights,
        baselines=baselines,
        turns=steps,
        step_advantage_w=algo.gigpo.step_advantage_w,
        gigpo_mode=algo.gigpo.mode,
    )
    if turn_rewards is not None:
        ends = [turn_ends(record, mask[i]) for i, record in enumerate(rollout.records)]
        term = turn_credit_term(
            turn_rewards,
            ends,
            mask,
            groups,
            gamma=credit.gamma,
            norm_by_std=credit.norm_by_std,
            weights=weights,
        )
        batch.advantages = batch.advantages + credit.coef * term
        picked = term[mask.bool()]
        if picked.numel():
            metrics["turn_reward/credit_abs_mean"] = float(picked.abs().mean())
    return StepRewards(token_scores, token_rewards)


def _named_states(record: SampleRecord, turns: int) -> list[str | None]:
    """Turn k's state as the environment named it: ``record.turn_states[k]`` (a simulated
    user's or the gateway's), else the last ``state_key`` of turn k - 1's tool calls."""
    named: list[str | None] = [None] * turns
    for call in record.calls:
        if call.state_key is not None and 0 <= call.turn < turns - 1:
            named[call.turn + 1] = call.state_key
    for k, state in enumerate(record.turn_states[:turns]):
        if state is not None:
            named[k] = state
    return named


def gigpo_steps(
    batch: TrainBatch, rollout: RolloutBatch, turn_rewards: torch.Tensor | None
) -> TurnSteps:
    """Each sample's model turns, their anchor keys (``trainer.algos.gigpo.anchor_keys``) and
    the turn rewards, for ``adv_estimator=gigpo``."""
    mask = batch.response_mask
    ends = [turn_ends(record, mask[i]) for i, record in enumerate(rollout.records)]
    p = batch.prompt_length
    prompts = [batch.input_ids[i, :p][batch.attention_mask[i, :p].bool()] for i in range(len(ends))]
    named = [_named_states(r, len(e)) for r, e in zip(rollout.records, ends, strict=True)]
    keys = anchor_keys(prompts, batch.responses, mask, ends, named)
    return TurnSteps(ends, keys, turn_rewards)


def sample_roles(rollout: RolloutBatch) -> list[str | None]:
    """Each sample's role: its record's (the agent's, or the gateway's from ``model``), else
    its row's ``role`` (top level or in ``extra_info``); None: none."""
    roles: list[str | None] = []
    for record, row in zip(rollout.records, rollout.rows, strict=True):
        role = record.role
        if role is None:
            extra = row.get("extra_info")
            role = row.get("role") or (extra.get("role") if isinstance(extra, dict) else None)
        roles.append(None if role is None else str(role))
    return roles


def credit_groups(uids: list[str], roles: list[str | None]) -> list[str]:
    """The groups the estimators normalise within: the prompt's uid, split by role where
    samples have one (a planner is compared with planners only)."""
    pairs = zip(uids, roles, strict=True)
    return [uid if role is None else f"{uid}\x1frole={role}" for uid, role in pairs]


def role_metrics(roles: list[str | None], scores: torch.Tensor) -> dict[str, float]:
    """``role/<name>/samples`` and ``role/<name>/reward/mean`` per role (none without roles)."""
    out: dict[str, float] = {}
    named = sorted({r for r in roles if r is not None})
    for name in named:
        picked = scores[[i for i, r in enumerate(roles) if r == name]].float()
        out[f"role/{name}/samples"] = float(picked.numel())
        out[f"role/{name}/reward/mean"] = float(picked.mean())
    return out
