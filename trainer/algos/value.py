"""The critic's math: PPO's clipped value loss, GAE advantages ready for the policy loss, and
the value function's explained variance (all on padded [batch, response] tensors).

Value loss (PPO, as verl computes it): with V_old the values the advantages were computed
from and R the returns, the new prediction V counts in two ways,
    L1 = (V - R)^2,   L2 = (clip(V, V_old - c, V_old + c) - R)^2,
and the token's loss is 0.5 max(L1, L2) (``critic.cliprange_value`` = c). ``clipfrac`` is the
share of sampled tokens where L2 > L1 (the clip took the gradient away).
"""

from __future__ import annotations

import torch

from trainer.algos.core import gae_advantages, masked_whiten
from trainer.algos.groups import sample_weights

__all__ = ["explained_variance", "gae_for_policy", "value_loss_tokens"]


def value_loss_tokens(
    vpreds: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, cliprange: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped value loss 0.5 max(L1, L2) and where the clipped term won (L2 > L1),
    [batch, response] each (see the module docstring; mask them outside)."""
    clipped = old_values + (vpreds - old_values).clamp(-cliprange, cliprange)
    unclipped_loss = (vpreds - returns).square()
    clipped_loss = (clipped - returns).square()
    return 0.5 * torch.maximum(unclipped_loss, clipped_loss), clipped_loss > unclipped_loss


def gae_for_policy(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float,
    lam: float,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns) [batch, response]: ``gae_advantages`` over the sampled tokens,
    the advantages whitened over the sampled tokens of samples of weight > 0 (as verl
    whitens GAE advantages) and then times each sample's weight (a gateway session's
    segments weigh one session); the returns (the critic's targets) unwhitened."""
    advantages, returns = gae_advantages(token_rewards, values, mask, gamma, lam)
    if weights is None:
        return masked_whiten(advantages, mask), returns
    w = sample_weights(weights, advantages[:, 0])
    kept = mask * (w > 0).unsqueeze(1)
    return masked_whiten(advantages, kept) * w.unsqueeze(1), returns


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R) over the sampled tokens: 1 is a perfect value function, 0 one
    no better than a constant, below 0 worse (NaN-free: 0 when the returns do not vary)."""
    picked = mask.bool()
    r, v = returns[picked].double(), values[picked].double()
    if r.numel() < 2:
        return 0.0
    var = r.var()
    if float(var) == 0.0:
        return 0.0
    return float(1.0 - (r - v).var() / var)
