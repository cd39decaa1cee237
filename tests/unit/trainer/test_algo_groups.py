"""The group statistics every group estimator reads (``trainer.algos.groups``) and the rollout
correction's importance weights (``trainer.algos.correction``), as public building blocks."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.algos import (
    ONE_SAMPLE,
    group_index,
    group_stats,
    sample_weights,
)


def test_group_index_numbers_string_ids_in_order_of_first_appearance():
    assert group_index(["b", "a", "b", "c"]).tolist() == [0, 1, 0, 2]
    assert group_index(torch.tensor([7, 3, 7])).tolist() == [1, 0, 1]


def test_sample_weights_default_to_one_and_refuse_a_wrong_shape_or_a_negative():
    scores = torch.tensor([1.0, 2.0])
    assert sample_weights(None, scores).tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="one weight per sample"):
        sample_weights(torch.ones(3), scores)
    with pytest.raises(ValueError, match="must be >= 0"):
        sample_weights(torch.tensor([1.0, -0.5]), scores)


def test_group_stats_weigh_each_sample_and_a_split_session_counts_once():
    scores = torch.tensor([1.0, 3.0, 2.0, 2.0, 5.0])
    index = group_index(["g", "g", "h", "h", "k"])
    weights = torch.tensor([1.0, 1.0, 0.5, 0.5, 1.0])  # h: one session in two segments
    count, mean, std = group_stats(scores, index, weights)
    assert count.tolist() == [2.0, 2.0, 1.0, 1.0, 1.0]
    assert mean.tolist() == [2.0, 2.0, 2.0, 2.0, 5.0]
    assert math.isclose(float(std[0]), math.sqrt(2.0), rel_tol=1e-6)
    assert std[4] == 0  # a group of one
    assert (count > ONE_SAMPLE).tolist() == [True, True, False, False, False]
