"""``trainer.workers.inert``: which rows the actor update skips (advantage 0 on every sampled
token), when skipping would change the update and so does not happen (each reason named), and
the stand-ins' token counts surviving the rank layout's own fillers. That the update of a
batch with stand-ins equals the whole batch's is in ``test_policy_update.py``."""

from __future__ import annotations

import pytest
import torch

from tests.unit.trainer.test_micro_batches import make_batch
from trainer.algos.correction import CorrectionSpec
from trainer.config.actor import ActorConfig, PolicyLossSettings
from trainer.workers.balance import rank_layout
from trainer.workers.inert import inert_rows, skip_inert_rows, skip_problem


def zero_rows(rows: list[int]):
    batch = make_batch([3, 5, 2, 4, 1], [4, 2, 6, 5, 3])  # token 1 of each response: a tool's
    batch.advantages[rows] = 0.0
    return batch


def test_inert_rows_have_sampled_tokens_all_of_advantage_0():
    batch = zero_rows([1, 3])
    batch.advantages[0, 1] = 0.0  # row 0: zero on one token (a tool token), not all
    batch.advantages[2] = 0.0
    batch.advantages[2, 1] = 5.0  # row 2: nonzero on an unsampled token only: inert
    assert inert_rows(batch).tolist() == [False, True, True, True, False]
    batch.response_mask[4] = 0  # row 4: nothing sampled (a filler): nothing to skip
    batch.advantages[4] = 0.0
    assert inert_rows(batch).tolist() == [False, True, True, True, False]


@pytest.mark.parametrize(
    "actor, correction, reason",
    [
        ({"skip_zero_advantage_rows": False}, {}, "actor.skip_zero_advantage_rows=False"),
        (
            {"policy_loss": PolicyLossSettings(loss_mode="clip_cov")},
            {},
            "actor.policy_loss.loss_mode='clip_cov' (skips with vanilla, gpg, cispo)",
        ),
        (
            {"policy_loss": PolicyLossSettings(loss_mode="gspo")},
            {},
            "actor.policy_loss.loss_mode='gspo' (skips with vanilla, gpg, cispo)",
        ),
        (
            {"loss_agg_mode": "seq-mean-token-sum"},
            {},
            "actor.loss_agg_mode='seq-mean-token-sum' (skips with token-mean)",
        ),
        ({"entropy_coeff": 0.01}, {}, "actor.entropy_coeff=0.01 (an entropy term)"),
        ({"use_kl_loss": True}, {}, "actor.use_kl_loss=True (a KL term)"),
        ({}, {"rollout_is": "token"}, "algorithm.rollout_correction is on"),
        ({}, {"bypass": True}, "algorithm.rollout_correction is on"),
    ],
)
def test_an_update_that_skipping_would_change_computes_every_row(actor, correction, reason):
    cfg, spec = ActorConfig(**actor), CorrectionSpec(**correction)
    assert skip_problem(cfg, spec) == reason
    batch = zero_rows([1, 3])
    computed, skipped = skip_inert_rows(batch, cfg, spec)
    assert computed is batch and not skipped.any()


@pytest.mark.parametrize("loss", ["vanilla", "gpg", "cispo"])
def test_the_default_update_skips_with_the_losses_zero_at_zero_advantage(loss):
    cfg = ActorConfig(policy_loss=PolicyLossSettings(loss_mode=loss))
    assert skip_problem(cfg, CorrectionSpec()) is None
    batch = zero_rows([1, 3])
    computed, skipped = skip_inert_rows(batch, cfg, CorrectionSpec())
    assert skipped.tolist() == [False, True, False, True, False]
    assert computed.response_mask[[1, 3]].sum() == 0 and computed.weights[[1, 3]].sum() == 0
    assert torch.equal(computed.response_mask[[0, 2, 4]], batch.response_mask[[0, 2, 4]])
    assert batch.response_mask[[1, 3]].sum() == 1 + 4  # the input batch is left as it was
    nothing = make_batch([2, 2], [3, 3])
    same, none = skip_inert_rows(nothing, cfg, CorrectionSpec())
    assert same is nothing and not none.any()


def test_the_rank_layouts_fillers_do_not_copy_a_stand_ins_tokens():
    """5 rows over 2 ranks and 2 mini-batches: 3 fillers, each a copy of row 0 made empty;
    row 0 is itself a stand-in, and its count must not be copied into them."""
    batch = zero_rows([0, 3])
    computed, _ = skip_inert_rows(batch, ActorConfig(), CorrectionSpec())
    tokens = batch.response_mask.sum(-1).float()
    assert computed.stand_in_tokens.tolist() == [float(tokens[0]), 0.0, 0.0, float(tokens[3]), 0.0]
    layout = rank_layout(computed, world=2, mini_batches=2, balance=True)
    assert len(layout.padded) == 8
    assert float(layout.padded.stand_in_tokens.sum()) == float(tokens[0] + tokens[3])
    assert torch.equal(layout.padded.stand_in_tokens[layout.order], computed.stand_in_tokens)
