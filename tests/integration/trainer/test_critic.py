"""The critic (PPO's value model) on real FSDP2 gloo ranks: 2 ranks update it as one process
does, packed and padded micro-batches give the same values, and its checkpoint resumes
bit-exactly (values, weights, and the next update)."""

from __future__ import annotations

import pytest
import torch

from tests.integration.trainer.test_fsdp_workers import make_batch
from trainer.algos.value import gae_for_policy
from trainer.config.actor import ActorConfig, ModelConfig, OptimConfig, RefConfig
from trainer.config.critic import CriticConfig, CriticModelConfig
from trainer.workers import WorkerGroup, WorkerSpec
from trainer.workers.critic import CRITIC_SEED
from trainer.workers.critic_math import update_critic, values_in_micro_batches
from trainer.workers.fsdp import load_model

pytestmark = pytest.mark.integration

# Two Adam steps at lr 1e-5 move the weights by ~2e-5; float32 sums in another order (rank
# partials, all-reduce) change them by far less than 1e-6 (the bound).
VALUE_ATOL, WEIGHT_ATOL = 1e-5, 1e-6


def critic_batch(seed: int = 0):
    batch = make_batch(seed=seed)
    rewards = torch.zeros_like(batch.advantages)
    last = (batch.response_mask.cumsum(1) == batch.response_mask.sum(1, keepdim=True)) & (
        batch.response_mask == 1
    )
    scores = torch.randint(0, 2, (len(batch), 1), generator=torch.Generator().manual_seed(seed))
    rewards[last] = scores.expand_as(rewards)[last].float()
    return batch, rewards


def spec_for(path: str, critic: CriticConfig, use_remove_padding: bool = True) -> WorkerSpec:
    actor = ActorConfig(ppo_micro_batch_size_per_gpu=2)
    model = ModelConfig(path=path, use_remove_padding=use_remove_padding)
    return WorkerSpec(
        model_path=path,
        model=model,
        actor=actor,
        ref=RefConfig(),
        need_ref=False,
        device="cpu",
        critic=critic.spec(actor, model),
    )


CRITIC = CriticConfig(optim=OptimConfig(lr=1e-5, weight_decay=0.0), ppo_epochs=2)


def test_critic_on_two_gloo_ranks_matches_one_process(local_ray, tiny_qwen3_path):
    path = str(tiny_qwen3_path)
    batch, rewards = critic_batch()
    spec = spec_for(path, CRITIC)
    # ---- one process, no FSDP: the same seeded value head
    torch.manual_seed(CRITIC_SEED)
    model = load_model(path, spec.critic.model, "cpu", value_head=True)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    values = values_in_micro_batches(model, batch, micro_batch_size=8)
    batch.advantages, batch.returns = gae_for_policy(
        rewards, values, batch.response_mask, gamma=1.0, lam=0.95
    )
    batch.values = values
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    # 2 ranks x 2 mini-batches: rank r holds rows 4r..4r+3 and its j-th mini-batch the j-th
    # pair of them, so the j-th global mini-batch is rows {2j, 2j+1, 4+2j, 5+2j}
    order = torch.tensor([0, 1, 4, 5, 2, 3, 6, 7])
    single = update_critic(
        model, optimizer, batch.select(order), spec.critic, samples_per_mini_batch=4, seed=3
    )
    expected = model.state_dict()
    # ---- two FSDP2 ranks over gloo, the actor beside it; rows balanced by tokens over the
    # ranks within each mini-batch (trainer.balance_batch), which changes no mini-batch
    group = WorkerGroup(spec, world_size=2, balance=True)
    try:
        sharded_values = group.compute_values(batch)
        sharded = group.update_critic(batch, mini_batches=2, seed=3)
        state = group.full_state_dict(critic=True)
    finally:
        group.shutdown()
    assert torch.allclose(sharded_values, values, atol=VALUE_ATOL)
    assert (values[batch.response_mask == 0] == 0).all()
    assert single["critic/optimizer_steps"] == sharded["critic/optimizer_steps"] == 4
    for key in ("critic/vf_loss", "critic/grad_norm", "critic/vpred_mean"):
        assert sharded[key] == pytest.approx(single[key], rel=1e-4, abs=1e-6), key
    assert set(state) == set(expected)
    worst = max((state[k] - v).abs().max().item() for k, v in expected.items())
    moved = max((v - initial[k]).abs().max().item() for k, v in expected.items())
    print(f"critic fsdp2 x2 vs one process: max weight diff {worst:.2e}, change {moved:.2e}")
    assert worst <= WEIGHT_ATOL
    assert moved > 1e-5  # the update changed the weights


