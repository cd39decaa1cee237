"""The PPO update on one rank (``trainer.workers.policy_math``) with a tiny random Qwen3: masked
(tool/padding) tokens contribute no gradient, neither micro-batching nor packing
(``use_remove_padding`` on or off) changes the update, the reported loss is the policy loss of
the batch, and padded log-probs equal unpadded ones."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.unit.trainer.tiny_model import tiny_qwen3
from trainer.algos import (
    LOSS_AGG_MODES,
    agg_denominator,
    agg_loss,
    entropy_from_logits,
    kl_penalty,
    policy_loss,
)
from trainer.algos.correction import CorrectionSpec
from trainer.config.actor import ActorConfig
from trainer.config.rollout_correction import RolloutCorrectionConfig
from trainer.workers.batch import TrainBatch, balanced_micro_batches, pad_for_ranks
from trainer.workers.inert import inert_rows, skip_inert_rows
from trainer.workers.policy_math import (
    LossSpec,
    OwnLogProbs,
    _micro_loss,
    global_denominator,
    log_probs_in_micro_batches,
    update_policy,
)

N, P, R = 6, 6, 10


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return tiny_qwen3().eval()


def full_log_probs(model: torch.nn.Module, batch: TrainBatch, temperature: float = 1.0):
    """Log-probs and entropy [batch, R] from one forward of the whole padded batch."""
    with torch.no_grad():
        logits = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
        ).logits.float()[:, P - 1 : -1]
    logits = logits / temperature
    log_probs = torch.log_softmax(logits, -1).gather(-1, batch.responses.unsqueeze(-1))
    return log_probs.squeeze(-1), entropy_from_logits(logits)


@pytest.fixture(scope="module")
def batch(model) -> TrainBatch:
    """Left-padded prompts, right-padded responses with a tool span inside, pad id 0;
    old/ref log-probs near the model's own, mixed-sign advantages."""
    g = torch.Generator().manual_seed(1)
    prompt_lens, resp_lens = [6, 3, 1, 4, 2, 5], [10, 4, 7, 2, 9, 6]
    attn = torch.zeros(N, P + R, dtype=torch.long)
    for i, (lp, lr) in enumerate(zip(prompt_lens, resp_lens, strict=True)):
        attn[i, P - lp : P + lr] = 1
    ids = torch.randint(1, 256, (N, P + R), generator=g) * attn
    mask = attn[:, P:].clone()
    mask[[0, 2, 4], 2:4] = 0  # tool tokens inside the longer responses
    base = TrainBatch(
        input_ids=ids,
        attention_mask=attn,
        position_ids=(attn.cumsum(1) - 1).clamp(min=0),
        response_mask=mask,
    )
    log_probs, _ = full_log_probs(model, base)
    m = mask.float()
    base.old_log_probs = (log_probs + 0.3 * torch.randn(N, R, generator=g)) * m
    base.ref_log_probs = (log_probs + 0.2 * torch.randn(N, R, generator=g)) * m
    base.advantages = torch.tensor([1.0, -1.0, 0.5, -0.7, 1.3, -0.2]).unsqueeze(1) * m
    return base


def actor_config(**kwargs) -> ActorConfig:
    return ActorConfig(**{"ppo_micro_batch_size_per_gpu": N, **kwargs})


def gradients(model: torch.nn.Module, batch: TrainBatch, spec: LossSpec) -> dict:
    model.zero_grad(set_to_none=True)
    mode = spec.loss_agg_mode
    denominator = agg_denominator(batch.response_mask, mode, batch.response_length)
    loss, _ = _micro_loss(model, batch.trimmed(), spec, max(denominator, 1.0), 1.0)
    loss.backward()
    out = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return out


