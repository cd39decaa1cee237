"""The ranks' shared helpers (``trainer.workers.dist``) without a process group: the identity
of a one-rank world, micro-batch groups, and the clipped step that skips a non-finite norm."""

from __future__ import annotations

import math

import pytest
import torch

from tests.unit.trainer.test_micro_batches import make_batch
from trainer.workers.dist import (
    all_reduce_floats,
    clip_and_step,
    micro_batch_groups,
    this_rank,
    world_size,
)


def test_without_a_process_group_the_world_is_one_rank_and_reductions_are_the_identity():
    assert (world_size(), this_rank()) == (1, 0)
    assert all_reduce_floats([1.5, -2.0]) == [1.5, -2.0]
    assert all_reduce_floats([3.0], op="max") == [3.0]


def test_micro_batch_groups_are_fixed_or_fit_the_token_budget():
    batch = make_batch([3, 5, 2, 4], [4, 2, 6, 1])
    fixed = micro_batch_groups(batch, 3, dynamic=False, max_tokens=0)
    assert [g.tolist() for g in fixed] == [[0, 1, 2], [3]]
    dynamic = micro_batch_groups(batch, 0, dynamic=True, max_tokens=9, packed=True)
    assert sorted(i for g in dynamic for i in g.tolist()) == [0, 1, 2, 3]
    prompt, response = batch.lengths()
    assert all(int((prompt + response)[g].sum()) <= 9 for g in dynamic)


def _model_with_grad(value: float) -> torch.nn.Module:
    model = torch.nn.Linear(2, 1, bias=False)
    model.weight.grad = torch.full_like(model.weight, value)
    return model


def test_clip_and_step_clips_steps_and_zeroes_the_grads():
    model = _model_with_grad(3.0)
    before = model.weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    norm = clip_and_step(model, optimizer, None, max_norm=1.0)
    assert math.isclose(norm, math.sqrt(18.0), rel_tol=1e-6)  # the norm before clipping
    step = before - model.weight.detach()
    assert math.isclose(float(step.norm()), 1.0, rel_tol=1e-5)  # clipped to max_norm
    assert model.weight.grad is None


@pytest.mark.filterwarnings(r"ignore:Detected call of `lr_scheduler.step\(\)`")
def test_a_non_finite_norm_skips_the_optimizer_step_but_not_the_schedule():
    model = _model_with_grad(float("nan"))
    before = model.weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    norm = clip_and_step(model, optimizer, scheduler, max_norm=1.0)
    assert math.isnan(norm)
    assert torch.equal(model.weight.detach(), before)
    assert optimizer.param_groups[0]["lr"] == 0.5
    assert model.weight.grad is None
