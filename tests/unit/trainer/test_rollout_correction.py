"""verl's rollout-correction family (``trainer.algos.correction``): every weight, mask and
metric against a float64 reference written from its definition with loops; the presets (the
old ``tis`` / ``decoupled``, ``icepop``, ``seq_mask_tis``) resolved onto the keys; bad
settings refused naming their key."""

from __future__ import annotations

import math

import pytest
import torch

import trainer.config as config_pkg
from trainer.algos.correction import (
    CorrectionSpec,
    Rejection,
    correct,
    mismatch_metrics,
    weight_metrics,
)
from trainer.config.rollout_correction import RolloutCorrectionConfig

B, R = 5, 7


def sample() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Old and rollout log-probs with log-ratios in about [-2, 2], padding and a tool span."""
    g = torch.Generator().manual_seed(3)
    rollout = -torch.rand(B, R, generator=g, dtype=torch.float64) * 3
    old = rollout + (torch.rand(B, R, generator=g, dtype=torch.float64) - 0.5) * 4
    mask = torch.ones(B, R, dtype=torch.float64)
    mask[1, 4:] = 0  # a shorter response
    mask[2, 1:3] = 0  # tool tokens
    mask[3, 6] = 0
    old[3, 0] = rollout[3, 0] + math.log(1e-5)  # a catastrophic token
    return old, rollout, mask


def tokens(mask: torch.Tensor, i: int) -> list[int]:
    return [t for t in range(R) if mask[i, t] > 0]


def stat_of(option: str, old, rollout, mask, i: int, t: int) -> float:
    """A rejection criterion's statistic for token t of row i (its row's, for a sample-level
    criterion), from the definition."""
    level, k = option.rsplit("_", 1)

    def one(s: int) -> float:
        x = float(old[i, s] - rollout[i, s])
        if k == "k1":
            return x
        if k == "k2":
            return 0.5 * x * x
        x = max(-20.0, min(20.0, x))
        return math.exp(x) - 1 - x

    if level == "token":
        return one(t)
    values = [one(s) for s in tokens(mask, i)]
    if level == "seq_sum":
        return sum(values)
    if level == "seq_mean":
        return sum(values) / len(values)
    return max(values)


def passes(rejection: Rejection, value: float) -> bool:
    if rejection.k == "k1":
        lower = rejection.lower if rejection.lower is not None else 1 / rejection.upper
        return (lower == 0 or value >= math.log(lower)) and value <= math.log(rejection.upper)
    return value <= rejection.upper


def reference(spec: CorrectionSpec, old, rollout, mask):
    """(weights or None, accepted) with loops over rows and tokens."""
    accepted = torch.zeros(B, R, dtype=torch.float64)
    for i in range(B):
        vetoed = spec.veto is not None and any(
            float(old[i, t] - rollout[i, t]) < math.log(spec.veto) for t in tokens(mask, i)
        )
        for t in tokens(mask, i):
            ok = not vetoed and all(
                passes(rej, stat_of(rej.option, old, rollout, mask, i, t))
                for rej in spec.rejections
            )
            accepted[i, t] = float(ok)
    if spec.rollout_is is None:
        return None, accepted
    weights = torch.zeros(B, R, dtype=torch.float64)
    for i in range(B):
        for t in tokens(mask, i):
            option = "token_k1" if spec.rollout_is == "token" else "seq_sum_k1"
            r = math.exp(max(-20.0, min(20.0, stat_of(option, old, rollout, mask, i, t))))
            if spec.is_lower is None:
                weights[i, t] = min(r, spec.is_threshold)
            else:
                weights[i, t] = r if spec.is_lower <= r <= spec.is_threshold else 0.0
    if spec.batch_normalize:
        if spec.rollout_is == "token":
            kept = [float(weights[i, t]) for i in range(B) for t in range(R) if accepted[i, t]]
        else:
            kept = [float(weights[i, tokens(mask, i)[0]]) for i in range(B) if accepted[i].any()]
        weights = weights / (sum(kept) / len(kept))
    return weights, accepted


def rs(*criteria: tuple) -> tuple[Rejection, ...]:
    return tuple(Rejection(*c) for c in criteria)


SPECS = {
    "token_is": CorrectionSpec(rollout_is="token", is_threshold=2.0),
    "seq_is": CorrectionSpec(rollout_is="sequence", is_threshold=3.0),
    "icepop": CorrectionSpec(rollout_is="token", is_threshold=2.0, is_lower=0.5),
    "token_is_rs": CorrectionSpec(
        rollout_is="token", is_threshold=2.0, rejections=rs(("token_k1", 2.0, 0.5))
    ),
    "seq_is_rs": CorrectionSpec(
        rollout_is="sequence", is_threshold=2.0, rejections=rs(("seq_sum_k1", 5.0, 0.1))
    ),
    "geo_rs_veto": CorrectionSpec(rejections=rs(("seq_mean_k1", 1.3, 0.8)), veto=1e-4),
    "k2_k3": CorrectionSpec(rejections=rs(("token_k2", 0.5), ("seq_mean_k3", 0.6))),
    "seq_max_sum": CorrectionSpec(
        rejections=rs(("seq_max_k2", 1.5), ("seq_sum_k2", 4.0), ("token_k3", 2.0))
    ),
    "seq_max_k3_mean_k2": CorrectionSpec(rejections=rs(("seq_max_k3", 3.0), ("seq_mean_k2", 0.5))),
    "seq_sum_k3_upper_only": CorrectionSpec(rejections=rs(("seq_sum_k3", 4.0), ("token_k1", 3.0))),
    "token_is_normalized": CorrectionSpec(
        rollout_is="token",
        is_threshold=2.0,
        batch_normalize=True,
        rejections=rs(("token_k1", 3.0, 0.0)),
    ),  # fmt: skip
    "seq_is_normalized": CorrectionSpec(
        rollout_is="sequence", is_threshold=4.0, batch_normalize=True, veto=1e-4
    ),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_weights_and_masks_match_the_definition(name):
    spec = SPECS[name]
    old, rollout, mask = sample()
    want_w, want_mask = reference(spec, old, rollout, mask)
    got = correct(old, rollout, mask, spec)
    torch.testing.assert_close(got.accepted, want_mask, rtol=0, atol=0)
    if want_w is None:
        assert got.weights is None
    else:
        assert got.weights is not None
        torch.testing.assert_close(got.weights, want_w, rtol=1e-12, atol=1e-12)
    if spec.rejects:  # the sample makes every rule bite somewhere
        assert 0 < float(got.accepted.sum()) < float(mask.sum())


def test_the_veto_drops_the_whole_sample_of_a_catastrophic_token():
    old, rollout, mask = sample()
    got = correct(old, rollout, mask, CorrectionSpec(veto=1e-4))
    assert got.accepted[3].sum() == 0 and torch.equal(
        got.accepted[[0, 1, 2, 4]], mask[[0, 1, 2, 4]]
    )


def test_weights_are_zero_off_the_sampled_tokens_and_take_no_gradient():
    old, rollout, mask = sample()
    old = old.clone().requires_grad_(True)
    got = correct(old, rollout, mask, CorrectionSpec(rollout_is="sequence", is_threshold=9.0))
    assert got.weights is not None and not got.weights.requires_grad
    assert bool((got.weights[mask == 0] == 0).all())


def test_mismatch_metrics_match_the_definition():
    old, rollout, mask = sample()
    got = mismatch_metrics(old, rollout, mask)
    pairs = [(i, t) for i in range(B) for t in tokens(mask, i)]
    lr = [float(old[i, t] - rollout[i, t]) for i, t in pairs]
    n = len(pairs)
    log_ppl = [
        -sum(float(old[i, t]) for t in tokens(mask, i)) / len(tokens(mask, i)) for i in range(B)
    ]
    roll_ppl = [
        -sum(float(rollout[i, t]) for t in tokens(mask, i)) / len(tokens(mask, i)) for i in range(B)
    ]
    diff = [r - o for o, r in zip(log_ppl, roll_ppl, strict=True)]
    seq = [sum(float(old[i, t] - rollout[i, t]) for t in tokens(mask, i)) for i in range(B)]
    want = {
        "rollout_corr/kl": sum(-x for x in lr) / n,
        "rollout_corr/k3_kl": sum(math.exp(x) - x - 1 for x in lr) / n,
        "rollout_corr/training_ppl": sum(math.exp(x) for x in log_ppl) / B,
        "rollout_corr/rollout_ppl": sum(math.exp(x) for x in roll_ppl) / B,
        "rollout_corr/training_log_ppl": sum(log_ppl) / B,
        "rollout_corr/rollout_log_ppl": sum(roll_ppl) / B,
        "rollout_corr/ppl_ratio": math.exp(sum(-d for d in diff) / B),
        "rollout_corr/log_ppl_diff": sum(diff) / B,
        "rollout_corr/log_ppl_abs_diff": sum(abs(d) for d in diff) / B,
        "rollout_corr/log_ppl_diff_max": max(diff),
        "rollout_corr/log_ppl_diff_min": min(diff),
        "rollout_corr/chi2_token": sum(math.exp(2 * x) for x in lr) / n - 1,
        "rollout_corr/chi2_seq": sum(math.exp(2 * s) for s in seq) / B - 1,
    }
    assert got == pytest.approx(want, rel=1e-10)
    assert mismatch_metrics(old, rollout, torch.zeros_like(mask)) == {}
    same = mismatch_metrics(old, old, mask)
    assert same["rollout_corr/kl"] == 0 and same["rollout_corr/chi2_seq"] == pytest.approx(0)


def test_weight_metrics_match_the_definition():
    old, rollout, mask = sample()
    spec = CorrectionSpec(
        rollout_is="token", is_threshold=2.0, veto=1e-4,
        rejections=rs(("token_k1", 2.0, 0.5), ("seq_max_k2", 1.5)),
    )  # fmt: skip
    done = correct(old, rollout, mask, spec)
    got = weight_metrics(old, rollout, mask, spec, done)
    pairs = [(i, t) for i in range(B) for t in tokens(mask, i)]
    w = [float(done.weights[i, t]) for i, t in pairs]
    mean = sum(w) / len(w)
    rejected = [(i, t) for i, t in pairs if not done.accepted[i, t]]
    bad = [(i, t) for i, t in pairs if float(old[i, t] - rollout[i, t]) < math.log(1e-4)]
    want = {
        "rollout_corr/rollout_is_mean": mean,
        "rollout_corr/rollout_is_std": math.sqrt(sum((x - mean) ** 2 for x in w) / len(w)),
        "rollout_corr/rollout_is_min": min(w),
        "rollout_corr/rollout_is_max": max(w),
        "rollout_corr/rollout_is_eff_sample_size": 1 / (sum((x / mean) ** 2 for x in w) / len(w)),
        "rollout_corr/rollout_is_ratio_fraction_high": sum(
            float(old[i, t] - rollout[i, t]) > math.log(2.0) for i, t in pairs
        )
        / len(pairs),
        "rollout_corr/rollout_rs_token_k1_mean": sum(
            float(old[i, t] - rollout[i, t]) for i, t in pairs
        )
        / len(pairs),
        "rollout_corr/rollout_rs_token_k1_masked_fraction": sum(
            not passes(spec.rejections[0], float(old[i, t] - rollout[i, t])) for i, t in pairs
        )
        / len(pairs),
        "rollout_corr/rollout_rs_seq_max_k2_mean": sum(
            stat_of("seq_max_k2", old, rollout, mask, i, 0) for i in range(B)
        )
        / B,
        "rollout_corr/rollout_rs_seq_max_k2_masked_fraction": sum(
            not passes(spec.rejections[1], stat_of("seq_max_k2", old, rollout, mask, i, t))
            for i, t in pairs
        )
        / len(pairs),
        "rollout_corr/rollout_rs_masked_fraction": len(rejected) / len(pairs),
        "rollout_corr/rollout_rs_seq_masked_fraction": len({i for i, _ in rejected}) / B,
        "rollout_corr/rollout_is_veto_fraction": len({i for i, _ in bad}) / B,
        "rollout_corr/rollout_is_catastrophic_token_fraction": len(bad) / len(pairs),
    }
    assert got == pytest.approx(want, rel=1e-10)


@pytest.mark.parametrize(
    ("mode", "want"),
    [
        ("none", CorrectionSpec()),
        ("tis", CorrectionSpec(rollout_is="token", is_threshold=3.0)),
        (
            "decoupled",
            CorrectionSpec(
                rollout_is="token", is_threshold=3.0, rejections=rs(("token_k1", 3.0, 0.0))
            ),
        ),
        ("icepop", CorrectionSpec(rollout_is="token", is_threshold=3.0, is_lower=1 / 3)),
        (
            "seq_mask_tis",
            CorrectionSpec(
                rollout_is="token", is_threshold=3.0, rejections=rs(("seq_mean_k1", 3.0, 1 / 3))
            ),
        ),
    ],
)  # fmt: skip
def test_presets_resolve_onto_the_keys(mode, want):
    assert RolloutCorrectionConfig(mode=mode, clip=3.0).spec == want


def test_the_old_modes_weigh_tokens_as_before():
    """``tis``: min(w, clip); ``decoupled``: w where w <= clip, else the token is out."""
    old, rollout, mask = sample()
    w = torch.exp(old - rollout) * mask
    tis = correct(old, rollout, mask, RolloutCorrectionConfig(mode="tis", clip=2.0).spec)
    assert tis.weights is not None
    torch.testing.assert_close(tis.weights, w.clamp(max=2.0) * mask)
    assert torch.equal(tis.accepted, mask)
    dec = correct(old, rollout, mask, RolloutCorrectionConfig(mode="decoupled", clip=2.0).spec)
    assert dec.weights is not None
    torch.testing.assert_close(dec.weights * dec.accepted, torch.where(w <= 2.0, w, 0.0) * mask)


def test_verls_keys_resolve_criteria_and_bounds():
    """The rejection bound defaults to the IS threshold (k1: its reciprocal below); verl's
    older level names are its k1 criteria; several criteria take one bound each, or one for
    all; ``lower_upper`` IS thresholds are IcePop's."""

    def criteria(**keys) -> tuple[Rejection, ...]:
        return RolloutCorrectionConfig(**keys).spec.rejections

    assert criteria(rollout_rs="token", rollout_is_threshold=4.0) == rs(("token_k1", 4.0))
    assert criteria(rollout_rs="geometric", rollout_rs_threshold=1.5) == rs(("seq_mean_k1", 1.5))
    assert criteria(rollout_rs="sequence", rollout_rs_threshold_lower=0.0) == rs(
        ("seq_sum_k1", 2.0, 0.0)
    )
    assert criteria(rollout_rs="token_k1,seq_max_k2", rollout_rs_threshold="0.6_1.6,2.5") == rs(
        ("token_k1", 1.6, 0.6), ("seq_max_k2", 2.5)
    )
    assert criteria(rollout_rs="token_k3, seq_mean_k3", rollout_rs_threshold=0.1) == rs(
        ("token_k3", 0.1), ("seq_mean_k3", 0.1)
    )
    assert criteria(rollout_rs="null") == ()
    spec = RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold="0.5_5.0").spec
    assert (spec.is_lower, spec.is_threshold) == (0.5, 5.0)
    assert RolloutCorrectionConfig(bypass_mode=True, loss_type="reinforce").spec.bypass


