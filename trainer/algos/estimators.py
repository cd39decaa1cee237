"""Advantage estimators under verl's names (``algorithm.adv_estimator``), one registry, open to
a user's own function by dotted path.

Every estimator takes an ``AdvantageInputs`` and returns token advantages [batch, response],
0 where ``mask`` is 0. R_i is sample i's score (with ``token_rewards``: their sum over its
sampled tokens), g(i) its group (same uid), n_g the group's size.

- ``grpo``, ``rloo``, ``reinforce_plus_plus``: see ``trainer.algos.core``.
- ``reinforce_plus_plus_baseline``: R_i - mean_g(i) R (0 for a group of one: no baseline is
  subtracted), on every sampled token, whitened over all sampled tokens of the batch
  (unbiased variance; longer samples weigh more).
- ``opo`` (optimal baseline): R_i - b_g with b_g = sum_j L_j R_j / sum_j L_j, L_j the sampled
  token count of sample j (a length-weighted mean; b = 0 for a group of one).
- ``grpo_passk`` (pass@k): only the best sample of each group learns, by the margin over the
  second best, A = (R_(1) - R_(2)) / (std_g + eps) (``norm_adv_by_std_in_grpo``; else the
  margin alone); every other sample 0. A group needs two samples or more; the order counts
  weight, so a session split into segments ranks once.
- ``gpg``: alpha (R_i - mean_g R), alpha = B / max(1, M) with B the batch's samples and M those
  whose score is not 0.
- ``remax``: A_it = G_it - b_g(i), G_it the sample's reward-to-go from token t (its score on
  every token when only the outcome is rewarded) and b the score of the prompt's greedy
  response (``baselines``: one greedy rollout per prompt each step); not whitened (ReMax).
- ``gigpo``: GRPO's episode term plus a step term over the turns of a group that acted on the
  same state (``trainer.algos.gigpo``; ``algorithm.gigpo.*``, ``algorithm.gamma`` per turn).
- ``gae``: PPO's generalized advantage estimation from the critic's ``values`` over the sampled
  tokens only (``trainer.algos.core.gae_advantages``; ``gamma``, ``lam``), whitened
  (``trainer.algos.value.gae_for_policy``). Needs a critic (``critic.enable``).

Sample weights (gateway segments, see ``core``): group statistics count each sample by its
weight, and each sample's advantage is then multiplied by it, as for ``grpo``.

A user's estimator: ``algorithm.adv_estimator=my_pkg.module:function`` where
``function(inputs: AdvantageInputs) -> Tensor[batch, response]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from trainer.algos.core import (
    grpo_advantages,
    masked_whiten,
    registered,
    reinforce_plus_plus_advantages,
    rloo_advantages,
    scores_to_token_rewards,
)
from trainer.algos.gigpo import TurnSteps, gigpo_advantages
from trainer.algos.groups import ONE_SAMPLE, group_index, group_stats, sample_weights

__all__ = [
    "ADV_ESTIMATORS",
    "AdvantageInputs",
    "compute_advantages",
    "estimator_for",
    "gpg_advantages",
    "grpo_passk_advantages",
    "opo_advantages",
    "reinforce_plus_plus_baseline_advantages",
    "remax_advantages",
]


@dataclass(frozen=True, slots=True)
class AdvantageInputs:
    """What an estimator may use. ``scores`` [batch]; ``mask`` [batch, response];
    ``token_rewards`` [batch, response] or None (the scores on each last sampled token);
    ``weights`` [batch] or None (all 1)."""

    scores: torch.Tensor
    mask: torch.Tensor
    group_ids: Sequence[str] | torch.Tensor
    token_rewards: torch.Tensor | None = None
    weights: torch.Tensor | None = None
    norm_by_std: bool = True
    gamma: float = 1.0
    values: torch.Tensor | None = None
    """[batch, response] the critic's values (``gae`` only)."""
    lam: float = 1.0
    baselines: torch.Tensor | None = None
    """[batch] the score of each sample's prompt's greedy response (``remax`` only)."""
    turns: TurnSteps | None = None
    """Each sample's turns, their anchor keys and turn rewards (``gigpo`` only)."""
    step_advantage_w: float = 1.0
    """``algorithm.gigpo.step_advantage_w``."""
    gigpo_mode: str = "mean_std_norm"
    """``algorithm.gigpo.mode``."""

    @property
    def rewards(self) -> torch.Tensor:
        """[batch, response] the token rewards, or the scores on each last sampled token."""
        if self.token_rewards is None:
            return scores_to_token_rewards(self.scores, self.mask)
        return self.token_rewards

    @property
    def outcome(self) -> torch.Tensor:
        """R: each sample's score, or with ``token_rewards`` their sum over sampled tokens."""
        if self.token_rewards is None:
            return self.scores.to(torch.float32)
        return (self.token_rewards * self.mask.to(self.token_rewards.dtype)).sum(-1).float()


