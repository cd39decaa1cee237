"""``trainer.balance_batch``: rows spread over the ranks by token count within each mini-batch
(each mini-batch keeps its rows, each rank its row count), the imbalance before and after, and
results returned in the batch's order."""

from __future__ import annotations

import pytest
import torch

from tests.unit.trainer.test_micro_batches import make_batch
from trainer.workers.balance import rank_imbalance, rank_layout
from trainer.workers.batch import pad_for_ranks, spread_rows


def lengths_batch(seed: int = 0, n: int = 16):
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1, 6, (n,), generator=g).tolist()
    responses = torch.randint(1, 30, (n,), generator=g).tolist()
    return make_batch(prompts, responses)


def cells(layout, world: int, minis: int) -> list[list[list[int]]]:
    """Each rank's original rows per mini-batch (fillers left out)."""
    inverse = {int(p): i for i, p in enumerate(layout.order)}
    per = layout.per_mini
    return [
        [
            [inverse[p] for p in range((r * minis + j) * per, (r * minis + j + 1) * per)
             if p in inverse]
            for j in range(minis)
        ]
        for r in range(world)
    ]  # fmt: skip


def test_balancing_keeps_each_mini_batch_and_each_ranks_row_count():
    batch = lengths_batch()
    plain = rank_layout(batch, world=2, mini_batches=2)
    balanced = rank_layout(batch, world=2, mini_batches=2, balance=True)
    before, after = cells(plain, 2, 2), cells(balanced, 2, 2)
    for j in range(2):
        assert sorted(before[0][j] + before[1][j]) == sorted(after[0][j] + after[1][j])
        assert [len(before[r][j]) for r in range(2)] == [len(after[r][j]) for r in range(2)]
    assert balanced.after < balanced.before
    assert balanced.after < 1.05  # 8 rows per mini-batch of 1-34 tokens: near even
    assert balanced.metrics() == {
        "balance/imbalance_before": balanced.before,
        "balance/imbalance_after": balanced.after,
    }


def test_the_layout_holds_every_row_once_and_order_finds_it():
    batch = lengths_batch(seed=1, n=13)  # does not split evenly: fillers
    layout = rank_layout(batch, world=2, mini_batches=3, balance=True)
    assert len(layout.padded) == 2 * 3 * layout.per_mini
    assert sorted(layout.order.tolist()) == layout.order.unique().tolist()
    for name in ("input_ids", "attention_mask", "response_mask"):
        assert torch.equal(getattr(layout.padded, name)[layout.order], getattr(batch, name))


def test_without_balance_the_layout_is_pad_for_ranks():
    batch = lengths_batch(seed=2, n=11)
    layout = rank_layout(batch, world=2, mini_batches=2)
    padded, real, per_mini = pad_for_ranks(batch, 2, 2)
    assert torch.equal(layout.padded.input_ids, padded.input_ids)
    assert torch.equal(layout.order, torch.nonzero(real).flatten())
    assert layout.per_mini == per_mini and layout.before == layout.after


def test_imbalance_is_the_heaviest_rank_over_the_mean():
    tokens = torch.tensor([10, 10, 30, 10])
    index = spread_rows(4, 2)  # rank 0: rows 0, 1 (20 tokens); rank 1: rows 2, 3 (40)
    assert rank_imbalance(index, tokens, world=2, minis=1) == pytest.approx(40 / 30)
