"""One SFT optimizer step on a rank: masked token-mean negative log-likelihood of the
assistant tokens (``response_mask``) over the whole global batch.

Normalisation, as in the PPO update (``trainer.workers.policy_math``): every micro-batch adds
``sum(-log p * mask)`` divided by the mask-token count of the global batch (all ranks), so
the micro-batches of all ranks sum to exactly the global token mean; FSDP averages gradients
over ranks, hence the factor ``world_size``. The result does not depend on how the batch is
split over ranks or micro-batches.
"""

from __future__ import annotations

import torch

from trainer.algos import agg_numerator
from trainer.workers.batch import TrainBatch
from trainer.workers.dist import all_reduce_floats, clip_and_step, micro_batch_groups, world_size
from trainer.workers.policy_math import (
    accumulate_gradients,
    forward_log_probs,
    global_denominator,
)

__all__ = ["sft_update"]

_MODE = "token-mean"


def sft_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    batch: TrainBatch,
    *,
    micro_batch_size: int,
    use_dynamic_bsz: bool,
    max_token_len: int,
    grad_clip: float,
    remove_padding: bool = True,
) -> dict[str, float]:
    """Forward/backward over this rank's ``batch`` in micro-batches, then one clipped
    optimizer step. Metrics are global (reduced over ranks): ``train/loss`` (token-mean NLL
    before the step), ``train/grad_norm``, ``train/lr`` (of this step), ``train/loss_tokens``."""
    world = world_size()
    tokens = global_denominator(batch.response_mask, _MODE, batch.response_length)
    denominator = max(tokens, 1.0)

    def micro_loss(mb: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
        log_probs, _ = forward_log_probs(model, mb, remove_padding=remove_padding)  # [mb, r]
        nll = agg_numerator(-log_probs, mb.response_mask.to(log_probs.device), _MODE)
        return nll * (world / denominator), {"nll": float(nll.detach())}

    groups = micro_batch_groups(
        batch, micro_batch_size, use_dynamic_bsz, max_token_len, packed=remove_padding
    )
    nll_sum = accumulate_gradients(model, batch, groups, micro_loss).get("nll", 0.0)
    lr = optimizer.param_groups[0]["lr"]
    grad_norm = clip_and_step(model, optimizer, scheduler, grad_clip)
    return {
        "train/loss": all_reduce_floats([nll_sum])[0] / denominator,
        "train/grad_norm": grad_norm,
        "train/lr": lr,
        "train/loss_tokens": tokens,
    }
