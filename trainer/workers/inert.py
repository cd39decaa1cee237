"""Rows the actor update skips (``actor.skip_zero_advantage_rows``): a row whose advantage is 0
on every sampled token adds exactly nothing to the policy gradient, so its forward and backward
are work for nothing. GRPO on a sparse reward makes many: every sample of a group that scored
alike has advantage 0 (on repo_fix, most groups score 0 together).

The update is the same only when the loss is the policy term alone and each token's term is
proportional to its advantage:

- the loss is ``vanilla``, ``gpg`` or ``cispo`` (``clip_cov`` and ``kl_cov`` pick tokens by a
  covariance over the micro-batch; a user's loss is not known);
- ``loss_agg_mode=token-mean``: the normaliser counts the skipped rows' tokens
  (``TrainBatch.stand_in_tokens``), which the ``seq-mean-*`` modes, counting rows by weight,
  could not;
- no entropy or KL-loss term, which a row adds whatever its advantage;
- no rollout correction (its statistics may run over the micro-batch).

A skipped row becomes a filler standing in for it (``TrainBatch.skipping``): a one-token
forward with nothing to train, in the same place of the same mini-batch, so the other rows'
micro-batches, the normaliser and the optimizer steps are those of the full batch. A
micro-batch of fillers alone is not run (``dist.without_idle_groups``). The
update's per-token metrics (``actor/pg_clipfrac``, ``actor/ppo_kl``) and, when the update
takes its own old log-probs, ``actor/entropy`` are over the rows it computed.
"""

from __future__ import annotations

import torch

from trainer.algos.correction import CorrectionSpec
from trainer.config.actor import ActorConfig
from trainer.workers.batch import TrainBatch

__all__ = ["ZERO_AT_ZERO_ADVANTAGE", "inert_rows", "skip_inert_rows", "skip_problem"]

ZERO_AT_ZERO_ADVANTAGE = ("vanilla", "gpg", "cispo")
"""The policy losses whose every token's term is its advantage times something finite."""


def skip_problem(cfg: ActorConfig, correction: CorrectionSpec) -> str | None:
    """Why skipping the zero-advantage rows would change this update (None: it would not)."""
    mode = cfg.policy_loss.loss_mode
    if not cfg.skip_zero_advantage_rows:
        return "actor.skip_zero_advantage_rows=False"
    if mode not in ZERO_AT_ZERO_ADVANTAGE:
        losses = ", ".join(ZERO_AT_ZERO_ADVANTAGE)
        return f"actor.policy_loss.loss_mode={mode!r} (skips with {losses})"
    if cfg.loss_agg_mode != "token-mean":
        return f"actor.loss_agg_mode={cfg.loss_agg_mode!r} (skips with token-mean)"
    if cfg.entropy_coeff != 0:
        return f"actor.entropy_coeff={cfg.entropy_coeff} (an entropy term)"
    if cfg.use_kl_loss:
        return "actor.use_kl_loss=True (a KL term)"
    if correction.active or correction.bypass:
        return "algorithm.rollout_correction is on"
    return None


def inert_rows(batch: TrainBatch) -> torch.Tensor:
    """[batch] bool: rows with sampled tokens whose advantage is 0 on every one of them."""
    assert batch.advantages is not None, "inert rows are read from the advantages"
    sampled = batch.response_mask.bool()
    live = (batch.advantages != 0) & sampled
    return sampled.any(-1) & ~live.any(-1)


def skip_inert_rows(
    batch: TrainBatch, cfg: ActorConfig, correction: CorrectionSpec
) -> tuple[TrainBatch, torch.Tensor]:
    """The batch the update computes (the inert rows as fillers standing in for them, or the
    batch itself where ``skip_problem`` finds a reason) and the [batch] bool of rows skipped."""
    if skip_problem(cfg, correction) is not None:
        return batch, torch.zeros(len(batch), dtype=torch.bool)
    rows = inert_rows(batch)
    if not bool(rows.any()):
        return batch, rows
    return batch.skipping(rows), rows
