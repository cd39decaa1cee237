"""verl's validation metrics (``val-core``/``val-aux``): mean/std/best/worst/maj at n and the
bootstrap sizes, their section, voting on the reward's ``pred`` only when every response has
one, and the vectorised bootstrap equal to drawing one sample at a time."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from trainer.metrics.validation import (
    bootstrap_extremes,
    bootstrap_majority,
    group_metrics,
    validation_metrics,
)


def draw_one_at_a_time(values: list[float], votes: list[Any] | None, k: int, seed: int = 42):
    """The bootstrap by its definition: 1000 draws of ``k`` with replacement from a generator
    seeded once, each reduced on its own (max, min, and the value of the first response that
    gave the most common answer, ties to the answer drawn first)."""
    rng = np.random.RandomState(seed)
    best, worst, maj = [], [], []
    for _ in range(1000):
        idx = rng.choice(len(values), size=k, replace=True)
        drawn = [values[i] for i in idx]
        best.append(max(drawn))
        worst.append(min(drawn))
        if votes is not None:
            answers = [votes[i] for i in idx]
            counts = Counter(answers)  # insertion order: first drawn first
            top = max(counts.values())
            winner = next(a for a in counts if counts[a] == top)
            maj.append(drawn[answers.index(winner)])
    return best, worst, maj


def test_one_response_per_prompt_is_mean_at_1_in_val_core():
    out = validation_metrics(
        ["gsm8k", "gsm8k", "math"], ["a", "b", "c"], [1.0, 0.0, 0.5], num_turns=[2, 4, 3]
    )
    assert out == {
        "val-core/gsm8k/reward/mean@1": 0.5,  # the mean over prompts
        "val-core/math/reward/mean@1": 0.5,
        "val-aux/num_turns/min": 2.0,
        "val-aux/num_turns/max": 4.0,
        "val-aux/num_turns/mean": 3.0,
    }


def test_n_responses_give_verls_names_and_sections():
    uids = ["p0"] * 4 + ["p1"] * 4
    scores = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    preds = ["7", "3", "3", "7", "1", "2", "2", "9"]
    out = validation_metrics(["s"] * 8, uids, scores, {"pred": preds})
    core = {k.removeprefix("val-core/s/reward/") for k in out if k.startswith("val-core/")}
    aux = {k.removeprefix("val-aux/s/reward/") for k in out if k.startswith("val-aux/")}
    assert core == {"mean@4", "best@4/mean", "best@4/std", "maj@4/mean", "maj@4/std"}
    assert aux == {
        "std@4",
        "best@2/mean",
        "best@2/std",
        "worst@2/mean",
        "worst@2/std",
        "worst@4/mean",
        "worst@4/std",
        "maj@2/mean",
        "maj@2/std",
    }
    assert out["val-core/s/reward/mean@4"] == pytest.approx(3 / 8)
    assert out["val-aux/s/reward/std@4"] == pytest.approx((0.5 + np.std([0, 0, 0, 1])) / 2)


def test_sizes_double_up_to_n():
    names = group_metrics([0.0, 1.0, 0.0, 1.0, 1.0])
    assert sorted({n.split("/")[0] for n in names}) == [
        "best@2",
        "best@4",
        "best@5",
        "mean@5",
        "std@5",
        "worst@2",
        "worst@4",
        "worst@5",
    ]


@pytest.mark.parametrize("k", [2, 3, 6])
def test_best_and_worst_equal_the_one_at_a_time_bootstrap(k):
    values = [0.0, 1.0, 0.25, 0.0, 0.75, 0.5]
    best, worst, _ = draw_one_at_a_time(values, None, k)
    got = bootstrap_extremes(np.array(values), k)
    expected = (np.mean(best), np.std(best), np.mean(worst), np.std(worst))
    assert got == pytest.approx(expected, abs=1e-12)


def test_best_of_two_of_a_coin_is_three_quarters():
    best, _, worst, _ = bootstrap_extremes(np.array([0.0, 1.0]), 2)
    assert best == pytest.approx(0.75, abs=0.03) and worst == pytest.approx(0.25, abs=0.03)


@pytest.mark.parametrize(
    ("values", "votes", "k"),
    [
        ([1.0, 1.0, 0.0], ["x", "x", "y"], 3),
        ([1.0, 0.0], ["x", "y"], 2),  # every mixed draw is a tie: the answer drawn first wins
        ([1.0, 0.0, 0.0, 1.0, 0.5], ["a", "b", "b", "a", "c"], 4),
        ([0.2, 0.4, 0.6, 0.8], [1, 1, 1, 1], 4),  # one answer: the first drawn response's value
    ],
)
def test_majority_equals_the_one_at_a_time_bootstrap(values, votes, k):
    _, _, maj = draw_one_at_a_time(values, votes, k)
    got = bootstrap_majority(np.array(values), votes, k)
    assert got == pytest.approx((np.mean(maj), np.std(maj)), abs=1e-12)


def test_a_majority_that_is_always_right_scores_one():
    # 3 of 4 responses say the right answer: maj@4 is wrong only when "b" wins a draw
    mean, _ = bootstrap_majority(np.array([1.0, 1.0, 1.0, 0.0]), ["a", "a", "a", "b"], 4)
    assert 0.85 < mean < 1.0
    mean, std = bootstrap_majority(np.array([1.0, 1.0]), ["a", "a"], 2)
    assert (mean, std) == (1.0, 0.0)


def test_no_pred_or_a_missing_pred_logs_no_maj():
    uids, scores = ["p"] * 2 + ["q"] * 2, [1.0, 0.0, 0.0, 1.0]
    without = validation_metrics(["s"] * 4, uids, scores, {"acc_note": ["x"] * 4})
    partial = validation_metrics(["s"] * 4, uids, scores, {"pred": ["1", "2", None, "1"]})
    for out in (without, partial):
        assert out and not any("maj@" in k for k in out)
    # the other source votes: its every response has a pred
    mixed = validation_metrics(["s", "s", "t", "t"], uids, scores, {"pred": [None, "1", "2", "2"]})
    assert not any(k.startswith(("val-core/s/reward/maj", "val-aux/s/reward/maj")) for k in mixed)
    assert "val-core/t/reward/maj@2/mean" in mixed


def test_a_numeric_acc_is_the_core_variable_and_text_keys_are_skipped():
    out = validation_metrics(
        ["s"] * 2,
        ["p", "p"],
        [1.0, 0.0],
        {"acc": [True, False], "pred": ["4", "5"], "reason": ["ok", "no"]},
    )
    assert out["val-core/s/acc/mean@2"] == 0.5
    assert "val-aux/s/reward/mean@2" in out and "val-core/s/reward/mean@2" not in out
    assert "val-core/s/acc/maj@2/mean" in out and "val-aux/s/reward/maj@2/mean" in out
    assert not any("/reason/" in k or "/pred/" in k for k in out)