def perturb(batch: TrainBatch, where: torch.Tensor, seed: int) -> TrainBatch:
    """``batch`` with advantages and old/ref log-probs replaced at positions ``where``."""
    g = torch.Generator().manual_seed(seed)
    out = batch.select(slice(None))

    def noise(t: torch.Tensor, scale: float, shift: float) -> torch.Tensor:
        return torch.where(where, torch.randn(t.shape, generator=g) * scale + shift, t)

    out.advantages = noise(batch.advantages, 10.0, 0.0)
    out.old_log_probs = noise(batch.old_log_probs, 5.0, -3.0)
    out.ref_log_probs = noise(batch.ref_log_probs, 5.0, -3.0)
    return out


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_masked_tokens_contribute_nothing_to_the_gradient(model, batch, mode):
    cfg = actor_config(loss_agg_mode=mode, entropy_coeff=0.01, use_kl_loss=True)
    spec = LossSpec.from_config(cfg)
    masked = batch.response_mask == 0  # tool tokens and padding
    reference = gradients(model, batch, spec)
    changed = gradients(model, perturb(batch, masked, seed=2), spec)
    assert any(g.abs().max() > 0 for g in reference.values())
    for name, grad in reference.items():
        assert torch.equal(grad, changed[name]), name
    # the same change on sampled tokens does move the gradient: the check above can fail
    moved = gradients(model, perturb(batch, ~masked, seed=2), spec)
    assert not all(torch.equal(grad, moved[name]) for name, grad in reference.items())


def updated(model, batch, cfg, samples_per_mini_batch, remove_padding=True, correction=None):
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)  # weight change = the gradient
    metrics = update_policy(
        model,
        optimizer,
        None,
        batch,
        cfg,
        samples_per_mini_batch=samples_per_mini_batch,
        remove_padding=remove_padding,
        correction=correction,
    )
    return metrics, model.state_dict()


@pytest.mark.slow
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batching_does_not_change_the_update(model, batch, mode):
    tokens = batch.attention_mask.sum(-1)
    max_tokens = int(tokens.max()) + 4
    for half in (torch.arange(3), torch.arange(3, 6)):
        assert len(balanced_micro_batches(tokens[half], max_tokens)) >= 2
    runs = {
        "micro 1": actor_config(loss_agg_mode=mode, ppo_micro_batch_size_per_gpu=1),
        "micro all": actor_config(loss_agg_mode=mode, ppo_micro_batch_size_per_gpu=N),
        "dynamic": actor_config(
            loss_agg_mode=mode, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=max_tokens
        ),
    }
    results = {
        name: updated(model, batch, cfg, samples_per_mini_batch=3) for name, cfg in runs.items()
    }
    # use_remove_padding=false: padded rows, budgets in rows x the longest row
    results["padded micro 2"] = updated(
        model, batch, actor_config(loss_agg_mode=mode, ppo_micro_batch_size_per_gpu=2), 3, False
    )
    results["padded dynamic"] = updated(model, batch, runs["dynamic"], 3, remove_padding=False)
    before = model.state_dict()
    _, reference = results["micro all"]
    assert max(float((reference[k] - before[k]).abs().max()) for k in before) > 1e-3
    for name, (metrics, weights) in results.items():
        assert metrics["actor/optimizer_steps"] == 2.0
        for key in reference:
            torch.testing.assert_close(weights[key], reference[key], atol=1e-6, rtol=0, msg=name)
        ref_metrics = results["micro all"][0]
        assert metrics["actor/pg_loss"] == pytest.approx(ref_metrics["actor/pg_loss"], abs=1e-6)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_reported_pg_loss_is_the_policy_loss_of_the_batch_before_the_step(model, batch, mode):
    cfg = actor_config(loss_agg_mode=mode, ppo_micro_batch_size_per_gpu=2, clip_ratio_high=0.28)
    log_probs, _ = full_log_probs(model, batch)
    expected, counts = policy_loss(
        log_probs,
        batch.old_log_probs,
        batch.advantages,
        batch.response_mask,
        clip_ratio_low=cfg.clip_low,
        clip_ratio_high=cfg.clip_high,
        clip_ratio_c=cfg.clip_ratio_c,
        loss_agg_mode=mode,
    )
    metrics, _ = updated(model, batch, cfg, samples_per_mini_batch=N)
    assert metrics["actor/pg_loss"] == pytest.approx(float(expected), rel=1e-5, abs=1e-7)
    assert counts["pg_clipfrac"] > 0  # the old log-probs are far enough to clip some tokens
    for key in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"):
        assert metrics[f"actor/{key}"] == pytest.approx(counts[key], abs=1e-6)
    assert metrics["actor/optimizer_steps"] == 1.0
    assert "actor/entropy_loss" not in metrics and "actor/kl_loss" not in metrics


