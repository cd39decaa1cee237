"""What every rank-side update shares about the trainer's process group: this rank's place in
it, a sum or max of a few numbers over it, one clipped optimizer step, and micro-batches that
every rank runs the same number of.

The actor (``policy_math``), the critic (``critic_math``), SFT (``sft_step``) and weight sync
(``weight_send``) all run on an FSDP2 shard inside a process group and on a whole model in one
process in tests; these helpers are the identity without a process group, so the same code
serves both.
"""

from __future__ import annotations

import logging
import math
import weakref
from typing import Literal

import torch
import torch.distributed as dist

from trainer.workers.batch import TrainBatch, balanced_micro_batches, fixed_micro_batches
from trainer.workers.prefix_tree import build_tree, family_units, real_rows

__all__ = [
    "all_reduce_floats",
    "clip_and_step",
    "keep_gathered",
    "keeps_gathered",
    "micro_batch_groups",
    "this_rank",
    "without_idle_groups",
    "world_size",
]

logger = logging.getLogger(__name__)


_GATHERED: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
"""FSDP2 models sharded with ``reshard_after_forward=False`` (``trainer.workers.fsdp``)."""


def keep_gathered(model: torch.nn.Module) -> None:
    """Record that ``model`` keeps its gathered parameters after a forward, so that
    ``keeps_gathered`` tells the update loops to keep them until an optimizer step's last
    backward (``apply_fsdp`` calls it)."""
    _GATHERED.add(model)


def keeps_gathered(model: torch.nn.Module) -> bool:
    """Whether ``model`` was sharded to keep its gathered parameters after a forward."""
    return model in _GATHERED


def world_size() -> int:
    """The number of ranks in the trainer's process group (1 without one)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def this_rank() -> int:
    """This rank's index in the trainer's process group (0 without one)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def all_reduce_floats(values: list[float], op: Literal["sum", "max"] = "sum") -> list[float]:
    """Sum (or max) of a few numbers over ranks; identity without a process group. The
    numbers travel as float64 (on the GPU under NCCL, which cannot reduce CPU tensors)."""
    if world_size() == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return t.cpu().tolist()


def micro_batch_groups(
    batch: TrainBatch,
    size: int,
    dynamic: bool,
    max_tokens: int,
    packed: bool = False,
    shared: bool = False,
) -> list[torch.Tensor]:
    """Row index groups of ``batch``'s micro-batches: ``size`` rows each, or with ``dynamic``
    as few as fit ``max_tokens`` tokens each. Dynamic groups are as many on every rank (the
    ranks' max), since FSDP's collectives need the same number of forwards everywhere.
    ``packed``: a group's tokens are its real tokens, else rows x its longest row.
    ``shared`` (packed as prefix trees): rows that share a prefix go together, and a group's
    tokens are its tree's."""
    if shared:
        return _shared_groups(batch, size, dynamic, max_tokens)
    if not dynamic:
        return fixed_micro_batches(len(batch), size)
    prompt_len, resp_len = batch.lengths()
    tokens = prompt_len + resp_len
    count = len(balanced_micro_batches(tokens, max_tokens, packed=packed))
    count = int(all_reduce_floats([float(count)], op="max")[0])
    return balanced_micro_batches(tokens, max_tokens, min_count=count, packed=packed)


def without_idle_groups(batch: TrainBatch, groups: list[torch.Tensor]) -> list[torch.Tensor]:
    """``groups`` less the micro-batches that hold no sampled token (fillers, skipped rows):
    their gradient is 0 on every parameter, so leaving them out adds the same gradients in
    the same order, without their forward, backward and FSDP gathers. Every rank keeps as
    many micro-batches (the ranks' most with a sampled token, at least one so that the
    optimizer steps on gradients, zeros too), idle ones kept to make up its count."""
    sampled = batch.response_mask.sum(-1) > 0
    idle = [not bool(sampled[g].any()) for g in groups]
    live = len(groups) - sum(idle)
    count = max(int(all_reduce_floats([float(live)], op="max")[0]), 1)
    spare = count - live  # idle micro-batches this rank keeps, the first ones
    kept = []
    for group, is_idle in zip(groups, idle, strict=True):
        if is_idle:
            if spare <= 0:
                continue
            spare -= 1
        kept.append(group)
    if len(kept) != count:
        raise AssertionError(
            f"{len(kept)} micro-batches kept of {len(groups)}, the ranks run {count}"
        )
    return kept


def _shared_groups(
    batch: TrainBatch, size: int, dynamic: bool, max_tokens: int
) -> list[torch.Tensor]:
    """``micro_batch_groups`` over prefix-tree units (``family_units``): fixed groups are
    ``size`` consecutive rows in tree order; dynamic ones balance whole families."""
    seqs, positions = real_rows(batch)
    if not dynamic:
        order = build_tree(seqs, positions).order
        return [torch.tensor(sorted(order[i : i + size])) for i in range(0, len(order), size)]
    units, costs = family_units(seqs, positions, max_tokens)
    count = len(balanced_micro_batches(torch.tensor(costs), max_tokens, packed=True))
    count = int(all_reduce_floats([float(count)], op="max")[0])
    units, costs = family_units(seqs, positions, max_tokens, min_units=count)
    groups = balanced_micro_batches(torch.tensor(costs), max_tokens, min_count=count, packed=True)
    return [torch.tensor(sorted(r for u in g.tolist() for r in units[u])) for g in groups]


def clip_and_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    max_norm: float,
) -> float:
    """Clip the global gradient norm (``max_norm`` <= 0: no clipping, the norm is still
    measured), step the optimizer and scheduler, zero the grads; returns the norm. A
    non-finite norm skips the optimizer step (one bad batch must not poison the weights) but
    still advances the scheduler, so every rank stays on the same schedule."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else math.inf)
    if hasattr(norm, "full_tensor"):  # a DTensor norm of an FSDP2 shard
        norm = norm.full_tensor()
    value = float(norm)
    if math.isfinite(value):
        optimizer.step()
    else:
        logger.warning("gradient norm is %s: optimizer step skipped", value)
    optimizer.zero_grad(set_to_none=True)
    if scheduler is not None:
        scheduler.step()
    return value
