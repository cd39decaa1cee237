"""verl's estimators and policy losses (issue 39), each against a float64 reference written
here from its definition with plain loops; their registries, dotted-path user functions and
config errors; and one PPO update per loss mode on a tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.algos import (
    POLICY_LOSSES,
    AdvantageInputs,
    PolicyLossConfig,
    compute_advantages,
    estimator_for,
    gae_advantages,
    loss_for,
)
from trainer.config.actor import ActorConfig, PolicyLossSettings
from trainer.config.run import AlgorithmConfig

GROUPS = ["a", "a", "a", "b", "b", "c", "c", "c", "c"]


def _batch(seed: int = 0, rows: int = 9, width: int = 7):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 3, (rows,), generator=g).double()
    mask = (torch.rand(rows, width, generator=g) > 0.3).long()
    mask[:, 0] = 1  # every sample has a sampled token
    return scores, mask


def _members(groups):
    out: dict[str, list[int]] = {}
    for i, k in enumerate(groups):
        out.setdefault(k, []).append(i)
    return out


def _broadcast(per_sample, mask):
    return torch.tensor(
        [
            [per_sample[i] * float(mask[i, t]) for t in range(mask.shape[1])]
            for i in range(len(mask))
        ],
        dtype=torch.float64,
    )


def _whiten(values, mask):
    cells = [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t]]
    xs = [float(values[i, t]) for i, t in cells]
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    out = torch.zeros(mask.shape, dtype=torch.float64)
    for i, t in cells:
        out[i, t] = (float(values[i, t]) - mean) / math.sqrt(var + 1e-8)
    return out


# ---- estimators ---------------------------------------------------------------------------------
def test_reinforce_plus_plus_baseline_is_the_group_centred_score_whitened_over_tokens():
    scores, mask = _batch()
    groups = [*GROUPS[:-1], "solo"]
    centred = []
    for i, k in enumerate(groups):
        members = _members(groups)[k]
        mean = sum(float(scores[j]) for j in members) / len(members) if len(members) > 1 else 0.0
        centred.append(float(scores[i]) - mean)
    expected = _whiten(_broadcast(centred, mask), mask)
    got = compute_advantages("reinforce_plus_plus_baseline", scores, mask, groups)
    assert torch.allclose(got.double(), expected, atol=1e-5)


def test_opo_subtracts_the_length_weighted_group_mean():
    scores, mask = _batch(1)
    lengths = mask.sum(-1).tolist()
    per = []
    for i, k in enumerate(GROUPS):
        members = _members(GROUPS)[k]
        b = sum(lengths[j] * float(scores[j]) for j in members) / sum(lengths[j] for j in members)
        per.append(float(scores[i]) - b)
    got = compute_advantages("opo", scores, mask, GROUPS)
    assert torch.allclose(got.double(), _broadcast(per, mask), atol=1e-6)


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_passk_gives_the_best_sample_its_margin_over_the_second(norm):
    scores = torch.tensor([1.0, 3.0, 2.0, 5.0, 5.0, 0.0, 4.0, 1.0, 2.0])
    mask = torch.ones(9, 2, dtype=torch.long)
    per = [0.0] * 9
    for members in _members(GROUPS).values():
        values = [float(scores[j]) for j in members]
        order = sorted(range(len(values)), key=lambda j: -values[j])
        margin = values[order[0]] - values[order[1]]
        if norm:
            mean = sum(values) / len(values)
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
            margin /= std + 1e-6
        per[members[order[0]]] = margin
    got = compute_advantages("grpo_passk", scores, mask, GROUPS, norm_by_std=norm)
    assert torch.allclose(got.double(), _broadcast(per, mask), atol=1e-6)
    assert got[3:5].abs().sum() == 0  # a tie at the top: no margin, no learning
    with pytest.raises(ValueError, match="grpo_passk needs two samples or more per prompt"):
        compute_advantages("grpo_passk", scores, mask, [*GROUPS[:-1], "solo"])


def test_gpg_scales_the_group_centred_score_by_batch_over_nonzero():
    scores, mask = _batch(2)
    scores[0] = scores[4] = 0.0
    alpha = len(scores) / max(1, sum(1 for s in scores.tolist() if s != 0))
    per = []
    for i, k in enumerate(GROUPS):
        members = _members(GROUPS)[k]
        per.append(
            alpha * (float(scores[i]) - sum(float(scores[j]) for j in members) / len(members))
        )
    got = compute_advantages("gpg", scores, mask, GROUPS)
    assert torch.allclose(got.double(), _broadcast(per, mask), atol=1e-6)


def test_a_users_estimator_by_dotted_path_and_the_errors():
    scores, mask = _batch()
    got = compute_advantages(f"{__name__}:my_estimator", scores, mask, GROUPS)
    assert torch.equal(got, mask.float() * 2)
    with pytest.raises(ValueError) as info:
        AlgorithmConfig(adv_estimator="no_such_module_xyz:fn")
    assert str(info.value) == (
        "algorithm.adv_estimator='no_such_module_xyz:fn': cannot import module "
        "'no_such_module_xyz' (ModuleNotFoundError: No module named 'no_such_module_xyz'); "
        "install the package that provides 'no_such_module_xyz', put its folder on PYTHONPATH, "
        "or correct the name"
    )
    with pytest.raises(ValueError) as info:
        AlgorithmConfig(adv_estimator=f"{__name__}:missing")
    assert str(info.value) == (
        f"algorithm.adv_estimator='{__name__}:missing': module '{__name__}' defines no "
        "'missing'; define it there or name one it defines"
    )
    with pytest.raises(ValueError, match=r"returned shape \[9\], the response mask is \[9, 7\]"):
        compute_advantages(f"{__name__}:flat_estimator", scores, mask, GROUPS)


def my_estimator(x: AdvantageInputs) -> torch.Tensor:
    return torch.full(x.mask.shape, 2.0)


def flat_estimator(x: AdvantageInputs) -> torch.Tensor:
    return x.scores


def test_every_registered_estimator_resolves():
    for name in ("grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "opo",
                 "grpo_passk", "gpg"):  # fmt: skip
        assert callable(estimator_for(name))


# ---- policy losses ------------------------------------------------------------------------------
def _loss_inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(4, 6, generator=g, dtype=torch.float64) * 3
    logp = (old + torch.randn(4, 6, generator=g, dtype=torch.float64) * 0.3).requires_grad_()
    adv = torch.randn(4, 6, generator=g, dtype=torch.float64)
    mask = torch.ones(4, 6, dtype=torch.float64)
    mask[1, 4:] = 0
    mask[3, 2:] = 0
    return logp, old, adv, mask


def _cells(mask):
    return [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t]]


CFG = PolicyLossConfig(clip_ratio_low=0.1, clip_ratio_high=0.15, clip_ratio_c=3.0)


def test_gspo_uses_the_sequence_ratio_with_each_tokens_gradient():
    logp, old, adv, mask = _loss_inputs()
    out = loss_for("gspo")(logp, old, adv, mask, CFG)
    assert out.agg_mode == "seq-mean-token-mean"
    for i, t in _cells(mask):
        n = int(mask[i].sum())
        lp = logp.detach()
        s = math.exp(sum(float(lp[i, u] - old[i, u]) for u in range(6) if mask[i, u]) / n)
        a = float(adv[i, t])
        ref = max(-a * s, -a * min(max(s, 1 - 0.1), 1 + 0.15))
        assert float(out.losses.detach()[i, t]) == pytest.approx(ref, abs=1e-9)
    # d loss_it / d logp_it = -A s (unclipped) and 0 for the other tokens of the row
    (grad,) = torch.autograd.grad(out.losses[0, 0], logp)
    s0 = math.exp(float(((logp.detach()[0] - old[0]) * mask[0]).sum() / mask[0].sum()))
    clipped = not (1 - 0.1 <= s0 <= 1 + 0.15)
    assert float(grad[0, 0]) == pytest.approx(0.0 if clipped else -float(adv[0, 0]) * s0)
    assert grad[0, 1:].abs().sum() == 0


def test_sapo_gate_and_its_slope_at_ratio_one():
    logp, old, adv, mask = _loss_inputs(1)
    cfg = PolicyLossConfig(tau_pos=1.0, tau_neg=1.05)
    out = loss_for("sapo")(logp, old, adv, mask, cfg)
    assert out.agg_mode == "seq-mean-token-mean"
    for i, t in _cells(mask):
        r = math.exp(float(logp.detach()[i, t] - old[i, t]))
        tau = 1.0 if float(adv[i, t]) > 0 else 1.05
        gate = 4 / tau / (1 + math.exp(-tau * (r - 1)))
        assert float(out.losses.detach()[i, t]) == pytest.approx(-gate * float(adv[i, t]), abs=1e-9)
    same = old.clone().requires_grad_()  # r = 1: the gate's slope is 1, as PPO's
    (grad,) = torch.autograd.grad(loss_for("sapo")(same, old, adv, mask, cfg).losses.sum(), same)
    assert torch.allclose(grad, -adv, atol=1e-12)


def test_gpg_cispo_losses():
    logp, old, adv, mask = _loss_inputs(2)
    gpg = loss_for("gpg")(logp, old, adv, mask, CFG)
    assert torch.allclose(gpg.losses, -adv * logp)
    cispo = loss_for("cispo")(logp, old, adv, mask, CFG)
    for i, t in _cells(mask):
        r = math.exp(float(logp.detach()[i, t] - old[i, t]))
        w = min(max(r, 0.9), 1.15)
        assert float(cispo.losses.detach()[i, t]) == pytest.approx(
            -w * float(adv[i, t] * logp.detach()[i, t])
        )
    (grad,) = torch.autograd.grad(cispo.losses.sum(), logp)  # the weight carries no gradient
    weight = torch.exp(logp - old).clamp(0.9, 1.15).detach()
    assert torch.allclose(grad, -weight * adv)
    clipped = sum(
        1
        for i, t in _cells(mask)
        if not 0.9 <= math.exp(float(logp.detach()[i, t] - old[i, t])) <= 1.15
    )
    assert cispo.counts["pg_clipfrac"] == clipped


def test_geo_mean_clips_in_log_space_by_the_advantages_sign():
    logp, old, adv, mask = _loss_inputs(3)
    cfg = PolicyLossConfig(clip_ratio_low=0.1, clip_ratio_high=0.1)
    out = loss_for("geo_mean")(logp, old, adv, mask, cfg)
    assert out.agg_mode == "seq-mean-token-sum"
    for i in range(4):
        cells = [t for t in range(6) if mask[i, t]]
        total = 0.0
        for t in cells:
            d, a = float(logp.detach()[i, t] - old[i, t]), float(adv[i, t])
            c = min(max(d, -0.1), 0.1)
            total += min(d, c) if a > 0 else (max(d, c) if a < 0 else 0.0)
        rho = math.exp(total / len(cells))
        seq_adv = sum(float(adv[i, t]) for t in cells) / len(cells)
        # the row's tokens add up to its sequence loss
        assert float(out.losses.detach()[i].sum()) == pytest.approx(
            -seq_adv * rho, rel=1e-7
        )  # eps 1e-8


def test_clip_cov_cuts_a_share_of_the_unclipped_high_covariance_tokens():
    g = torch.Generator().manual_seed(4)
    logp = (-torch.rand(8, 50, generator=g, dtype=torch.float64) * 4).requires_grad_()
    old = logp.detach().clone()  # ratio 1: nothing PPO-clipped
    adv = torch.randn(8, 50, generator=g, dtype=torch.float64) * 2
    mask = torch.ones(8, 50, dtype=torch.float64)
    cfg = PolicyLossConfig(clip_cov_ratio=0.02, clip_cov_lb=0.5, clip_cov_ub=5.0)
    torch.manual_seed(0)
    out = loss_for("clip_cov")(logp, old, adv, mask, cfg)
    lp, a = logp.detach(), adv
    cov = (a - a.mean()) * (lp - lp.mean())
    eligible = (cov > 0.5) & (cov < 5.0)
    cut = out.losses.detach() == 0
    assert int(cut.sum()) == int(0.02 * 400) == out.counts["pg_clipfrac"]
    assert bool(eligible[cut].all())  # only eligible tokens are cut
    kept = ~cut
    assert torch.allclose(out.losses[kept], (-adv * torch.exp(logp - old))[kept])
    (grad,) = torch.autograd.grad(out.losses.sum(), logp)
    assert grad[cut].abs().sum() == 0


def test_kl_cov_adds_the_kl_term_on_the_top_covariance_tokens():
    g = torch.Generator().manual_seed(5)
    old = -torch.rand(5, 40, generator=g, dtype=torch.float64) * 4
    logp = (old + torch.randn(5, 40, generator=g, dtype=torch.float64) * 0.2).requires_grad_()
    adv = torch.randn(5, 40, generator=g, dtype=torch.float64)
    mask = torch.ones(5, 40, dtype=torch.float64)
    mask[2, 30:] = 0
    cfg = PolicyLossConfig(kl_cov_ratio=0.05, ppo_kl_coef=0.3)
    out = loss_for("kl_cov")(logp, old, adv, mask, cfg)
    cells = _cells(mask)
    lp = {c: float(logp.detach()[c]) for c in cells}
    ad = {c: float(adv[c]) for c in cells}
    mean_lp, mean_a = sum(lp.values()) / len(cells), sum(ad.values()) / len(cells)
    cov = {c: (ad[c] - mean_a) * (lp[c] - mean_lp) for c in cells}
    top = set(sorted(cells, key=lambda c: -cov[c])[: max(1, int(len(cells) * 0.05))])
    for c in cells:
        d = lp[c] - float(old[c])
        ref = -ad[c] * math.exp(d) + (0.3 * abs(d) if c in top else 0.0)
        assert float(out.losses.detach()[c]) == pytest.approx(ref, abs=1e-9)
    assert out.counts["ppo_kl"] == pytest.approx(sum(abs(lp[c] - float(old[c])) for c in cells))


def test_vanilla_is_the_ppo_dual_clip_loss():
    logp, old, adv, mask = _loss_inputs(6)
    out = loss_for("vanilla")(logp, old, adv, mask, CFG)
    for i, t in _cells(mask):
        r, a = math.exp(float(logp.detach()[i, t] - old[i, t])), float(adv[i, t])
        ref = max(-a * r, -a * min(max(r, 0.9), 1.15))
        if a < 0:
            ref = min(ref, -a * 3.0)
        assert float(out.losses.detach()[i, t]) == pytest.approx(ref, abs=1e-9)
    assert out.agg_mode is None


def test_a_users_loss_by_dotted_path_and_the_errors():
    settings = PolicyLossSettings(loss_mode=f"{__name__}:my_loss")
    logp, old, adv, mask = _loss_inputs()
    out = loss_for(settings.loss_mode)(logp, old, adv, mask, CFG)
    assert torch.equal(out.losses, -adv)
    with pytest.raises(ValueError) as info:
        PolicyLossSettings(loss_mode="ppo2")
    assert str(info.value) == (
        "actor_rollout_ref.actor.policy_loss.loss_mode='ppo2' is not supported; use one of "
        "vanilla, gspo, sapo, gpg, clip_cov, kl_cov, geo_mean, cispo, or a function of your own "
        "as package.module:function"
    )
    with pytest.raises(ValueError, match="clip_cov_lb must be below clip_cov_ub"):
        PolicyLossSettings(loss_mode="clip_cov", clip_cov_lb=5.0, clip_cov_ub=1.0)
    with pytest.raises(ValueError, match="tau_pos and tau_neg must be > 0"):
        ActorConfig(tau_neg=0.0)


def my_loss(log_prob, old_log_prob, advantages, mask, cfg):
    from trainer.algos import PolicyLossOut

    return PolicyLossOut(-advantages)


# ---- one update per loss mode -----------------------------------------------------------------
@pytest.mark.parametrize("mode", [*POLICY_LOSSES, f"{__name__}:fixed_loss"])
def test_each_loss_mode_trains_a_step(mode):
    from tests.unit.trainer.tiny_model import tiny_qwen3
    from trainer.workers import TrainBatch, log_probs_in_micro_batches, update_policy

    torch.manual_seed(0)
    model = tiny_qwen3()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 100, (4, 12), generator=g)
    attn = torch.ones_like(ids)
    attn[0, :3] = 0
    mask = attn[:, 4:].clone()
    batch = TrainBatch(
        input_ids=ids,
        attention_mask=attn,
        position_ids=(attn.cumsum(1) - 1).clamp(min=0),
        response_mask=mask,
        advantages=torch.randn(4, 1, generator=g).expand(4, 8).clone() * mask,
    )
    batch.old_log_probs = log_probs_in_micro_batches(model, batch, micro_batch_size=2)[0]
    before = [p.detach().clone() for p in model.parameters()]
    cfg = ActorConfig(
        policy_loss=PolicyLossSettings(loss_mode=mode, clip_cov_ratio=0.2, kl_cov_ratio=0.2),
        ppo_micro_batch_size_per_gpu=2,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    metrics = update_policy(model, optimizer, None, batch, cfg, samples_per_mini_batch=4)
    assert math.isfinite(metrics["actor/pg_loss"]) and math.isfinite(metrics["actor/grad_norm"])
    assert metrics["actor/grad_norm"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


# ---- GAE over sampled tokens ------------------------------------------------------------------
def _observation_mask(g: torch.Generator, rows: int, width: int) -> torch.Tensor:
    """Sampled turns with several observation spans between them, then padding."""
    mask = torch.zeros(rows, width, dtype=torch.long)
    for i in range(rows):
        t = 0
        end = width - int(torch.randint(0, 4, (1,), generator=g))
        while t < end:
            turn = int(torch.randint(1, 5, (1,), generator=g))
            mask[i, t : min(t + turn, end)] = 1
            t += turn + int(torch.randint(1, 4, (1,), generator=g))  # an observation span
    return mask


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.9, 0.5)])
def test_gae_skips_observation_tokens_like_gae_on_the_sampled_tokens_alone(gamma, lam):
    g = torch.Generator().manual_seed(7)
    mask = _observation_mask(g, 6, 30)
    values = torch.randn(6, 30, generator=g, dtype=torch.float64)
    rewards = torch.randn(6, 30, generator=g, dtype=torch.float64) * mask
    rewards += (1 - mask) * 100.0  # rewards on observation tokens are never read
    adv, ret = gae_advantages(rewards, values, mask, gamma, lam)
    for i in range(6):
        steps = [t for t in range(30) if mask[i, t]]
        # the definition, on the sampled tokens alone (observation tokens cut out)
        expected, running = {}, 0.0
        for k in reversed(range(len(steps))):
            t = steps[k]
            next_v = float(values[i, steps[k + 1]]) if k + 1 < len(steps) else 0.0
            delta = float(rewards[i, t]) + gamma * next_v - float(values[i, t])
            running = delta + gamma * lam * running
            expected[t] = running
        for t in range(30):
            want = expected.get(t, 0.0)
            assert float(adv[i, t]) == pytest.approx(want, abs=1e-4)
            assert float(ret[i, t]) == pytest.approx(
                want + float(values[i, t]) if t in expected else 0.0, abs=1e-4
            )
    assert mask.sum(-1).min() > 0 and ((mask[:, 1:] - mask[:, :-1]) == 1).sum() >= 12  # spans


def test_grpo_passk_ranks_a_segmented_session_once_and_skips_dropped_ones():
    mask = torch.ones(7, 2, dtype=torch.long)
    # group a: the best session split into two segments of weight 1/2, then 0.0 and -1.0
    # group b: two sessions, one dropped (weight 0): one left, no margin, no error
    scores = torch.tensor([1.0, 1.0, 0.0, -1.0, 3.0, 2.0, 1.0])
    weights = torch.tensor([0.5, 0.5, 1.0, 1.0, 1.0, 0.0, 1.0])
    groups = ["a", "a", "a", "a", "b", "b", "c"]
    groups[6] = "b"  # b: scores 3 (kept), 2 (dropped), 1 (kept): margin 3 - 1
    got = compute_advantages(
        "grpo_passk", scores, mask, groups, norm_by_std=False, weights=weights
    )[:, 0]
    assert got.tolist() == pytest.approx([0.5, 0.5, 0.0, 0.0, 2.0, 0.0, 0.0])
    # the same group a with the session whole (weight 1): the same margin, once
    whole = compute_advantages("grpo_passk", scores[1:4], mask[1:4], ["a"] * 3, norm_by_std=False)[
        :, 0
    ]
    assert whole.tolist() == pytest.approx([1.0, 0.0, 0.0])


def fixed_loss(log_prob, old_log_prob, advantages, mask, cfg):
    from trainer.algos import PolicyLossOut

    return PolicyLossOut(-advantages * torch.exp(log_prob - old_log_prob), {}, "seq-mean-token-sum")


fixed_loss.agg_mode = "seq-mean-token-sum"  # type: ignore[attr-defined]


def test_a_users_loss_that_fixes_its_aggregation_says_so_by_attribute():
    from trainer.algos import fixed_agg

    assert fixed_agg(f"{__name__}:fixed_loss") == "seq-mean-token-sum"
    assert fixed_agg("gspo") == "seq-mean-token-mean" and fixed_agg("vanilla") is None
    # clip_cov's settings are only checked when it is the loss
    PolicyLossSettings(loss_mode="vanilla", clip_cov_lb=5.0, clip_cov_ub=1.0)