@pytest.mark.parametrize("dynamic", [False, True])
def test_padded_log_probs_equal_unpadded_per_sample_forwards(model, batch, dynamic):
    temperature = 0.7
    log_probs, entropy = log_probs_in_micro_batches(
        model,
        batch,
        micro_batch_size=2,
        temperature=temperature,
        with_entropy=True,
        use_dynamic_bsz=dynamic,
        max_token_len=int(batch.attention_mask.sum(-1).max()) + 4,
    )
    assert log_probs.shape == entropy.shape == (N, R)
    prompt_lens, resp_lens = batch.lengths()
    mask = batch.response_mask.bool()
    for i in range(N):
        lp, lr = int(prompt_lens[i]), int(resp_lens[i])
        ids = torch.cat([batch.input_ids[i, P - lp : P], batch.input_ids[i, P : P + lr]])
        with torch.no_grad():
            logits = model(input_ids=ids[None]).logits[0, lp - 1 : lp + lr - 1].float()
        logits = logits / temperature
        expected = torch.log_softmax(logits, -1).gather(-1, ids[lp:, None]).squeeze(-1)
        m = mask[i, :lr]
        torch.testing.assert_close(log_probs[i, :lr][m], expected[m], atol=1e-5, rtol=0)
        torch.testing.assert_close(
            entropy[i, :lr][m], entropy_from_logits(logits)[m], atol=1e-5, rtol=0
        )
    assert torch.all(log_probs[~mask] == 0) and torch.all(entropy[~mask] == 0)


def test_entropy_and_kl_terms_add_their_metrics(model, batch):
    cfg = actor_config(
        entropy_coeff=0.01, use_kl_loss=True, kl_loss_type="low_var_kl", kl_loss_coef=0.1
    )
    log_probs, entropy = full_log_probs(model, batch)
    mask = batch.response_mask
    metrics, weights = updated(model, batch, cfg, samples_per_mini_batch=N)
    expected_kl = agg_loss(
        kl_penalty(log_probs, batch.ref_log_probs, "low_var_kl"), mask, "token-mean"
    )
    assert metrics["actor/entropy_loss"] == pytest.approx(
        float(agg_loss(entropy, mask, "token-mean")), rel=1e-5
    )
    assert metrics["actor/kl_loss"] == pytest.approx(float(expected_kl), rel=1e-5)
    assert metrics["actor/kl_loss"] > 0
    # the terms are part of the loss: the update differs from the plain PPO one
    _, plain = updated(model, batch, actor_config(), samples_per_mini_batch=N)
    assert any(not torch.equal(weights[k], plain[k]) for k in plain)


def test_rollout_correction_weights_each_tokens_loss_by_the_truncated_ratio(model, batch):
    """tis: weight pi_old / pi_rollout truncated at clip; decoupled: tokens above the cap
    drop out; a rollout policy equal to the old one changes nothing."""
    spec = LossSpec.from_config(actor_config())
    tis = LossSpec.from_config(actor_config(), correction=preset("tis"))
    decoupled = LossSpec.from_config(actor_config(), correction=preset("decoupled"))
    mode = spec.loss_agg_mode
    denominator = max(agg_denominator(batch.response_mask, mode, batch.response_length), 1.0)

    def loss(b: TrainBatch, s: LossSpec) -> float:
        with torch.no_grad():
            return float(_micro_loss(model, b.trimmed(), s, denominator, 1.0)[0])

    same = batch.select(slice(None))
    same.rollout_log_probs = same.old_log_probs
    assert loss(same, tis) == pytest.approx(loss(batch, spec), abs=1e-7)
    assert loss(same, decoupled) == pytest.approx(loss(batch, spec), abs=1e-7)
    behind = batch.select(slice(None))  # the engine found every token 4x less likely
    assert batch.old_log_probs is not None
    behind.rollout_log_probs = batch.old_log_probs - torch.log(torch.tensor(4.0))
    assert loss(behind, tis) == pytest.approx(2.0 * loss(batch, spec), rel=1e-5)
    assert loss(behind, decoupled) == 0.0
    half = batch.select(slice(None))  # 1.5x: under the cap, the full weight
    half.rollout_log_probs = batch.old_log_probs - torch.log(torch.tensor(1.5))
    assert loss(half, decoupled) == pytest.approx(1.5 * loss(batch, spec), rel=1e-5)


