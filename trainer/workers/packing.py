"""Which positions of a model input predict which response tokens, for a padded micro-batch
or the same samples packed into one row without padding.

A micro-batch ``mb`` (``TrainBatch``: prompts left-padded to P, responses right-padded to
R) becomes either

- padded: ``mb.input_ids`` as it is, [rows, P + R], or
- packed: the real tokens of every row back to back, [1, tokens], position ids restarting
  at 0 for each sample, and the sample boundaries (``bounds``) that confine attention.

Either way ``Targets`` lists, for every token the model sampled (``response_mask`` 1), the
flat index of the position whose logits predict it, the token id, and the (row, column) of
the [rows, R] result it fills. All vectorised: no loop over rows or tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.workers.batch import TrainBatch

__all__ = ["ModelInput", "Targets", "model_input", "scatter_rows"]


@dataclass(frozen=True, slots=True)
class Targets:
    positions: torch.Tensor
    """[k] flat index into the model input's [rows * length] positions."""
    tokens: torch.Tensor
    """[k] the sampled token each position predicts."""
    rows: torch.Tensor
    """[k] row of the [rows, R] log-prob tensor."""
    cols: torch.Tensor
    """[k] column of the [rows, R] log-prob tensor."""


@dataclass(frozen=True, slots=True)
class ModelInput:
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    """[rows, P + R] when padded; None when packed (attention follows ``bounds``)."""
    bounds: tuple[int, ...] | None
    """Packed only: sample k spans tokens ``bounds[k]:bounds[k + 1]`` of the row."""
    targets: Targets
    logits_to_keep: int = 0
    """The LM head sees only the last this many positions of each row (0: all); targets'
    positions index into that [rows * kept] slice."""


def model_input(mb: TrainBatch, packed: bool) -> ModelInput:
    """The model input of a (trimmed) micro-batch, packed or padded, and its targets."""
    p = mb.prompt_length
    real = mb.attention_mask.bool()
    sampled = mb.response_mask.bool()
    rows, cols = sampled.nonzero(as_tuple=True)
    tokens = mb.responses[rows, cols]
    if packed:
        # Flat index of each real token in the packed row; the predictor of the response
        # token at column p + c is the token at column p + c - 1 (last prompt token for c=0).
        index = real.flatten().cumsum(0).view_as(real) - 1
        positions = index[rows, p + cols - 1]
        lengths = real.sum(-1)
        bounds = (0, *torch.cumsum(lengths, 0).tolist())
        return ModelInput(
            input_ids=mb.input_ids[real].unsqueeze(0),
            position_ids=mb.position_ids[real].unsqueeze(0),
            attention_mask=None,
            bounds=bounds,
            targets=Targets(positions, tokens, rows, cols),
        )
    # The head sees columns p - 1 .. p + r - 1 of each row; column p + c - 1 predicts c.
    kept = mb.response_length + 1
    return ModelInput(
        input_ids=mb.input_ids,
        position_ids=mb.position_ids,
        attention_mask=mb.attention_mask,
        bounds=None,
        targets=Targets(rows * kept + cols, tokens, rows, cols),
        logits_to_keep=kept,
    )


def scatter_rows(values: torch.Tensor, targets: Targets, shape: tuple[int, int]) -> torch.Tensor:
    """[k] per-target values into a zero [rows, R] tensor (differentiable)."""
    out = values.new_zeros(shape)
    return out.index_put((targets.rows.to(values.device), targets.cols.to(values.device)), values)
