"""Policy losses under verl's names (``actor_rollout_ref.actor.policy_loss.loss_mode``), one
registry, open to a user's own function by dotted path.

A loss gives per-token losses [batch, response] and, summed over the sampled tokens, its
counts (``pg_clipfrac``, ``pg_clipfrac_lower``, ``ppo_kl``; divided by the token count for the
metrics), and may fix the aggregation its definition needs (the function's ``agg_mode``
attribute, returned again in ``PolicyLossOut.agg_mode``; None: ``loss_agg_mode``).
delta = logp - logp_old, r = exp(delta), A the token's advantage, sg() no gradient.

- ``vanilla``: PPO's clipped surrogate, asymmetric clip and dual clip (``policy_loss_tokens``).
- ``gspo``: the sequence's ratio s_i = exp(mean_t delta) on every token, with the token's own
  gradient: rho = exp(logp - sg(logp) + sg(log s_i)) (log rho capped at 10);
  L = max(-A rho, -A clip(rho, 1 - low, 1 + high)); aggregated seq-mean-token-mean.
- ``sapo``: a soft gate in place of the clip, f(r) = 4/tau sigmoid(tau (r - 1)) (slope 1 at
  r = 1), tau = ``tau_pos`` where A > 0 else ``tau_neg``; L = -f(r) A; seq-mean-token-mean.
- ``gpg``: plain policy gradient, L = -A logp (no ratio).
- ``clip_cov``: PPO's clip without dual clip, and of the tokens it left unclipped whose
  covariance (A - mean A)(logp - mean logp) lies in (``clip_cov_lb``, ``clip_cov_ub``), a
  random ``clip_cov_ratio`` share of the sampled tokens (at least one) gets no loss and no
  gradient; ``pg_clipfrac`` counts those tokens.
- ``kl_cov``: L = -A r, plus ``ppo_kl_coef`` |delta| on the ``kl_cov_ratio`` share (at least
  one) of sampled tokens of highest covariance; ``ppo_kl`` is the mean |delta|.
- ``geo_mean`` (GMPO): per sequence, rho_i = exp(mean_t delta*) with delta clipped in log
  space to [-low, high] on the side the advantage's sign selects (A > 0: min(delta, clipped),
  A < 0: max), and L_i = -mean_t(A) rho_i; the mean over the micro-batch's rows.
- ``cispo``: L = -sg(clip(r, 1 - low, 1 + high)) A logp: the clipped weight carries no gradient.

Means over tokens (covariances, sequence means) are over the micro-batch's sampled tokens.
A user's loss: ``policy_loss.loss_mode=my_pkg.module:function`` with the signature of
``vanilla_loss``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from trainer.algos.core import agg_loss, registered

__all__ = [
    "FIXED_AGG",
    "POLICY_LOSSES",
    "PolicyLossConfig",
    "PolicyLossOut",
    "fixed_agg",
    "loss_for",
    "policy_loss",
    "policy_loss_tokens",
]


@dataclass(frozen=True, slots=True)
class PolicyLossConfig:
    """The constants a loss reads (``actor.clip_ratio*``, ``actor.tau_*``,
    ``actor.policy_loss.*``)."""

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1
    tau_pos: float = 1.0
    tau_neg: float = 1.05


@dataclass(slots=True)
class PolicyLossOut:
    losses: torch.Tensor
    """Per-token losses [batch, response]."""
    counts: dict[str, float] = field(default_factory=dict)
    """Sums over the sampled tokens: pg_clipfrac, pg_clipfrac_lower, ppo_kl."""
    agg_mode: str | None = None
    """The aggregation the loss's definition fixes (None: actor.loss_agg_mode)."""


def _sum(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x.detach().to(torch.float32) * mask).sum())


def _counts(mask: torch.Tensor, delta: torch.Tensor, clipped=None, lower=None) -> dict:
    m = mask.to(torch.float32)
    return {
        "pg_clipfrac": 0.0 if clipped is None else _sum(clipped, m),
        "pg_clipfrac_lower": 0.0 if lower is None else _sum(lower, m),
        "ppo_kl": _sum(-delta, m),
    }


def policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with asymmetric clipping (DAPO clip-higher) and dual clip:

    r = exp(logp - logp_old); L = max(-A r, -A clip(r, 1 - low, 1 + high)); for A < 0 the loss
    is further capped at -A * clip_ratio_c (dual clip). Returns (aggregated loss, metrics:
    ``pg_clipfrac``, ``pg_clipfrac_lower``, ``ppo_kl``)."""
    losses, counts = policy_loss_tokens(
        log_prob,
        old_log_prob,
        advantages,
        mask,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        clip_ratio_c=clip_ratio_c,
    )
    n = max(float(mask.sum()), 1.0)
    return agg_loss(losses, mask, loss_agg_mode), {k: v / n for k, v in counts.items()}


def policy_loss_tokens(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token PPO losses [batch, response] (see ``policy_loss``) and, summed over masked
    tokens, the clip counts and the approximate KL (divide by the token count for fractions)."""
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1, got {clip_ratio_c}")
    log_ratio = torch.clamp(log_prob - old_log_prob, -20.0, 20.0)
    ratio = torch.exp(log_ratio)
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clipped = torch.maximum(loss1, loss2)
    dual = torch.minimum(-advantages * clip_ratio_c, clipped)
    losses = torch.where(advantages < 0, dual, clipped)
    with torch.no_grad():
        m = mask.to(log_prob.dtype)
        counts = {
            "pg_clipfrac": float(((loss2 > loss1).to(m.dtype) * m).sum()),
            "pg_clipfrac_lower": float(((clipped > dual).to(m.dtype) * (advantages < 0) * m).sum()),
            "ppo_kl": float((-log_ratio * m).sum()),
        }
    return losses, counts


def vanilla_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: PolicyLossConfig,
) -> PolicyLossOut:
    losses, counts = policy_loss_tokens(
        log_prob,
        old_log_prob,
        advantages,
        mask,
        clip_ratio_low=cfg.clip_ratio_low,
        clip_ratio_high=cfg.clip_ratio_high,
        clip_ratio_c=cfg.clip_ratio_c,
    )
    return PolicyLossOut(losses, counts)


