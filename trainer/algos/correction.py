"""Rollout correction (``algorithm.rollout_correction``): per-token importance weights for a
PPO loss on tokens that another policy sampled.

In async training (and with a rollout engine whose numerics differ from the trainer's) the
tokens come from a behaviour policy pi_rollout, not from the proximal policy pi_old the PPO
ratio is taken against. Weighting each token's loss by w = pi_old / pi_rollout corrects for
that; the weight is bounded, since a few tokens far off-policy would otherwise dominate:

- ``tis`` (truncated importance sampling): min(w, clip);
- ``decoupled`` (AReaL's decoupled PPO): w where w <= clip, else 0 (the token is dropped).

The driver uses the weights for its staleness metrics, the ranks in the loss: one function
for both, here with the rest of the algorithm math.
"""

from __future__ import annotations

import torch

__all__ = ["correction_weights"]


def correction_weights(
    old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mode: str, clip: float
) -> torch.Tensor:
    """Per-token weight [batch, response] of the PPO loss that corrects for sampling by another
    policy than the proximal (old) one: w = pi_old / pi_rollout, truncated at ``clip``
    (``tis``) or 0 above it (``decoupled``). No gradient."""
    weight = torch.exp((old_log_probs - rollout_log_probs).clamp(max=20.0)).detach()
    if mode == "tis":
        return weight.clamp(max=clip)
    if mode == "decoupled":
        return torch.where(weight <= clip, weight, torch.zeros_like(weight))
    raise ValueError(f"unknown rollout correction mode {mode!r}")
