"""``TrainBatch`` slicing and trimming keep the prompt|response layout; balanced micro-batches
cover every sample once and fit the token budget."""

from __future__ import annotations

import pytest
import torch

from trainer.workers import WorkerGroup
from trainer.workers.batch import (
    TrainBatch,
    balanced_micro_batches,
    fixed_micro_batches,
    pad_for_ranks,
    spread_rows,
)
from trainer.workers.dist import without_idle_groups


def make_batch(prompt_lens: list[int], resp_lens: list[int], p: int = 8, r: int = 10):
    """Left-padded prompts, right-padded responses, pad id 0, real ids >= 1."""
    n = len(prompt_lens)
    g = torch.Generator().manual_seed(0)
    attn = torch.zeros(n, p + r, dtype=torch.long)
    for i, (lp, lr) in enumerate(zip(prompt_lens, resp_lens, strict=True)):
        attn[i, p - lp : p + lr] = 1
    ids = torch.randint(1, 100, (n, p + r), generator=g) * attn
    mask = attn[:, p:].clone()
    mask[:, 1] = 0  # a tool token
    return TrainBatch(
        input_ids=ids,
        attention_mask=attn,
        position_ids=(attn.cumsum(1) - 1).clamp(min=0),
        response_mask=mask,
        old_log_probs=torch.randn(n, r, generator=g) * mask,
        advantages=torch.randn(n, r, generator=g) * mask,
    )


def test_trimmed_drops_only_all_padding_columns_and_keeps_the_layout():
    batch = make_batch([3, 5, 2], [4, 2, 6])  # P=8, R=10: keep 5 prompt, 6 response columns
    t = batch.trimmed()
    assert t.input_ids.shape == (3, 11) and t.prompt_length == 5 and t.response_length == 6
    for name in ("input_ids", "attention_mask", "position_ids"):
        assert torch.equal(getattr(t, name), getattr(batch, name)[:, 3:14])
    for name in ("response_mask", "old_log_probs", "advantages"):
        assert torch.equal(getattr(t, name), getattr(batch, name)[:, :6])
    assert t.ref_log_probs is None
    assert torch.equal(t.responses, batch.responses[:, :6])
    # nothing real was dropped
    assert t.attention_mask.sum() == batch.attention_mask.sum()
    assert torch.equal(torch.stack(t.lengths()), torch.stack(batch.lengths()))


def test_trimmed_of_a_full_batch_is_the_same_batch():
    batch = make_batch([8, 8], [10, 10])
    t = batch.trimmed()
    for name in ("input_ids", "response_mask", "advantages"):
        assert torch.equal(getattr(t, name), getattr(batch, name))


def test_trimmed_keeps_one_column_when_responses_are_empty():
    t = make_batch([2, 3], [0, 0]).trimmed()
    assert t.prompt_length == 3 and t.response_length == 1


def test_chunk_select_and_cat_round_trip():
    batch = make_batch([1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1])
    parts = batch.chunk(3)
    assert [len(p) for p in parts] == [2, 2, 2]
    assert torch.equal(parts[1].input_ids, batch.input_ids[2:4])
    joined = TrainBatch.cat(parts)
    perm = torch.tensor([4, 0, 5, 2, 1, 3])
    back = batch.select(perm).select(torch.argsort(perm))
    for other in (joined, back):
        for name in ("input_ids", "attention_mask", "position_ids", "response_mask", "advantages"):
            assert torch.equal(getattr(other, name), getattr(batch, name))
        assert other.ref_log_probs is None


def test_chunk_into_unequal_parts_is_an_error():
    with pytest.raises(ValueError) as err:
        make_batch([1] * 5, [1] * 5).chunk(2)
    assert str(err.value) == "batch of 5 samples does not split into 2 equal parts"


def test_fixed_micro_batches_are_consecutive_with_a_short_last_one():
    groups = fixed_micro_batches(7, 3)
    assert [g.tolist() for g in groups] == [[0, 1, 2], [3, 4, 5], [6]]


@pytest.mark.parametrize("seed", range(20))
def test_balanced_groups_cover_every_sample_once_within_the_budget(seed):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 40, (1,), generator=g))
    tokens = torch.randint(1, 200, (n,), generator=g)
    max_tokens = int(tokens.max()) + int(torch.randint(0, 400, (1,), generator=g))
    min_count = int(torch.randint(1, n + 1, (1,), generator=g))
    groups = balanced_micro_batches(tokens, max_tokens, min_count=min_count)
    flat = torch.cat(groups).tolist()
    assert sorted(flat) == list(range(n))
    assert len(groups) >= min_count
    for group in groups:
        assert len(group) > 0
        assert group.tolist() == sorted(group.tolist())
        assert len(group) * int(tokens[group].max()) <= max_tokens


def test_balanced_groups_use_one_group_when_everything_fits():
    groups = balanced_micro_batches(torch.tensor([5, 3, 4]), max_tokens=15)
    assert [g.tolist() for g in groups] == [[0, 1, 2]]


def test_a_sample_over_the_budget_is_a_clear_error():
    with pytest.raises(ValueError) as err:
        balanced_micro_batches(torch.tensor([10, 30, 20]), max_tokens=25)
    assert str(err.value) == (
        "a sample has 30 tokens, over actor.ppo_max_token_len_per_gpu=25: "
        "raise it to at least prompt_length + response_length"
    )


# ---- filler rows: any sample count over ranks x mini-batches --------------------------------
def test_spread_rows_is_the_identity_when_the_parts_divide():
    assert torch.equal(spread_rows(12, 4), torch.arange(12))