def _sequence_mean(x: torch.Tensor, mask: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """[batch] mean of ``x`` over each row's sampled tokens."""
    m = mask.to(x.dtype)
    return (x * m).sum(-1) / (m.sum(-1) + eps).clamp(min=1e-8 if eps else 1.0)


def gspo_loss(log_prob, old_log_prob, advantages, mask, cfg) -> PolicyLossOut:
    delta = log_prob - old_log_prob
    seq = _sequence_mean(delta, mask)
    log_rho = (log_prob - log_prob.detach() + seq.detach().unsqueeze(1)).clamp(max=10.0)
    rho = torch.exp(log_rho)
    loss1 = -advantages * rho
    loss2 = -advantages * torch.clamp(rho, 1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high)
    counts = _counts(mask, delta, clipped=loss2 > loss1)
    return PolicyLossOut(torch.maximum(loss1, loss2), counts, "seq-mean-token-mean")


def sapo_loss(log_prob, old_log_prob, advantages, mask, cfg) -> PolicyLossOut:
    delta = torch.clamp(log_prob - old_log_prob, -20.0, 20.0)
    ratio = torch.exp(delta)
    tau = torch.where(
        advantages > 0,
        torch.full_like(ratio, cfg.tau_pos),
        torch.full_like(ratio, cfg.tau_neg),
    )
    gate = torch.sigmoid(tau * (ratio - 1)) * 4 / tau
    return PolicyLossOut(-gate * advantages, _counts(mask, delta), "seq-mean-token-mean")


def gpg_loss(log_prob, old_log_prob, advantages, mask, cfg) -> PolicyLossOut:
    return PolicyLossOut(-log_prob * advantages, _counts(mask, log_prob - old_log_prob))


def _covariance(log_prob, advantages, mask) -> torch.Tensor:
    """(A - mean A)(logp - mean logp) per token, means over the sampled tokens; no gradient."""
    m = mask.to(torch.float32)
    n = m.sum().clamp(min=1)
    lp, adv = log_prob.detach().float(), advantages.detach().float()
    return (adv - (adv * m).sum() / n) * (lp - (lp * m).sum() / n)


def clip_cov_loss(log_prob, old_log_prob, advantages, mask, cfg) -> PolicyLossOut:
    delta = log_prob - old_log_prob
    ratio = torch.exp(delta)
    loss1 = -advantages * ratio
    loss2 = -advantages * torch.clamp(ratio, 1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high)
    sampled = mask.bool()
    cov = _covariance(log_prob, advantages, mask)
    eligible = sampled & ~(loss2 > loss1) & (cov > cfg.clip_cov_lb) & (cov < cfg.clip_cov_ub)
    keep = torch.ones_like(ratio)
    candidates = torch.nonzero(eligible.flatten()).squeeze(1)
    if len(candidates):
        wanted = max(int(cfg.clip_cov_ratio * float(sampled.sum())), 1)
        chosen = candidates[torch.randperm(len(candidates))[:wanted]]
        keep.view(-1)[chosen] = 0.0
    counts = _counts(mask, delta, clipped=keep == 0)
    return PolicyLossOut(torch.maximum(loss1, loss2) * keep, counts)


def kl_cov_loss(log_prob, old_log_prob, advantages, mask, cfg) -> PolicyLossOut:
    delta = log_prob - old_log_prob
    ratio = torch.exp(delta)
    losses = -advantages * ratio
    sampled = torch.nonzero(mask.bool().flatten()).squeeze(1)
    if len(sampled):
        cov = _covariance(log_prob, advantages, mask).flatten()[sampled]
        k = max(int(len(sampled) * cfg.kl_cov_ratio), 1)
        top = sampled[torch.topk(cov, k).indices]
        penalty = torch.zeros_like(losses)
        penalty.view(-1)[top] = 1.0
        losses = losses + cfg.ppo_kl_coef * delta.abs() * penalty
    counts = _counts(mask, delta)
    counts["ppo_kl"] = _sum(delta.abs(), mask.to(torch.float32))
    return PolicyLossOut(losses, counts)


def geo_mean_loss(log_prob, old_log_prob, advantages, mask, cfg) -> PolicyLossOut:
    delta = log_prob - old_log_prob
    clipped = torch.clamp(delta, -cfg.clip_ratio_low, cfg.clip_ratio_high)
    sign = torch.sign(advantages)
    delta_star = sign * torch.minimum(sign * delta, sign * clipped)
    m = mask.to(delta.dtype)
    tokens = m.sum(-1)
    rho = torch.exp((delta_star * m).sum(-1) / (tokens + 1e-8))
    seq_adv = (advantages * m).sum(-1) / (tokens + 1e-8)
    per_sequence = -seq_adv * rho  # [batch]
    # spread over the row's tokens: summed per row, averaged over rows (every row counts)
    losses = (per_sequence / tokens.clamp(min=1)).unsqueeze(1) * m
    changed = delta != clipped
    counts = _counts(
        mask, delta, clipped=changed & (advantages > 0), lower=changed & (advantages < 0)
    )
    return PolicyLossOut(losses, counts, "seq-mean-token-sum")


def cispo_loss(log_prob, old_log_prob, advantages, mask, cfg) -> PolicyLossOut:
    delta = torch.clamp(log_prob - old_log_prob, -20.0, 20.0)
    ratio = torch.exp(delta)
    weight = torch.clamp(ratio, 1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high)
    counts = _counts(mask, delta, clipped=ratio != weight)
    return PolicyLossOut(-weight.detach() * advantages * log_prob, counts)


LossFn = Callable[..., PolicyLossOut]
_LOSSES: dict[str, LossFn] = {
    "vanilla": vanilla_loss,
    "gspo": gspo_loss,
    "sapo": sapo_loss,
    "gpg": gpg_loss,
    "clip_cov": clip_cov_loss,
    "kl_cov": kl_cov_loss,
    "geo_mean": geo_mean_loss,
    "cispo": cispo_loss,
}
POLICY_LOSSES = tuple(_LOSSES)
FIXED_AGG = {
    "gspo": "seq-mean-token-mean",
    "sapo": "seq-mean-token-mean",
    "geo_mean": "seq-mean-token-sum",
}
"""The losses whose definition fixes their aggregation (``loss_agg_mode`` is ignored there).
A function's ``agg_mode`` attribute says so, for a user's function as for these."""
for _name, _mode in FIXED_AGG.items():
    _LOSSES[_name].agg_mode = _mode  # type: ignore[attr-defined]


def loss_for(mode: str) -> LossFn:
    """The registered loss ``mode``, or a user's function at a dotted path."""
    return registered(mode, _LOSSES, "actor_rollout_ref.actor.policy_loss.loss_mode")


def fixed_agg(mode: str) -> str | None:
    """The aggregation loss ``mode`` fixes (its function's ``agg_mode``), or None."""
    return getattr(loss_for(mode), "agg_mode", None)
