"""RL math on padded response tensors shared by the estimators and policy losses: GRPO, RLOO
and REINFORCE++ advantages, loss aggregation, KL penalties and entropy. All tensors are
``[batch, response_length]`` unless noted; ``mask`` is the response loss mask (1 on sampled
tokens, 0 on tool/template/padding).

Advantage estimators (outcome rewards: one score per sample):
- ``grpo``: A_i = (s_i - mean_g) / (std_g + eps) within the sample's group g (same uid), std
  unbiased as ``torch.std``; ``norm_by_std=False`` gives A_i = s_i - mean_g (Dr. GRPO). A group
  of one sample has nothing to compare with: A = 0.
- ``rloo``: A_i = s_i - mean_{j != i} s_j = n/(n-1) (s_i - mean_g); groups of one: 0.
- ``reinforce_plus_plus``: returns G_t = r_t + gamma G_{t+1} over the response (the score is
  the reward of the last sampled token), then whitened over all masked tokens of the batch.
Deviation from verl: verl gives a size-1 GRPO group A = s_i (mean 0, std 1); here it is 0,
since a lone sample carries no relative signal.

Sample weights (``SampleRecord.weight``; all 1 unless a gateway session split into several
training samples). A session of k segments gives k samples of weight 1/k (or 1 each with
``gateway.segment_weight=segment``), a dropped failed session weight 0. With weights w:
- group statistics are weighted: the group's count is W_g = sum w_i, its mean
  sum w_i s_i / W_g, its std sqrt(sum w_i (s_i - mean_g)^2 / (W_g - 1)); RLOO's baseline
  leaves out one unit of weight, A_i = W_g / (W_g - 1) (s_i - mean_g). So k segments of
  weight 1/k with the session's score give exactly the statistics of one sample, and weight
  0 leaves a sample out of them. A group weighing one sample or less gets A = 0.
- each sample's advantage is then multiplied by its weight (``reinforce_plus_plus``: its
  whitened returns, whitened over the tokens of samples of weight > 0). For the PPO clipped
  term, scaling A by w > 0 is the same as weighting that sample's loss by w: max and min
  commute with a positive factor, so the clipped and dual-clipped losses are w times the
  unweighted ones (and the clip fractions do not change). So a session's segments weigh one
  session in the policy gradient. KL and entropy terms stay per token (a segment's tokens
  are real tokens of the policy).
- ``seq-mean-*`` loss aggregation divides by the summed weights of the sequences instead of
  their number (``agg_denominator``), so a session counts once there as well.
With all weights 1 every result is bit-identical to the unweighted formulas.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch

from servers.user_code import load_object
from trainer.algos.groups import ONE_SAMPLE, group_index, group_stats, sample_weights

__all__ = [
    "LOSS_AGG_MODES",
    "KL_TYPES",
    "agg_denominator",
    "agg_loss",
    "agg_numerator",
    "apply_kl_in_reward",
    "entropy_from_logits",
    "gae_advantages",
    "grpo_advantages",
    "import_callable",
    "registered",
    "kl_penalty",
    "masked_whiten",
    "reinforce_plus_plus_advantages",
    "rloo_advantages",
    "scores_to_token_rewards",
]

LossAggMode = Literal[
    "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]
LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
KL_TYPES = ("kl", "abs", "mse", "low_var_kl")


def grpo_advantages(
    scores: torch.Tensor,
    group_ids: Sequence[str] | torch.Tensor,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """GRPO outcome advantages, one per sample: ``(s - mean_g) / (std_g + eps)`` with the
    unbiased std of the sample's group (``s - mean_g`` when ``norm_by_std`` is False); 0 for
    a group of one. ``weights``: see the module docstring. ``scores``: [batch] -> [batch]."""
    scores = scores.to(torch.float32)
    w = sample_weights(weights, scores)
    count, mean, std = group_stats(scores, group_index(group_ids), w)
    adv = scores - mean
    if norm_by_std:
        adv = adv / (std + eps)
    return torch.where(count > ONE_SAMPLE, adv, torch.zeros_like(adv)) * w


def rloo_advantages(
    scores: torch.Tensor,
    group_ids: Sequence[str] | torch.Tensor,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Leave-one-out baseline: ``s_i - mean_{j != i} s_j``; 0 for a group of one. [batch].
    ``weights``: see the module docstring."""
    scores = scores.to(torch.float32)
    w = sample_weights(weights, scores)
    count, mean, _ = group_stats(scores, group_index(group_ids), w)
    adv = (scores - mean) * count / (count - 1).clamp(min=1)
    return torch.where(count > ONE_SAMPLE, adv, torch.zeros_like(adv)) * w