def test_critic_values_packed_equal_padded_and_the_loss_clips(tiny_qwen3_path):
    """Values do not depend on packing; a return far from the old values makes the clipped
    term win on every token (vf_clipfrac 1 after the first step moved the values)."""
    path = str(tiny_qwen3_path)
    batch, _ = critic_batch(seed=2)
    packed_spec = spec_for(path, CRITIC).critic
    torch.manual_seed(CRITIC_SEED)
    model = load_model(path, packed_spec.model, "cpu", value_head=True)
    packed = values_in_micro_batches(model, batch, micro_batch_size=3, remove_padding=True)
    padded = values_in_micro_batches(model, batch, micro_batch_size=3, remove_padding=False)
    assert torch.allclose(packed, padded, atol=VALUE_ATOL), (packed - padded).abs().max()
    batch.values = packed
    batch.returns = (packed + 10.0) * batch.response_mask  # far beyond cliprange_value=0.5
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    metrics = update_critic(model, optimizer, batch, packed_spec, samples_per_mini_batch=4)
    assert 0.0 < metrics["critic/vf_clipfrac"] <= 1.0
    assert metrics["critic/vf_loss"] == pytest.approx(0.5 * 100, rel=0.1)


def test_critic_checkpoint_resumes_bit_exactly(local_ray, tiny_qwen3_path, tmp_path):
    """Save, train on, load: the loaded critic's values and weights are bit-equal to the saved
    ones, and the next update from it is bit-equal to the first one from the saved state
    (optimizer moments and schedule restored)."""
    path = str(tiny_qwen3_path)
    batch, rewards = critic_batch(seed=5)
    critic = CriticConfig(
        optim=OptimConfig(lr=1e-4, weight_decay=0.0, lr_warmup_steps=3),
        model=CriticModelConfig(),
        checkpoint=CRITIC.checkpoint,
    )
    group = WorkerGroup(spec_for(path, critic), world_size=2)
    try:
        batch.values = group.compute_values(batch)
        batch.advantages, batch.returns = gae_for_policy(
            rewards, batch.values, batch.response_mask, gamma=1.0, lam=1.0
        )
        group.update_critic(batch, mini_batches=1)
        group.save_critic(str(tmp_path / "critic"), ["model", "optimizer", "hf_model"])
        saved_values = group.compute_values(batch)
        saved_state = group.full_state_dict(critic=True)
        first = group.update_critic(batch, mini_batches=1)
        after_first = group.full_state_dict(critic=True)
        group.update_critic(batch, mini_batches=1)  # move further away
        assert not torch.equal(group.compute_values(batch), saved_values)
        loaded = group.load_critic(str(tmp_path / "critic"))
        assert loaded == {"optimizer": True, "updates": 1}
        assert torch.equal(group.compute_values(batch), saved_values)
        state = group.full_state_dict(critic=True)
        assert all(torch.equal(state[k], v) for k, v in saved_state.items())
        again = group.update_critic(batch, mini_batches=1)
        after_again = group.full_state_dict(critic=True)
    finally:
        group.shutdown()
    assert again == first  # same loss, grad norm and warm-up learning rate, bit for bit
    assert all(torch.equal(after_again[k], v) for k, v in after_first.items())
    # the exported value model loads with transformers alone
    from transformers import AutoModelForTokenClassification

    exported = AutoModelForTokenClassification.from_pretrained(tmp_path / "critic" / "huggingface")
    assert exported.config.num_labels == 1
    assert torch.equal(exported.score.weight.detach(), saved_state["score.weight"])
