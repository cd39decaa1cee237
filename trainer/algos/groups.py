"""Group statistics of the group estimators (``grpo``, ``rloo``, ``opo``, ``gpg``, ...) and the
turn credit: which group (same uid) each sample is in, the checked sample weights, and each
group's weighted count, mean and std.

Samples are counted by their weight (``SampleRecord.weight``: a gateway session split into k
segments gives k samples of weight 1/k), so a group's "count" is its summed weight; see
``trainer.algos.core`` for why. Every estimator reads the groups through these few functions,
so a weighted sample means the same thing in all of them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["ONE_SAMPLE", "group_index", "group_stats", "sample_weights"]

ONE_SAMPLE = 1.0 + 1e-4
"""A group must weigh more than this to have a baseline: a group of one sample (or of one
session's segments, whose weights 1/k sum to 1 only up to rounding) has nothing to compare
with, and its advantage is 0."""


def group_index(group_ids: Sequence[str] | torch.Tensor) -> torch.Tensor:
    """Dense group index per sample, numbered in order of first appearance for strings (in
    sorted order for a tensor of ids): [batch] int64."""
    if isinstance(group_ids, torch.Tensor):
        return torch.unique(group_ids, return_inverse=True)[1]
    first: dict[str, int] = {}
    return torch.tensor([first.setdefault(g, len(first)) for g in group_ids], dtype=torch.long)


def sample_weights(weights: torch.Tensor | None, scores: torch.Tensor) -> torch.Tensor:
    """The sample weights [batch] in ``scores``' dtype (all 1 when None), checked: one per
    sample and none negative (a ``ValueError`` that says so)."""
    if weights is None:
        return torch.ones_like(scores)
    if weights.shape != scores.shape:
        raise ValueError(
            f"weights have shape {list(weights.shape)}, the scores {list(scores.shape)}: "
            "one weight per sample"
        )
    weights = weights.to(scores.dtype)
    if not bool((weights >= 0).all()):
        bad = weights[~(weights >= 0)][0].item()
        raise ValueError(f"sample weights must be >= 0 (a dropped sample has 0), got {bad}")
    return weights


def group_stats(
    scores: torch.Tensor, index: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sample, its group's weight (its size when every weight is 1), weighted mean and
    unbiased weighted std (0 for a group of one): three [batch] tensors. ``index``: from
    ``group_index``; ``weights``: from ``sample_weights``."""
    n_groups = int(index.max()) + 1 if index.numel() else 0
    count = torch.zeros(n_groups, dtype=scores.dtype).index_add_(0, index, weights)
    total = torch.zeros(n_groups, dtype=scores.dtype).index_add_(0, index, weights * scores)
    mean = total / count
    sq = torch.zeros(n_groups, dtype=scores.dtype).index_add_(
        0, index, weights * (scores - mean[index]) ** 2
    )
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    return count[index], mean[index], std[index]
