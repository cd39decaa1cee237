"""FSDP2 on 2 gloo ranks (Ray actors) against one process without FSDP on the same batch:
same log-probs, same loss, same weights after the update; then a checkpoint round trip."""

from __future__ import annotations

import copy

import pytest
import ray
import torch

from trainer.config.actor import ActorConfig, ModelConfig, OptimConfig, RefConfig
from trainer.workers import TrainBatch, WorkerGroup, WorkerSpec, log_probs_in_micro_batches
from trainer.workers.fsdp import load_model
from trainer.workers.policy_math import update_policy

pytestmark = pytest.mark.integration

# Tolerances: float32 sums in a different order (per-rank partials, all-reduce, samples packed
# into other rows) move log-probs and the loss by ~1e-6; two Adam steps at lr 1e-4 (weights
# move by up to 2e-4) turn that into weight differences of ~1e-6 (Adam divides near-zero
# gradients by their own size): measured 1.3e-6 packed, 4.4e-7 padded; 3e-6 is 1.5% of a step.
LOGP_ATOL, LOSS_RTOL, WEIGHT_ATOL = 1e-5, 1e-4, 3e-6


def make_batch(n: int = 8, p: int = 12, r: int = 20, seed: int = 0) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, 5000, (n, p + r), generator=g)
    attn = torch.ones(n, p + r, dtype=torch.long)
    for i in range(n):
        pl = int(torch.randint(3, p + 1, (1,), generator=g))
        rl = int(torch.randint(2, r + 1, (1,), generator=g))
        attn[i, : p - pl] = 0
        attn[i, p + rl :] = 0
    mask = attn[:, p:].clone()
    mask[:, 3:6] = 0  # a tool-response span inside every response
    return TrainBatch(
        input_ids=ids,
        attention_mask=attn,
        position_ids=(attn.cumsum(1) - 1).clamp(min=0),
        response_mask=mask * attn[:, p:],
        advantages=torch.randn(n, 1, generator=g).expand(n, r).clone() * mask,
    )


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def actor_config(**overrides) -> ActorConfig:
    base = dict(
        optim=OptimConfig(lr=1e-4, weight_decay=0.0),
        ppo_micro_batch_size_per_gpu=2,
        ppo_epochs=2,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
    )
    return ActorConfig(**{**base, **overrides})


def test_two_gloo_ranks_match_one_process(ray_local, tiny_qwen3_path):
    path = str(tiny_qwen3_path)
    cfg = actor_config()
    batch = make_batch()
    # ---- one process, no FSDP
    model = load_model(path, ModelConfig(path=path), "cpu")
    old, _ = log_probs_in_micro_batches(model, batch, micro_batch_size=8)
    # old log-probs from a slightly different policy, so ratios clip
    noise = torch.randn(old.shape, generator=torch.Generator().manual_seed(1))
    batch.old_log_probs = old + 0.1 * noise * batch.response_mask
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    single = update_policy(
        model, optimizer, None, copy.deepcopy(batch), cfg, samples_per_mini_batch=len(batch)
    )
    expected = model.state_dict()
    # ---- two FSDP2 ranks over gloo
    spec = WorkerSpec(
        model_path=path,
        model=ModelConfig(path=path),
        actor=cfg,
        ref=RefConfig(),
        need_ref=False,
        device="cpu",
    )
    group = WorkerGroup(spec, world_size=2)
    try:
        logp, entropy = group.compute_log_prob(batch)
        assert torch.allclose(logp, old, atol=LOGP_ATOL), (logp - old).abs().max()
        assert (entropy[batch.response_mask == 1] > 0).all()
        assert (logp[batch.response_mask == 0] == 0).all()
        sharded = group.update_actor(batch, samples_per_mini_batch=len(batch), seed=0)
        state = group.full_state_dict()
    finally:
        group.shutdown()
    assert single["actor/optimizer_steps"] == sharded["actor/optimizer_steps"] == 2
    assert sharded["actor/pg_clipfrac"] > 0
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/ppo_kl"):
        assert sharded[key] == pytest.approx(single[key], rel=LOSS_RTOL), key
    assert set(state) == set(expected)
    initial = load_model(path, ModelConfig(path=path), "cpu").state_dict()
    worst = max((state[k] - v).abs().max().item() for k, v in expected.items())
    moved = max((v - initial[k]).abs().max().item() for k, v in expected.items())
    print(f"fsdp2 x2 vs one process: max weight diff {worst:.2e}, max weight change {moved:.2e}")
    assert worst < WEIGHT_ATOL
    assert moved > 1e-4  # the update did change the weights


def test_reference_policy_stays_frozen_and_checkpointing_matches(ray_local, tiny_qwen3_path):
    """With a KL term the ranks hold a frozen reference copy: after an update the actor's
    log-probs move and the reference's do not. Activation checkpointing changes memory, not
    results: the same update with it on gives the same weights. The learning rate warms up
    per training step, as in verl (``lr_warmup_steps_ratio`` of the run's steps): both
    optimizer steps of the first update run at half the rate."""
    path = str(tiny_qwen3_path)
    batch = make_batch(seed=3)
    model = load_model(path, ModelConfig(path=path), "cpu")
    initial, _ = log_probs_in_micro_batches(model, batch, micro_batch_size=8)
    batch.old_log_probs = initial

    def run(checkpointing: bool) -> tuple[torch.Tensor, torch.Tensor, dict]:
        spec = WorkerSpec(
            model_path=path,
            model=ModelConfig(path=path, enable_gradient_checkpointing=checkpointing),
            actor=actor_config(
                use_kl_loss=True,
                kl_loss_coef=0.1,
                ppo_epochs=1,
                optim=OptimConfig(lr=2e-4, weight_decay=0.0, lr_warmup_steps_ratio=0.5),
            ),
            ref=RefConfig(),
            need_ref=True,
            device="cpu",
            total_steps=4,  # warm-up: 2 training steps
        )
        group = WorkerGroup(spec, world_size=2)
        try:
            batch.ref_log_probs = group.compute_ref_log_prob(batch)
            metrics = group.update_actor(batch, samples_per_mini_batch=len(batch) // 2, seed=0)
            after, _ = group.compute_log_prob(batch)
            ref_after = group.compute_ref_log_prob(batch)
            state = group.full_state_dict()
        finally:
            group.shutdown()
        assert torch.allclose(ref_after, initial, atol=LOGP_ATOL)
        assert (after - initial).abs().max() > 1e-4
        assert "actor/kl_loss" in metrics
        assert metrics["actor/optimizer_steps"] == 2
        assert metrics["actor/lr"] == pytest.approx(1e-4)  # 2e-4 x 1/2 for both steps
        return after, state["model.layers.0.self_attn.q_proj.weight"], metrics

    plain_logp, plain_w, plain_m = run(False)
    ckpt_logp, ckpt_w, ckpt_m = run(True)
    assert torch.allclose(plain_logp, ckpt_logp, atol=LOGP_ATOL)
    assert (plain_w - ckpt_w).abs().max() < WEIGHT_ATOL
    assert ckpt_m["actor/pg_loss"] == pytest.approx(plain_m["actor/pg_loss"], rel=LOSS_RTOL)