def test_spread_rows_cuts_near_equal_consecutive_parts_and_fills_each():
    # 10 rows in 4 parts: 3, 3, 2, 2 -> each filled to 3
    assert spread_rows(10, 4).tolist() == [0, 1, 2, 3, 4, 5, 6, 7, -1, 8, 9, -1]
    assert spread_rows(2, 3).tolist() == [0, 1, -1]


@pytest.mark.parametrize(("n", "cells"), [(0, 2), (3, 0)])
def test_spread_rows_of_nothing_is_an_error(n, cells):
    with pytest.raises(ValueError) as err:
        spread_rows(n, cells)
    assert str(err.value) == f"cannot spread {n} rows over {cells} parts"


def test_filler_rows_train_nothing_and_keep_the_real_rows_in_order():
    batch = make_batch([3, 2, 5, 1, 4], [4, 6, 2, 3, 5])
    batch.weights = torch.tensor([0.5, 0.5, 1.0, 1.0, 1.0])
    padded, real, per_mini = pad_for_ranks(batch, world_size=2, mini_batches=2)
    # 5 rows over 2 ranks x 2 mini-batches: parts of 2, 1, 1, 1, each filled to 2
    assert per_mini == 2 and len(padded) == 8
    assert real.tolist() == [True, True, True, False, True, False, True, False]
    for name in ("input_ids", "attention_mask", "response_mask", "advantages", "weights"):
        assert torch.equal(getattr(padded, name)[real], getattr(batch, name)), name
    fill = ~real
    assert padded.attention_mask[fill].sum(-1).tolist() == [1, 1, 1]  # one prompt token
    assert padded.attention_mask[fill, batch.prompt_length - 1].tolist() == [1, 1, 1]
    assert padded.position_ids[fill].abs().sum() == 0
    assert padded.response_mask[fill].abs().sum() == 0
    assert padded.advantages[fill].abs().sum() == 0 and padded.old_log_probs[fill].abs().sum() == 0
    assert padded.weights[fill].tolist() == [0.0, 0.0, 0.0]
    assert padded.ref_log_probs is None
    assert [len(share) for share in padded.chunk(2)] == [4, 4]
    # the batch itself is untouched
    assert batch.attention_mask.sum() > 0 and len(batch) == 5


def test_pad_for_ranks_returns_a_batch_that_splits_evenly_as_it_is():
    batch = make_batch([1, 2, 3, 4], [1, 2, 3, 4])
    padded, real, per_mini = pad_for_ranks(batch, world_size=2, mini_batches=2)
    assert padded is batch and bool(real.all()) and per_mini == 1


def test_filler_rows_of_a_batch_without_weights_weigh_zero_and_the_rest_one():
    padded, _, _ = pad_for_ranks(make_batch([1, 2, 3], [1, 2, 3]), world_size=2)
    assert padded.weights is not None and padded.weights.tolist() == [1.0, 1.0, 1.0, 0.0]


def test_trimmed_keeps_per_sample_weights_whole():
    batch = make_batch([2, 3], [1, 2])
    batch.weights = torch.tensor([0.25, 1.0])
    assert torch.equal(batch.trimmed().weights, batch.weights)


@pytest.mark.parametrize(
    "kwargs", [{}, {"samples_per_mini_batch": 2, "mini_batches": 2}], ids=["neither", "both"]
)
def test_update_actor_takes_one_mini_batch_size(kwargs):
    group = WorkerGroup.__new__(WorkerGroup)  # no ranks: the arguments fail first
    group.world_size = 2
    with pytest.raises(ValueError) as err:
        group.update_actor(make_batch([1, 2], [1, 2]), seed=0, **kwargs)
    assert str(err.value) == "update_actor takes one of samples_per_mini_batch and mini_batches"


def test_micro_batches_without_a_sampled_token_are_left_out():
    batch = make_batch([3, 5, 2, 4, 1], [4, 2, 6, 3, 5]).skipping(
        torch.tensor([False, True, True, False, True])
    )
    groups = fixed_micro_batches(len(batch), 1)
    assert [g.tolist() for g in without_idle_groups(batch, groups)] == [[0], [3]]
    groups = fixed_micro_batches(len(batch), 2)  # [0, 1] [2, 3] [4]: the last is idle
    assert [g.tolist() for g in without_idle_groups(batch, groups)] == [[0, 1], [2, 3]]


def test_an_idle_batch_keeps_one_micro_batch_so_the_optimizer_steps_on_zeros():
    batch = make_batch([3, 5, 2], [4, 2, 6]).skipping(torch.tensor([True, True, True]))
    kept = without_idle_groups(batch, fixed_micro_batches(3, 1))
    assert [g.tolist() for g in kept] == [[0]]


def test_a_rank_keeps_idle_micro_batches_to_run_as_many_as_the_busiest_rank(monkeypatch):
    """Another rank has 3 micro-batches with sampled tokens and this one 1: this one runs its
    first 2 idle ones as well, so both run 3 forwards (FSDP's collectives pair them)."""
    import trainer.workers.dist as dist_mod

    asked = []

    def busiest(values, op="sum"):
        asked.append((values, op))
        return [3.0]

    monkeypatch.setattr(dist_mod, "all_reduce_floats", busiest)
    batch = make_batch([3, 5, 2, 4, 1], [4, 2, 6, 3, 5]).skipping(
        torch.tensor([True, False, True, True, True])
    )
    kept = without_idle_groups(batch, fixed_micro_batches(5, 1))
    assert asked == [([1.0], "max")]
    assert [g.tolist() for g in kept] == [[0], [1], [2]]