def preset(mode: str, **keys) -> CorrectionSpec:
    return RolloutCorrectionConfig(mode=mode, clip=2.0, **keys).spec


def test_weights_the_driver_computed_multiply_each_tokens_loss(model, batch):
    """``is_weights`` (rejection or batch normalisation: the driver's, for the whole batch)
    are taken as they are: the loss computes none of its own."""
    spec = LossSpec.from_config(actor_config())
    rejecting = LossSpec.from_config(
        actor_config(), correction=RolloutCorrectionConfig(rollout_rs="token").spec
    )
    mode = spec.loss_agg_mode
    denominator = max(agg_denominator(batch.response_mask, mode, batch.response_length), 1.0)

    def loss(b: TrainBatch, s: LossSpec) -> float:
        with torch.no_grad():
            return float(_micro_loss(model, b.trimmed(), s, denominator, 1.0)[0])

    weighted = batch.select(slice(None))
    weighted.rollout_log_probs = batch.old_log_probs - 5.0  # far off: the loss would reject
    weighted.is_weights = 3.0 * batch.response_mask.float()
    assert loss(weighted, rejecting) == pytest.approx(3.0 * loss(batch, spec), rel=1e-5)


def test_bypass_reinforce_is_the_weighted_policy_gradient(model, batch):
    """bypass mode, ``loss_type=reinforce``: -w x A x log pi with w = min(pi / pi_rollout,
    threshold) per sequence, the engine's log-probs as the old ones; the update logs how far
    pi is from them."""
    lp, _ = full_log_probs(model, batch)
    m = batch.response_mask.float()
    b = batch.select(slice(None))
    b.old_log_probs = (lp - 0.1) * m  # the engine's: every token a little less likely
    reinforce = RolloutCorrectionConfig(
        bypass_mode=True, loss_type="reinforce", rollout_is="sequence", rollout_is_threshold=1.5
    ).spec
    spec = LossSpec.from_config(actor_config(), correction=reinforce)
    mode = spec.loss_agg_mode
    denominator = max(agg_denominator(b.response_mask, mode, b.response_length), 1.0)
    with torch.no_grad():
        got, _ = _micro_loss(model, b.trimmed(), spec, denominator, 1.0)
    w = torch.exp((0.1 * m).sum(-1, keepdim=True)).clamp(max=1.5)
    assert b.advantages is not None
    want = agg_loss(-w * b.advantages * lp, m, mode)
    assert float(got) == pytest.approx(float(want), rel=1e-4)
    metrics, _ = updated(model, b, actor_config(), samples_per_mini_batch=N, correction=reinforce)
    assert metrics["rollout_corr/kl"] == pytest.approx(-0.1, rel=1e-3)
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(
        float((w * m).sum() / m.sum()), rel=1e-4
    )


