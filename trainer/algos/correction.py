"""Rollout correction (``algorithm.rollout_correction``, verl's family): importance weights and
rejection for a policy loss on tokens that another policy sampled.

The tokens come from a behaviour policy pi_rollout (the engine: other numerics, and in async
training older weights). The loss compares the current policy with a proximal one, pi_old:
the trainer's recomputed log-probs (decoupled mode) or the engine's own (bypass mode, where
the ratio r = pi_theta / pi_rollout). Per token, with log-ratio l_t = log pi_old - log
pi_rollout (bypass: log pi_theta - log pi_rollout, no gradient) over a sample's sampled tokens:

- the ratio at a **level**: token r_t = exp(l_t); sequence r = exp(sum_t l_t), the same on
  every token of the sample; geometric exp(mean_t l_t). Each is bounded to [e^-20, e^20]
  before it is exponentiated;
- **importance weights** (``rollout_is``: token | sequence): min(r, ``rollout_is_threshold``),
  optionally divided by their batch mean (``rollout_is_batch_normalize``; over the accepted
  tokens at token level, the accepted samples at sequence level), 0 off the sampled tokens;
  With a lower bound too (``rollout_is_threshold="lower_upper"``, IcePop) a weight outside
  [lower, upper] is 0 instead of truncated;
- **rejection** (``rollout_rs``, one criterion or several joined by commas, all must hold): a
  token (or a whole sample) outside the criterion's bounds leaves the loss (mask 0, and out
  of the loss normaliser where the mask is known before the update). A criterion is a level
  (``token``; ``seq_sum``, ``seq_mean``, ``seq_max`` over the sample's tokens) of a statistic:
  ``k1`` the log-ratio, kept within [log lower, log upper] (ratio bounds; seq_sum_k1 is the
  sequence ratio, seq_mean_k1 the geometric mean), ``k2`` 0.5 (log r)^2 and ``k3`` r - 1 -
  log r, kept at or below their upper bound. verl's older names ``token``, ``sequence`` and
  ``geometric`` are token_k1, seq_sum_k1 and seq_mean_k1. k1 comparisons are in log space, so
  unbounded;
- the **veto** (``rollout_token_veto_threshold``): a sample with any token whose unbounded
  r_t is below it leaves the loss whole.

``mismatch_metrics`` measures pi_old against pi_rollout every step, whatever the mode (KL,
K3, perplexities and their ratio, chi-square per token and per sample). The driver uses these
functions for its metrics and masks, the ranks in the loss: one place for both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = [
    "RS_OPTIONS",
    "CorrectionSpec",
    "Corrected",
    "Rejection",
    "correct",
    "mismatch_metrics",
    "token_mismatch",
    "weight_metrics",
]

BOUND = 20.0
"""Log-ratios are bounded to [-BOUND, BOUND] before they are exponentiated."""
IS_LEVELS = ("token", "sequence")
RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)
RS_LEGACY = {"token": "token_k1", "sequence": "seq_sum_k1", "geometric": "seq_mean_k1"}


@dataclass(frozen=True, slots=True)
class Rejection:
    """One rejection criterion: ``option`` (``RS_OPTIONS``) and its bounds; ``lower`` only
    for the k1 (ratio) criteria."""

    option: str
    upper: float
    lower: float | None = None

    @property
    def level(self) -> str:
        return self.option.rsplit("_", 1)[0]

    @property
    def k(self) -> str:
        return self.option.rsplit("_", 1)[1]


@dataclass(frozen=True, slots=True)
class CorrectionSpec:
    """The resolved correction (``RolloutCorrectionConfig.spec``); None or empty fields are
    off."""

    rollout_is: str | None = None
    is_threshold: float = 2.0
    is_lower: float | None = None
    """IcePop: weights outside [is_lower, is_threshold] are 0 (None: truncate at the upper)."""
    batch_normalize: bool = False
    rejections: tuple[Rejection, ...] = ()
    veto: float | None = None
    bypass: bool = False
    """The engine's log-probs are the old policy's (``bypass_mode``)."""
    loss_type: str = "ppo_clip"
    """``ppo_clip`` or ``reinforce`` (bypass mode: -w x A x log pi, no clipping)."""

    @property
    def active(self) -> bool:
        """Weights or rejection change the loss."""
        return self.rollout_is is not None or self.rejects

    @property
    def applies_weights(self) -> bool:
        """The importance weights multiply the loss: everywhere but bypass mode's PPO loss,
        whose ratio is already against the engine's policy (there they are measured)."""
        return self.rollout_is is not None and not (self.bypass and self.loss_type == "ppo_clip")

    @property
    def rejects(self) -> bool:
        """Rejection or the veto may take tokens out of the loss."""
        return bool(self.rejections) or self.veto is not None

    @property
    def needs_whole_batch(self) -> bool:
        """The mask or the weights depend on the batch (rejection changes the loss
        normaliser; batch normalisation takes the batch mean): computed by the driver
        before the update, from the trainer's old log-probs."""
        return not self.bypass and (self.rejects or self.batch_normalize)


