"""``PromptSampler``: seeded per-epoch shuffles of whole batches, and a state that makes a
resumed run draw exactly the batches the uninterrupted run would have drawn."""

from __future__ import annotations

import pytest

from trainer.data.sampler import PromptSampler

ROWS = [{"id": i} for i in range(10)]


def ids(batch: list[dict]) -> list[int]:
    return [row["id"] for row in batch]


def epoch(sampler: PromptSampler) -> list[list[int]]:
    return [ids(sampler.next_batch()) for _ in range(len(sampler))]


def test_each_epoch_is_a_permutation_with_the_remainder_dropped():
    sampler = PromptSampler(ROWS, batch_size=3, seed=7)
    assert len(sampler) == 3
    for _ in range(3):
        batches = epoch(sampler)
        assert all(len(b) == 3 for b in batches)
        flat = [i for b in batches for i in b]
        assert len(set(flat)) == 9  # 9 distinct rows, the 10th is this epoch's remainder
        assert set(flat) <= set(range(10))


def test_epochs_differ_and_the_same_seed_gives_the_same_order():
    a, b = PromptSampler(ROWS, 5, seed=3), PromptSampler(ROWS, 5, seed=3)
    a_epochs = [epoch(a) for _ in range(3)]
    assert a_epochs == [epoch(b) for _ in range(3)]
    assert a_epochs[0] != a_epochs[1] != a_epochs[2]
    assert epoch(PromptSampler(ROWS, 5, seed=4)) != a_epochs[0]


def test_without_shuffle_rows_come_in_order():
    sampler = PromptSampler(ROWS, 4, shuffle=False)
    assert epoch(sampler) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert epoch(sampler) == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("taken", [0, 1, 3, 4, 5])
def test_a_restored_state_continues_with_the_next_batch_across_epochs(taken):
    uninterrupted = PromptSampler(ROWS, 3, seed=11)
    for _ in range(taken):
        uninterrupted.next_batch()
    state = uninterrupted.state_dict()
    resumed = PromptSampler(ROWS, 3, seed=11)
    resumed.load_state_dict(dict(state))
    expected = [ids(uninterrupted.next_batch()) for _ in range(7)]  # crosses 2 epoch ends
    assert [ids(resumed.next_batch()) for _ in range(7)] == expected


def test_state_survives_a_json_round_trip():
    import json

    sampler = PromptSampler(ROWS, 3, seed=1)
    for _ in range(4):
        sampler.next_batch()
    state = json.loads(json.dumps(sampler.state_dict()))
    assert state == {"epoch": 1, "position": 1, "offset": 3, "requeued": []}
    fresh = PromptSampler(ROWS, 3, seed=1)
    fresh.load_state_dict(state)
    assert ids(fresh.next_batch()) == ids(sampler.next_batch())


def test_fewer_rows_than_the_batch_size_is_a_clear_error():
    with pytest.raises(ValueError) as err:
        PromptSampler(ROWS[:3], batch_size=4)
    assert str(err.value) == (
        "3 training rows are fewer than data.train_batch_size=4: "
        "lower data.train_batch_size or add rows"
    )


def test_rows_one_at_a_time_follow_the_batches_and_requeued_keys_come_first():
    batches = PromptSampler(ROWS, batch_size=3, seed=7)
    rows = PromptSampler(ROWS, batch_size=3, seed=7)
    expected = [i for _ in range(2) for i in ids(batches.next_batch())]
    drawn = [rows.next_row() for _ in range(6)]
    assert [row["id"] for _, row in drawn] == expected
    assert [key for key, _ in drawn] == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (0, 5)]
    state = rows.state_dict(in_flight=[(0, 4), (0, 5)])
    assert state == {"epoch": 0, "position": 2, "offset": 6, "requeued": [[0, 4], [0, 5]]}
    resumed = PromptSampler(ROWS, batch_size=3, seed=7)
    resumed.load_state_dict(state)
    again = [resumed.next_row() for _ in range(3)]
    assert [key for key, _ in again] == [(0, 4), (0, 5), (0, 6)]
    assert [row["id"] for _, row in again] == [
        expected[4],
        expected[5],
        ids(batches.next_batch())[0],
    ]


def test_an_old_checkpoint_state_without_offset_still_loads():
    sampler = PromptSampler(ROWS, batch_size=3, seed=7)
    sampler.load_state_dict({"epoch": 2, "position": 1})
    assert (sampler.epoch, sampler.offset, sampler.requeued) == (2, 3, [])