def test_bypass_rejection_takes_tokens_out_against_the_current_policy(model, batch):
    """bypass mode with token rejection: a token whose pi / pi_rollout leaves [1/2, 2] adds
    nothing to the PPO loss (the ratio is pi / pi_rollout)."""
    lp, _ = full_log_probs(model, batch)
    m = batch.response_mask.float()
    b = batch.select(slice(None))
    far = torch.zeros_like(m)
    far[[0, 3]] = 1.0  # rows 0 and 3: the engine found their tokens e^3 times likelier
    b.old_log_probs = (lp + 3.0 * far) * m
    rs = RolloutCorrectionConfig(bypass_mode=True, rollout_rs="token").spec
    plain = LossSpec.from_config(actor_config())
    spec = LossSpec.from_config(actor_config(), correction=rs)
    mode = spec.loss_agg_mode
    denominator = max(agg_denominator(b.response_mask, mode, b.response_length), 1.0)
    kept = b.select(slice(None))
    kept.advantages = b.advantages * (1 - far)  # rows 0 and 3 contribute nothing
    with torch.no_grad():
        got = float(_micro_loss(model, b.trimmed(), spec, denominator, 1.0)[0])
        want = float(_micro_loss(model, kept.trimmed(), plain, denominator, 1.0)[0])
    assert got == pytest.approx(want, rel=1e-5) and got != 0.0


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_filler_rows_change_no_update(model, batch, mode):
    """5 samples in 2 mini-batches: filled to 3 + 3 (``pad_for_ranks``), the update is the one
    of mini-batches 3 + 2; with one row per micro-batch the filler runs a forward and
    backward of its own, with nothing to train."""
    five = batch.select(torch.arange(5))
    five.weights = torch.ones(5)
    padded, real, per_mini = pad_for_ranks(five, world_size=1, mini_batches=2)
    assert per_mini == 3 and real.tolist() == [True] * 5 + [False]
    for micro in (1, 3):
        cfg = actor_config(
            loss_agg_mode=mode,
            ppo_micro_batch_size_per_gpu=micro,
            entropy_coeff=0.01,
            use_kl_loss=True,
        )
        expected_metrics, expected = updated(model, five, cfg, samples_per_mini_batch=3)
        metrics, weights = updated(model, padded, cfg, samples_per_mini_batch=per_mini)
        assert metrics["actor/optimizer_steps"] == 2.0
        for key in ("actor/pg_loss", "actor/entropy_loss", "actor/kl_loss", "actor/ppo_kl"):
            assert metrics[key] == pytest.approx(expected_metrics[key], abs=1e-6), key
        for key in expected:
            torch.testing.assert_close(weights[key], expected[key], atol=1e-6, rtol=0)


