"""Turn-level credit for the group estimators (``algorithm.turn_credit``; MT-GRPO's idea of an
outcome advantage plus a turn term, generalised to any number of turns).

Token rewards reach GAE and REINFORCE++ per token already. A group estimator (grpo, rloo, ...)
sees one number per sample, so turn rewards would only add to the outcome. With
``turn_credit.coef`` = c > 0, each sampled token of model turn k of sample i gets

    A_it = A_i(outcome) + c * (G_ik - b_g) / (s_g + eps)

- r_ij: the turn reward of sample i's turn j (on its last token; the outcome score excluded);
- G_ik = sum_{j >= k} gamma^(j - k) r_ij: the discounted turn return from turn k on
  (``turn_credit.gamma``), so an early turn is credited with what its later turns earned;
- b_g, s_g: mean and unbiased std of G over *every* turn of every sample of the group (sample
  weights count), not per turn index: samples that stop earlier have fewer turns, and a
  per-index baseline is biased when the policy chooses when to stop (verl RFC #7244);
  without ``norm_by_std`` the division is left out. A group weighing one sample or less
  gets no turn term (nothing to compare with).

The result is multiplied by each sample's weight, as every estimator's is.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trainer.algos.groups import ONE_SAMPLE, group_index, sample_weights

__all__ = ["turn_credit_term", "turn_index"]


def turn_index(ends: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([batch, width] the model turn of each response position, counted from 0: the number
    of turn ends before it; [batch, K] the turn ends padded with ``width``)."""
    k = max((len(e) for e in ends), default=0)
    padded = torch.full((len(ends), max(k, 1)), width, dtype=torch.long)
    for i, e in enumerate(ends):  # per sample, not per token
        padded[i, : len(e)] = torch.tensor(e, dtype=torch.long)
    positions = torch.arange(width)
    turn = (positions.view(1, -1, 1) > padded.unsqueeze(1)).sum(-1)  # [batch, width]
    return turn, padded


def turn_credit_term(
    turn_rewards: torch.Tensor,
    ends: list[list[int]],
    mask: torch.Tensor,
    group_ids: Sequence[str] | torch.Tensor,
    *,
    gamma: float = 1.0,
    norm_by_std: bool = True,
    weights: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """The turn term (G_ik - b_g) / (s_g + eps) on every sampled token of turn k, [batch,
    response] (0 where ``mask`` is 0), times each sample's weight; see the module docstring.
    ``turn_rewards`` [batch, response] carries r_ij on the last token of turn j (``ends``)."""
    batch, width = mask.shape
    turn, padded = turn_index(ends, width)
    valid = padded < width  # [batch, K]
    k = padded.shape[1]
    rewards = torch.where(
        valid, turn_rewards.float().gather(1, padded.clamp(max=width - 1)), torch.zeros(())
    )
    returns = torch.zeros_like(rewards)
    running = torch.zeros(batch)
    for j in reversed(range(k)):  # over turns, vectorised over the batch
        running = rewards[:, j] + gamma * running
        returns[:, j] = running
    w = sample_weights(weights, torch.zeros(batch))
    index = group_index(group_ids)
    groups = int(index.max()) + 1 if index.numel() else 0
    cell = (w.unsqueeze(1) * valid).float()  # each (sample, turn) weighs its sample's weight
    count = torch.zeros(groups).index_add_(0, index, cell.sum(1))
    total = torch.zeros(groups).index_add_(0, index, (cell * returns).sum(1))
    mean = total / count.clamp(min=1e-12)
    centred = returns - mean[index].unsqueeze(1)
    if norm_by_std:
        sq = torch.zeros(groups).index_add_(0, index, (cell * centred.square()).sum(1))
        std = torch.sqrt(sq / (count - 1).clamp(min=1))
        centred = centred / (std[index].unsqueeze(1) + eps)
    sessions = torch.zeros(groups).index_add_(0, index, w)
    centred = torch.where((sessions[index] > ONE_SAMPLE).unsqueeze(1), centred, 0.0)
    centred = torch.where(valid, centred, 0.0)
    per_token = centred.gather(1, turn.clamp(max=k - 1)) * (turn < k)
    return per_token * mask.float() * w.unsqueeze(1)