def scores_to_token_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Place each sample's score on its last sampled token: [batch] -> [batch, response]."""
    rewards = torch.zeros(mask.shape, dtype=torch.float32)
    positions = torch.arange(mask.shape[1]).expand_as(mask)
    last = torch.where(mask.bool(), positions, torch.full_like(positions, -1)).max(dim=1).values
    rows = torch.nonzero(last >= 0).squeeze(1)
    rewards[rows, last[rows]] = scores.to(torch.float32)[rows]
    return rewards


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    m = mask.to(values.dtype)
    n = m.sum()
    if float(n) == 0:  # nothing to whiten (every sample dropped)
        return torch.zeros_like(values)
    mean = (values * m).sum() / n
    var = (((values - mean) ** 2) * m).sum() / (n - 1).clamp(min=1)
    return (values - mean) * torch.rsqrt(var + eps) * m


def reinforce_plus_plus_advantages(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Discounted returns over sampled tokens (tool tokens carry nothing and are skipped),
    whitened over every masked token of the batch. [batch, response] -> same.
    ``weights`` [batch]: whitened over the samples of weight > 0 only, then each sample's
    advantages times its weight."""
    returns = torch.zeros_like(token_rewards, dtype=torch.float32)
    running = torch.zeros(token_rewards.shape[0], dtype=torch.float32)
    m = mask.to(torch.float32)
    for t in reversed(range(token_rewards.shape[1])):  # over positions, vectorised over batch
        running = token_rewards[:, t] + gamma * running * m[:, t] + running * (1 - m[:, t])
        returns[:, t] = running * m[:, t]
    if weights is None:
        return masked_whiten(returns, mask)
    w = sample_weights(weights, running)
    return masked_whiten(returns, mask * (w > 0).unsqueeze(1)) * w.unsqueeze(1)


def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over the sampled tokens only: (advantages, returns), [batch, response] each, 0
    where ``mask`` is 0.

    Observation tokens (mask 0: tool output, user and interaction turns, template) are no
    steps of the policy: the recursion skips them, so a sampled token's next value is that of
    the next *sampled* token (0 after the last) and no TD error is taken on them:
    delta_t = r_t + gamma V_next(t) - V_t, A_t = delta_t + gamma lam A_next(t), returns A + V.
    The same as standard GAE on each sample with its observation tokens cut out. Rewards on
    observation tokens are not read (turn rewards go on their turn's last sampled token)."""
    rewards = token_rewards.to(torch.float32)
    values = values.to(torch.float32)
    sampled = mask.bool()
    advantages = torch.zeros_like(rewards)
    next_value = rewards.new_zeros(rewards.shape[0])
    next_adv = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[1])):  # over positions, vectorised over the batch
        here = sampled[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        advantages[:, t] = torch.where(here, adv, torch.zeros_like(adv))
        next_value = torch.where(here, values[:, t], next_value)
        next_adv = torch.where(here, adv, next_adv)
    returns = (advantages + values) * sampled
    return advantages, returns


def agg_loss(
    loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Reduce a per-token loss [batch, response] under ``mask`` to a scalar:

    - ``token-mean``: sum(L * m) / sum(m)  (every sampled token weighs the same);
    - ``seq-mean-token-sum``: mean_i sum_t L_it m_it;
    - ``seq-mean-token-mean``: mean over sequences with tokens of (sum_t L_it m_it / sum_t m_it);
    - ``seq-mean-token-sum-norm``: sum_i sum_t L_it m_it / response_length (Dr. GRPO: a
      constant normaliser, no length bias).

    ``weights`` [batch]: the ``seq-mean-*`` means count each sequence by its weight (a
    session's segments count once); the numerator is not weighted (the advantages are).
    """
    denominator = agg_denominator(mask, mode, loss_mat.shape[-1], weights)
    return agg_numerator(loss_mat, mask, mode) / max(denominator, 1.0)


def agg_numerator(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """The part of ``agg_loss`` that adds up over micro-batches and ranks: ``agg_loss`` is
    sum(numerators) / ``agg_denominator`` of the whole mini-batch."""
    m = mask.to(loss_mat.dtype)
    if mode == "seq-mean-token-mean":
        tokens = m.sum(dim=-1)
        return ((loss_mat * m).sum(dim=-1) / tokens.clamp(min=1)).sum()
    if mode in LOSS_AGG_MODES:
        return (loss_mat * m).sum()
    raise ValueError(
        f"loss_agg_mode={mode!r} is not supported; use one of {', '.join(LOSS_AGG_MODES)}"
    )


def agg_denominator(
    mask: torch.Tensor, mode: str, response_length: int, weights: torch.Tensor | None = None
) -> float:
    """Normaliser of ``agg_loss`` for ``mask`` (sum it over micro-batches and ranks, except the
    constant ``response_length`` of ``seq-mean-token-sum-norm``). ``weights`` [batch]: the
    ``seq-mean-*`` modes count each sequence by its weight (None: 1 each)."""
    if mode == "token-mean":
        return float(mask.sum())
    if mode == "seq-mean-token-sum":
        return float(mask.shape[0]) if weights is None else float(weights.sum())
    if mode == "seq-mean-token-mean":
        has_tokens = mask.sum(dim=-1) > 0
        if weights is None:
            return float(has_tokens.sum())
        return float(weights[has_tokens].sum())
    if mode == "seq-mean-token-sum-norm":
        return float(response_length)
    raise ValueError(
        f"loss_agg_mode={mode!r} is not supported; use one of {', '.join(LOSS_AGG_MODES)}"
    )


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate of the policy from the reference:
    ``kl`` (k1): logp - logp_ref; ``abs``: |logp - logp_ref|; ``mse`` (k2): 0.5 (logp - logp_ref)^2;
    ``low_var_kl`` (k3): exp(logp_ref - logp) - (logp_ref - logp) - 1, clamped to [-10, 10]."""
    diff = log_prob - ref_log_prob
    if kind == "kl":
        return diff
    if kind == "abs":
        return diff.abs()
    if kind == "mse":
        return 0.5 * diff.square()
    if kind == "low_var_kl":
        k = -diff
        return torch.clamp(torch.exp(k) - k - 1, -10.0, 10.0)
    raise ValueError(f"KL type {kind!r} is not supported; use one of {', '.join(KL_TYPES)}")


def apply_kl_in_reward(
    token_rewards: torch.Tensor,
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    mask: torch.Tensor,
    *,
    beta: float,
    kind: str = "kl",
) -> tuple[torch.Tensor, float]:
    """Token rewards minus ``beta`` times the per-token KL (on sampled tokens only); returns
    (rewards, mean KL per sequence)."""
    kl = kl_penalty(log_prob, ref_log_prob, kind) * mask.to(log_prob.dtype)
    seq_kl = kl.sum(-1) / mask.sum(-1).clamp(min=1)
    return token_rewards - beta * kl, float(seq_kl.mean())


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax over the last dim: logsumexp(z) - sum softmax(z) z."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def import_callable(path: str, key: str) -> Any:
    """The function at ``path`` (``package.module:function``, ``package.module.function`` or
    ``file.py:function``), for a config ``key`` that names a user's own estimator or loss."""
    return load_object(path, key=key, need_callable=True)


def registered(name: str, table: dict[str, Any], key: str) -> Any:
    """``table[name]``, or a user's function when ``name`` is a dotted path; else an error
    naming ``key`` and the registered names."""
    if name in table:
        return table[name]
    if "." in name or ":" in name:
        return import_callable(name, key)
    raise ValueError(
        f"{key}={name!r} is not supported; use one of {', '.join(table)}, or a function of "
        "your own as package.module:function"
    )