KEY = "algorithm.rollout_correction"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"mode": "is"},
            f"{KEY}.mode='is' is not supported; use one of none, tis, decoupled, icepop, "
            "seq_mask_tis",
        ),
        (
            {"rollout_is": "tokens"},
            f"{KEY}.rollout_is='tokens' is not supported; use one of token, sequence or null",
        ),
        (
            {"rollout_rs": "token_k1,geo"},
            f"{KEY}.rollout_rs='token_k1,geo': 'geo' is not a criterion; use token_k1, "
            "token_k2, token_k3, seq_sum_k1, seq_sum_k2, seq_sum_k3, seq_mean_k1, seq_mean_k2, "
            "seq_mean_k3, seq_max_k2, seq_max_k3 (or token, sequence, geometric), comma-joined",
        ),
        (
            {"rollout_rs": "token_k1,seq_max_k2", "rollout_rs_threshold": "1,2,3"},
            f"{KEY}.rollout_rs_threshold='1,2,3' gives 3 bounds for 2 criteria "
            "(token_k1,seq_max_k2): give one, or one per criterion",
        ),
        (
            {"rollout_rs": "seq_max_k2", "rollout_rs_threshold": "0.5_2"},
            f"{KEY}.rollout_rs_threshold='0.5_2': seq_max_k2 bounds a divergence from above "
            "only; give it one number",
        ),
        (
            {"rollout_is": "token", "rollout_is_threshold": "2_1"},
            f"{KEY}.rollout_is_threshold='2_1' must be a positive number or 'lower_upper' "
            "with 0 <= lower < upper (e.g. 2.0 or '0.5_2.0')",
        ),
        (
            {"loss_type": "pg"},
            f"{KEY}.loss_type='pg' is not supported; use one of ppo_clip, reinforce",
        ),
        (
            {"rollout_rs": "token", "rollout_rs_threshold": 2.0, "rollout_rs_threshold_lower": 3.0},
            f"{KEY}.rollout_rs_threshold_lower=3.0 must be below the upper bound 2.0 of token_k1",
        ),
        (
            {"rollout_token_veto_threshold": 2.0},
            f"{KEY}.rollout_token_veto_threshold=2.0 must be in (0, 1) (a token that many "
            "times less likely under the trainer than under the engine vetoes its sample; "
            "e.g. 1e-4)",
        ),
        (
            {"mode": "tis", "rollout_is": "token"},
            f"{KEY}.mode=tis is a preset of rollout_is / rollout_rs: set either {KEY}.mode or "
            f"{KEY}.rollout_is / rollout_rs, not both",
        ),
        (
            {"loss_type": "reinforce"},
            f"{KEY}.loss_type=reinforce is bypass mode's loss: set {KEY}.bypass_mode=true",
        ),
        (
            {"clip": 1.0},
            f"{KEY}.clip=1.0 must be > 1 (a weight cap at or below 1 removes every token the "
            "engine found likelier than the trainer)",
        ),
    ],
)
def test_bad_settings_are_refused_naming_the_key(kwargs, message):
    with pytest.raises(ValueError) as info:
        RolloutCorrectionConfig(**kwargs)
    assert str(info.value) == message


def test_verls_bypass_ppo_clip_weights_are_measured_not_applied(caplog, monkeypatch):
    """verl's own example sets ``rollout_is=token`` with bypass mode's PPO loss, whose ratio
    is already against the engine: accepted, warned once, the weights only measured."""
    monkeypatch.setattr(config_pkg, "_warned", set())  # (once per process: this one's)
    with caplog.at_level("WARNING"):
        spec = RolloutCorrectionConfig(bypass_mode=True, rollout_is="token").spec
    assert spec.rollout_is == "token" and not spec.applies_weights
    assert (
        f"{KEY}.rollout_is=token has no effect on the loss with bypass_mode=true and "
        "loss_type=ppo_clip (the PPO ratio is already pi_theta / pi_rollout): the weights are "
        "only measured (rollout_corr/rollout_is_*), as in verl"
    ) in caplog.text
    reinforce = RolloutCorrectionConfig(bypass_mode=True, loss_type="reinforce", rollout_is="token")
    assert reinforce.spec.applies_weights