@dataclass(slots=True)
class Corrected:
    """``correct``'s result: weights [B, R] (None: no importance weights) and the accepted
    mask [B, R] (the response mask with rejected tokens at 0)."""

    weights: torch.Tensor | None
    accepted: torch.Tensor


def _statistic(log_ratio: torch.Tensor, k: str) -> torch.Tensor:
    """Per token: k1 the log-ratio, k2 0.5 (log r)^2, k3 r - 1 - log r (r bounded)."""
    if k == "k1":
        return log_ratio
    if k == "k2":
        return 0.5 * log_ratio**2
    bounded = log_ratio.clamp(-BOUND, BOUND)
    return torch.exp(bounded) - 1 - bounded


def rejection_statistic(
    log_ratio: torch.Tensor, mask: torch.Tensor, rejection: Rejection
) -> torch.Tensor:
    """The criterion's statistic, [B, R] at token level, [B, 1] over each sample's tokens."""
    stat = _statistic(log_ratio, rejection.k) * mask
    level = rejection.level
    if level == "token":
        return stat
    if level == "seq_max":
        return stat.masked_fill(mask == 0, -math.inf).amax(-1, keepdim=True).clamp(min=0)
    summed = stat.sum(-1, keepdim=True)
    return summed if level == "seq_sum" else summed / mask.sum(-1, keepdim=True).clamp(min=1)


def _inside(stat: torch.Tensor, rejection: Rejection) -> torch.Tensor:
    if rejection.k == "k1":
        lower = rejection.lower if rejection.lower is not None else 1.0 / rejection.upper
        return (stat <= math.log(rejection.upper)) & (stat >= _log(lower))
    return stat <= rejection.upper


def correct(
    log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    mask: torch.Tensor,
    spec: CorrectionSpec,
) -> Corrected:
    """Importance weights and the accepted mask of ``spec`` for the rows' sampled tokens
    (``mask``), with ``log_probs`` the proximal policy's (no gradient flows)."""
    mask = mask.to(log_probs.dtype)
    log_ratio = (log_probs.detach() - rollout_log_probs.to(log_probs.dtype)) * mask
    accepted = mask.clone()
    for rejection in spec.rejections:
        inside = _inside(rejection_statistic(log_ratio, mask, rejection), rejection)
        accepted = accepted * inside.to(mask.dtype)
    if spec.veto is not None:
        vetoed = ((log_ratio < math.log(spec.veto)) & mask.bool()).any(-1, keepdim=True)
        accepted = accepted * (~vetoed).to(mask.dtype)
    if spec.rollout_is is None:
        return Corrected(None, accepted)
    if spec.rollout_is == "token":
        level = log_ratio
    else:
        level = log_ratio.sum(-1, keepdim=True)
    raw = torch.exp(level.clamp(-BOUND, BOUND)).expand_as(mask)
    if spec.is_lower is None:
        weights = raw.clamp(max=spec.is_threshold)
    else:
        keep = (raw >= spec.is_lower) & (raw <= spec.is_threshold)
        weights = torch.where(keep, raw, torch.zeros_like(raw))
    if spec.batch_normalize:
        if spec.rollout_is == "token":
            mean = (weights * accepted).sum() / accepted.sum().clamp(min=1)
        else:
            rows = accepted.amax(-1) > 0
            mean = weights[:, 0][rows].mean() if bool(rows.any()) else weights.new_ones(())
        weights = weights / mean.clamp(min=1e-8)
    return Corrected(weights * mask, accepted)


def _log(value: float) -> float:
    return math.log(value) if value > 0 else -math.inf


def token_mismatch(log_ratio: torch.Tensor) -> dict[str, torch.Tensor]:
    """The per-token terms of the token-level mismatch metrics, for sampled tokens'
    ``log_ratio`` = log pi - log pi_rollout: ``kl`` (-log_ratio), ``k3_kl`` (r - log r - 1) and
    ``chi2_token`` (r^2 - 1), the log-ratio bounded to +-``BOUND`` in the last two. Their
    means are the metrics; a loss that sums them over micro-batches divides later."""
    bounded = log_ratio.clamp(-BOUND, BOUND)
    return {
        "rollout_corr/kl": -log_ratio,
        "rollout_corr/k3_kl": torch.exp(bounded) - bounded - 1,
        "rollout_corr/chi2_token": torch.exp(2 * bounded) - 1,
    }