@pytest.mark.parametrize("micro", [N, 2], ids=["one_micro_batch", "three_micro_batches"])
def test_an_update_of_its_own_old_log_probs_equals_one_given_them(model, batch, micro):
    """One mini-batch, one epoch: the update's own forward, detached, gives the old
    log-probs and entropies (each micro-batch's into its rows), and the step is the step
    given those log-probs from a pass before it."""
    cfg = actor_config(ppo_micro_batch_size_per_gpu=micro, entropy_coeff=0.01)
    log_probs, entropy = full_log_probs(model, batch)
    mask = batch.response_mask.float()
    given = batch.select(slice(None))
    given.old_log_probs = log_probs * mask
    _, want = updated(model, given, cfg, len(batch))

    mine = batch.select(slice(None))
    mine.old_log_probs = None
    own = OwnLogProbs.zeros(len(batch), batch.response_length)
    copy_ = copy.deepcopy(model)
    metrics = update_policy(
        copy_, torch.optim.SGD(copy_.parameters(), lr=1.0), None, mine, cfg,
        samples_per_mini_batch=len(batch), own=own,
    )  # fmt: skip
    torch.testing.assert_close(own.log_probs, log_probs * mask, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(own.entropy, entropy * mask, rtol=1e-5, atol=1e-5)
    assert metrics["actor/ppo_kl"] == 0.0 and metrics["actor/optimizer_steps"] == 1.0
    for name, value in want.items():
        torch.testing.assert_close(copy_.state_dict()[name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("epochs, rows", [(1, 3), (2, N)], ids=["two_mini_batches", "two_epochs"])
def test_own_old_log_probs_are_refused_for_more_than_one_optimizer_step(model, batch, epochs, rows):
    mine = batch.select(slice(None))
    mine.old_log_probs = None
    with pytest.raises(ValueError) as err:
        update_policy(
            model, torch.optim.SGD(model.parameters(), lr=0.0), None, mine,
            actor_config(ppo_epochs=epochs), samples_per_mini_batch=rows,
            own=OwnLogProbs.zeros(N, R),
        )  # fmt: skip
    assert str(err.value) == (
        "an update takes its old log-probs from its own forward only when it makes one "
        f"optimizer step (ppo_epochs={epochs}, {rows} of {N} rows per mini-batch); compute "
        "them first (compute_log_prob)"
    )


@pytest.mark.parametrize("micro", [1, 2, N], ids=["micro_1", "micro_2", "micro_all"])
@pytest.mark.parametrize("own", [False, True], ids=["given_old", "own_old"])
def test_skipping_zero_advantage_rows_changes_no_update(model, batch, micro, own):
    """Rows 1 and 4 with advantage 0 on every token: the update of the batch that skips them
    (fillers standing in for them, their tokens kept in the token-mean normaliser) is the
    update of the whole batch, in loss and weights, in two mini-batches or one with its own
    old log-probs (the computed rows' log-probs then the same too)."""
    zeroed = batch.select(torch.arange(N))
    zeroed.advantages[[1, 4]] = 0.0
    rows = inert_rows(zeroed)
    assert rows.tolist() == [False, True, False, False, True, False]
    cfg = actor_config(ppo_micro_batch_size_per_gpu=micro)
    computed, skipped = skip_inert_rows(zeroed, cfg, CorrectionSpec())
    assert torch.equal(skipped, rows)
    assert computed.stand_in_tokens.tolist() == [0.0, 4.0, 0.0, 0.0, 7.0, 0.0]  # tool tokens out
    assert computed.attention_mask[rows].sum().item() == 2  # one prompt token each
    per_mini = N if own else 3
    runs = []
    for b in (zeroed, computed):
        b = b.select(torch.arange(N))
        keep = OwnLogProbs.zeros(N, R) if own else None
        if own:
            b.old_log_probs = None
        copied = copy.deepcopy(model)
        forwards = []
        copied.register_forward_pre_hook(lambda *_, seen=forwards: seen.append(1))
        metrics = update_policy(
            copied, torch.optim.SGD(copied.parameters(), lr=1.0), None, b, cfg,
            samples_per_mini_batch=per_mini, own=keep,
        )  # fmt: skip
        runs.append((metrics, copied.state_dict(), keep, len(forwards)))
    (want, want_weights, want_own, want_n), (got, got_weights, got_own, got_n) = runs
    # one sample a micro-batch: the skipped rows' micro-batches are not run at all
    assert (want_n, got_n) == ((N, N - 2) if micro == 1 else (want_n, want_n))
    assert got["actor/pg_loss"] == pytest.approx(want["actor/pg_loss"], rel=1e-5, abs=1e-7)
    assert got["actor/optimizer_steps"] == want["actor/optimizer_steps"] == (1.0 if own else 2.0)
    for name, value in want_weights.items():
        torch.testing.assert_close(got_weights[name], value, rtol=1e-5, atol=1e-6)
    if own:
        live = ~rows
        torch.testing.assert_close(got_own.log_probs[live], want_own.log_probs[live])
        assert got_own.log_probs[rows].abs().sum() == 0.0  # not computed


def test_stand_in_tokens_count_in_token_mean_only(batch):
    mask = batch.response_mask
    stand_in = torch.tensor([0.0, 5.0, 0.0, 0.0, 0.0, 0.0])
    plain = global_denominator(mask, "token-mean", R)
    assert global_denominator(mask, "token-mean", R, stand_in=stand_in) == plain + 5.0
    with pytest.raises(ValueError) as err:
        global_denominator(mask, "seq-mean-token-mean", R, stand_in=stand_in)
    assert str(err.value) == (
        "rows were skipped (stand_in_tokens), which only loss_agg_mode=token-mean counts; this "
        "update normalises with 'seq-mean-token-mean'"
    )