def _on_tokens(per_sample: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return per_sample.unsqueeze(1) * mask.to(torch.float32)


def reinforce_plus_plus_baseline_advantages(x: AdvantageInputs) -> torch.Tensor:
    scores = x.outcome
    w = sample_weights(x.weights, scores)
    count, mean, _ = group_stats(scores, group_index(x.group_ids), w)
    centred = scores - torch.where(count > ONE_SAMPLE, mean, torch.zeros_like(mean))
    kept = x.mask * (w > 0).unsqueeze(1)
    return masked_whiten(_on_tokens(centred, x.mask), kept) * w.unsqueeze(1)


def opo_advantages(x: AdvantageInputs) -> torch.Tensor:
    scores = x.outcome
    w = sample_weights(x.weights, scores)
    lengths = x.mask.to(torch.float32).sum(-1)
    index = group_index(x.group_ids)
    count, _, _ = group_stats(scores, index, w)
    groups = int(index.max()) + 1 if index.numel() else 0
    total = scores.new_zeros(groups).index_add_(0, index, w * lengths * scores)
    norm = scores.new_zeros(groups).index_add_(0, index, w * lengths)
    baseline = (total / norm.clamp(min=1e-12))[index]
    baseline = torch.where(count > ONE_SAMPLE, baseline, torch.zeros_like(baseline))
    return _on_tokens((scores - baseline) * w, x.mask)


def grpo_passk_advantages(x: AdvantageInputs, eps: float = 1e-6) -> torch.Tensor:
    scores = x.outcome
    w = sample_weights(x.weights, scores)
    index = group_index(x.group_ids)
    if bool((torch.bincount(index) < 2).any()):
        raise ValueError(
            "algorithm.adv_estimator=grpo_passk needs two samples or more per prompt "
            "(actor_rollout_ref.rollout.n >= 2)"
        )
    _, _, std = group_stats(scores, index, w)
    adv = torch.zeros_like(scores)
    for g in torch.unique(index).tolist():
        members = torch.nonzero((index == g) & (w > 0)).squeeze(1)
        if float(w[members].sum()) <= ONE_SAMPLE:  # one session or less left: no margin
            continue
        # Order statistics by weight: a session split into k segments of weight 1/k is one
        # sample, so the best is the top unit of weight and the second the next one.
        order = members[torch.argsort(scores[members], descending=True, stable=True)]
        reached = torch.cumsum(w[order], 0)
        best = order[reached - w[order] < 1 - 1e-4]
        second = order[int(torch.nonzero(reached > 1 + 1e-4)[0])]
        margin = scores[order[0]] - scores[second]
        if x.norm_by_std:
            margin = margin / (std[order[0]] + eps)
        adv[best] = margin
    return _on_tokens(adv * w, x.mask)


def gpg_advantages(x: AdvantageInputs) -> torch.Tensor:
    scores = x.outcome
    w = sample_weights(x.weights, scores)
    count, mean, _ = group_stats(scores, group_index(x.group_ids), w)
    alpha = float(w.sum()) / max(1.0, float(w[scores != 0].sum()))
    mean = torch.where(count > ONE_SAMPLE, mean, torch.zeros_like(mean))
    return _on_tokens(alpha * (scores - mean) * w, x.mask)


def _grpo(x: AdvantageInputs) -> torch.Tensor:
    return _on_tokens(
        grpo_advantages(x.outcome, x.group_ids, x.norm_by_std, weights=x.weights), x.mask
    )


def _rloo(x: AdvantageInputs) -> torch.Tensor:
    return _on_tokens(rloo_advantages(x.outcome, x.group_ids, x.weights), x.mask)


def _reinforce_plus_plus(x: AdvantageInputs) -> torch.Tensor:
    rewards = x.rewards
    return reinforce_plus_plus_advantages(rewards, x.mask, x.gamma, x.weights)


def remax_advantages(x: AdvantageInputs) -> torch.Tensor:
    if x.baselines is None:
        raise ValueError(
            "algorithm.adv_estimator=remax needs the greedy baselines: the trainer rolls out "
            "one greedy response per prompt each step (sync training only)"
        )
    rewards = x.rewards
    m = x.mask.to(torch.float32)
    to_go = (rewards * m).flip(-1).cumsum(-1).flip(-1)  # reward-to-go from each position
    w = sample_weights(x.weights, x.scores.to(torch.float32))
    baselines = x.baselines.to(torch.float32).unsqueeze(1)
    return (to_go - baselines) * m * w.unsqueeze(1)


def _gae(x: AdvantageInputs) -> torch.Tensor:
    from trainer.algos.value import gae_for_policy

    if x.values is None:
        raise ValueError(
            "algorithm.adv_estimator=gae needs the critic's values: set critic.enable=null "
            "(on for gae) or True"
        )
    rewards = x.rewards
    return gae_for_policy(rewards, x.values, x.mask, gamma=x.gamma, lam=x.lam, weights=x.weights)[0]


def _gigpo(x: AdvantageInputs) -> torch.Tensor:
    if x.turns is None:
        raise ValueError(
            "algorithm.adv_estimator=gigpo needs each sample's turns and their anchor keys "
            "(the trainer passes them; a direct call passes turns=TurnSteps(...))"
        )
    return gigpo_advantages(
        x.outcome,
        x.scores,
        x.mask,
        x.group_ids,
        x.turns,
        step_advantage_w=x.step_advantage_w,
        mode=x.gigpo_mode,
        gamma=x.gamma,
        weights=x.weights,
    )


_ESTIMATORS: dict[str, Callable[[AdvantageInputs], torch.Tensor]] = {
    "grpo": _grpo,
    "rloo": _rloo,
    "reinforce_plus_plus": _reinforce_plus_plus,
    "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline_advantages,
    "opo": opo_advantages,
    "grpo_passk": grpo_passk_advantages,
    "gpg": gpg_advantages,
    "remax": remax_advantages,
    "gigpo": _gigpo,
    "gae": _gae,
}
ADV_ESTIMATORS = tuple(_ESTIMATORS)
GROUPED = ("grpo", "rloo", "reinforce_plus_plus_baseline", "opo", "grpo_passk", "gpg", "gigpo")
"""The estimators whose baseline is the sample's group: a group that scored alike has no
signal for them (``algorithm.filter_groups``)."""


def estimator_for(name: str) -> Callable[[AdvantageInputs], torch.Tensor]:
    """The registered estimator ``name``, or a user's function at a dotted path."""
    return registered(name, _ESTIMATORS, "algorithm.adv_estimator")


def compute_advantages(
    estimator: str,
    scores: torch.Tensor,
    mask: torch.Tensor,
    group_ids: Sequence[str],
    *,
    norm_by_std: bool = True,
    gamma: float = 1.0,
    token_rewards: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    lam: float = 1.0,
    baselines: torch.Tensor | None = None,
    turns: TurnSteps | None = None,
    step_advantage_w: float = 1.0,
    gigpo_mode: str = "mean_std_norm",
) -> torch.Tensor:
    """Token-level advantages [batch, response] (0 where ``mask`` is 0) of ``estimator``.

    ``token_rewards`` (e.g. scores with a per-token KL penalty) replace the scores when given:
    ``reinforce_plus_plus`` uses them per token, the others their per-sample sum.
    ``weights`` [batch]: each sample's weight (None: all 1; see ``trainer.algos.core``).
    ``values``/``lam``: the critic's values and GAE's lambda (``gae``); ``baselines``: the
    greedy responses' scores (``remax``); ``turns``, ``step_advantage_w``, ``gigpo_mode``:
    ``gigpo``'s."""
    inputs = AdvantageInputs(
        scores=scores,
        mask=mask,
        group_ids=group_ids,
        token_rewards=token_rewards,
        weights=weights,
        norm_by_std=norm_by_std,
        gamma=gamma,
        values=values,
        lam=lam,
        baselines=baselines,
        turns=turns,
        step_advantage_w=step_advantage_w,
        gigpo_mode=gigpo_mode,
    )
    out = estimator_for(estimator)(inputs)
    if out.shape != mask.shape:
        raise ValueError(
            f"algorithm.adv_estimator={estimator}: returned shape {list(out.shape)}, the "
            f"response mask is {list(mask.shape)}"
        )
    return out * mask.to(out.dtype)