def mismatch_metrics(
    log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """How far the trainer's policy (``log_probs``) is from the engine's on the sampled tokens
    (``rollout_corr/*``, verl's names): ``kl`` mean(log pi_rollout - log pi), ``k3_kl``
    mean(r - log r - 1) with r = pi / pi_rollout, per-sample log-perplexities and their
    differences, ``ppl_ratio`` exp(mean(log_ppl - rollout_log_ppl)), ``chi2_token`` mean(r^2) -
    1, ``chi2_seq`` mean over samples of (prod r)^2 - 1. Empty when no token is sampled."""
    m = mask.bool()
    if not bool(m.any()):
        return {}
    lp, rp = log_probs.double(), rollout_log_probs.double()
    log_ratio = (lp - rp).masked_fill(~m, 0.0)
    tokens = token_mismatch(log_ratio[m])
    rows = m.any(-1)
    count = m.sum(-1).clamp(min=1)
    log_ppl = -(lp.masked_fill(~m, 0.0).sum(-1) / count)[rows]
    rollout_log_ppl = -(rp.masked_fill(~m, 0.0).sum(-1) / count)[rows]
    diff = rollout_log_ppl - log_ppl
    seq = log_ratio.sum(-1)[rows].clamp(-BOUND, BOUND)
    return {
        **{key: float(terms.mean()) for key, terms in tokens.items()},
        "rollout_corr/training_ppl": float(torch.exp(log_ppl).mean()),
        "rollout_corr/rollout_ppl": float(torch.exp(rollout_log_ppl).mean()),
        "rollout_corr/training_log_ppl": float(log_ppl.mean()),
        "rollout_corr/rollout_log_ppl": float(rollout_log_ppl.mean()),
        "rollout_corr/ppl_ratio": float(torch.exp((-diff).mean())),
        "rollout_corr/log_ppl_diff": float(diff.mean()),
        "rollout_corr/log_ppl_abs_diff": float(diff.abs().mean()),
        "rollout_corr/log_ppl_diff_max": float(diff.max()),
        "rollout_corr/log_ppl_diff_min": float(diff.min()),
        "rollout_corr/chi2_seq": float(torch.exp(2 * seq).mean() - 1),
    }


def weight_metrics(
    log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    mask: torch.Tensor,
    spec: CorrectionSpec,
    corrected: Corrected,
) -> dict[str, float]:
    """What the correction did to the sampled tokens: the weights' mean, std, min, max and
    effective sample size 1 / mean((w / mean w)^2) and the share of ratios above the IS
    threshold (``rollout_is_*``); the share of tokens and samples rejected
    (``rollout_rs_masked_fraction``, ``rollout_rs_seq_masked_fraction``) and, with the veto,
    the share of samples vetoed and of catastrophic tokens."""
    m = mask.bool()
    if not bool(m.any()):
        return {}
    out: dict[str, float] = {}
    log_ratio = (log_probs.double() - rollout_log_probs.double()).masked_fill(~m, 0.0)
    rows = m.any(-1)
    sampled = float(m.sum())
    if corrected.weights is not None and spec.rollout_is is not None:
        w = corrected.weights.double()[m]
        if spec.rollout_is == "token":
            raw = log_ratio[m]
        else:
            raw = log_ratio.sum(-1)[rows]
        normed = w / w.mean().clamp(min=1e-12)
        out |= {
            "rollout_corr/rollout_is_mean": float(w.mean()),
            "rollout_corr/rollout_is_std": float(w.std(unbiased=False)),
            "rollout_corr/rollout_is_min": float(w.min()),
            "rollout_corr/rollout_is_max": float(w.max()),
            "rollout_corr/rollout_is_eff_sample_size": float(1.0 / (normed**2).mean()),
            "rollout_corr/rollout_is_ratio_fraction_high": float(
                (raw > math.log(spec.is_threshold)).double().mean()
            ),
        }
        if spec.is_lower is not None:
            out["rollout_corr/rollout_is_ratio_fraction_low"] = float(
                (raw < _log(spec.is_lower)).double().mean()
            )
    for rejection in spec.rejections:
        stat = rejection_statistic(log_ratio, m.double(), rejection)
        values = stat[m] if rejection.level == "token" else stat[rows, 0]
        inside = _inside(stat, rejection).expand_as(m)
        name = f"rollout_corr/rollout_rs_{rejection.option}"
        out[f"{name}_mean"] = float(values.mean())
        out[f"{name}_masked_fraction"] = float((m & ~inside).sum()) / sampled
    if spec.rejects:
        kept = corrected.accepted.bool()
        out["rollout_corr/rollout_rs_masked_fraction"] = float((m & ~kept).sum()) / sampled
        out["rollout_corr/rollout_rs_seq_masked_fraction"] = float(
            (m & ~kept).any(-1)[rows].double().mean()
        )
    if spec.veto is not None:
        bad = (log_ratio < math.log(spec.veto)) & m
        out["rollout_corr/rollout_is_veto_fraction"] = float(bad.any(-1)[rows].double().mean())
        out["rollout_corr/rollout_is_catastrophic_token_fraction"] = float(bad.sum()) / sampled
    return out
