"""FSDP2 on CUDA (marker ``gpu``; skipped without CUDA): NCCL process group, bf16 mixed
precision, a PPO update. Runs without Ray (``torch.multiprocessing``) so it works on a GPU
machine that has only torch and transformers, on a small random Qwen3 built in the test."""

from __future__ import annotations

import math
import os
import socket
from dataclasses import replace

import pytest
import torch
import torch.multiprocessing as mp

from trainer.config.actor import ActorConfig, FSDPConfig, ModelConfig, OptimConfig
from trainer.workers import TrainBatch, log_probs_in_micro_batches, update_policy
from trainer.workers.fsdp import apply_fsdp, init_distributed, load_model

pytestmark = [pytest.mark.gpu, pytest.mark.integration]


def _tiny_model(path: str) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    )  # fmt: skip
    Qwen3ForCausalLM(config).save_pretrained(path)


def _batch() -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 512, (4, 24), generator=g)
    attn = torch.ones_like(ids)
    attn[0, :4] = 0
    mask = attn[:, 8:].clone()
    return TrainBatch(
        input_ids=ids,
        attention_mask=attn,
        position_ids=(attn.cumsum(1) - 1).clamp(min=0),
        response_mask=mask,
        advantages=torch.randn(4, 1, generator=g).expand(4, 16).clone() * mask,
    )


def _rank(rank: int, world: int, port: int, path: str, out: dict) -> None:
    os.environ["LOCAL_RANK"] = str(rank)
    init_distributed(rank, world, f"127.0.0.1:{port}", "cuda")
    model = apply_fsdp(load_model(path, ModelConfig(path=path), "cuda"), FSDPConfig(), "cuda")
    batch = _batch().chunk(world)[rank]
    logp, _ = log_probs_in_micro_batches(model, batch, micro_batch_size=2)
    batch.old_log_probs = logp
    cfg = ActorConfig(optim=OptimConfig(lr=1e-4), ppo_micro_batch_size_per_gpu=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    metrics = update_policy(model, optimizer, None, batch, cfg, samples_per_mini_batch=len(batch))
    if rank == 0:
        out["logp"] = logp
        out["metrics"] = metrics
    torch.distributed.destroy_process_group()


def _spawn(fn, tmp_path) -> tuple[str, int, dict]:
    """Run ``fn(rank, world, port, path, out)`` on up to 2 GPUs over a saved tiny model;
    returns the model folder, the world size and what rank 0 put in ``out``."""
    path = str(tmp_path / "model")
    _tiny_model(path)
    world = min(2, torch.cuda.device_count())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(fn, args=(world, port, path, out), nprocs=world, join=True)
    return path, world, out


def test_fsdp2_nccl_bf16_update(tmp_path):
    path, world, out = _spawn(_rank, tmp_path)
    # bf16 compute vs the fp32 CPU model: close, not equal
    cpu = load_model(path, ModelConfig(path=path), "cpu")
    reference, _ = log_probs_in_micro_batches(cpu, _batch().chunk(world)[0], micro_batch_size=2)
    assert (out["logp"] - reference).abs().max() < 0.1
    assert torch.isfinite(torch.tensor(out["metrics"]["actor/grad_norm"]))
    assert out["metrics"]["actor/optimizer_steps"] == 1


def _layout_rank(rank: int, world: int, port: int, path: str, out: dict) -> None:
    os.environ["LOCAL_RANK"] = str(rank)
    init_distributed(rank, world, f"127.0.0.1:{port}", "cuda")
    batch = _batch().chunk(world)[rank]
    cfg = ActorConfig(optim=OptimConfig(lr=1e-4), ppo_micro_batch_size_per_gpu=2)
    for packed in (True, False):
        config = ModelConfig(path=path, use_remove_padding=packed)
        model = apply_fsdp(load_model(path, config, "cuda"), FSDPConfig(), "cuda")
        logp, _ = log_probs_in_micro_batches(
            model, batch, micro_batch_size=2, remove_padding=packed
        )
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        metrics = update_policy(
            model, optimizer, None, replace(batch, old_log_probs=logp), cfg,
            samples_per_mini_batch=len(batch), remove_padding=packed,
        )  # fmt: skip
        if rank == 0:
            out["packed" if packed else "padded"] = (logp.cpu(), metrics["actor/grad_norm"])
    torch.distributed.destroy_process_group()


def test_padded_rows_with_left_padding_update_like_packed_rows(tmp_path):
    """A micro-batch whose rows are left-padded (query rows with no real key) in bf16 on CUDA:
    the padded layout's gradient is finite and matches the packed layout's (the memory-
    efficient kernel's backward made it NaN before ``guard_padded_attention``)."""
    batch = _batch()
    assert not batch.attention_mask[:2, 0].all()  # the control: a left-padded row
    _, world, out = _spawn(_layout_rank, tmp_path)
    (packed, packed_norm), (padded, padded_norm) = out["packed"], out["padded"]
    sampled = _batch().chunk(world)[0].response_mask.bool()
    assert (packed - padded)[sampled].abs().max() < 0.05
    assert math.isfinite(padded_norm) and math.isfinite(packed_norm)
    assert abs(padded_norm - packed_norm) < 0.05 * packed_norm


def _lora_rank(rank: int, world: int, port: int, path: str, out: dict) -> None:
    from trainer.workers.fsdp_worker import adamw
    from trainer.workers.lora import adapter_tensors, merged_tensors

    os.environ["LOCAL_RANK"] = str(rank)
    init_distributed(rank, world, f"127.0.0.1:{port}", "cuda")
    torch.manual_seed(0)
    config = ModelConfig(path=path, lora_rank=4, lora_alpha=8, enable_gradient_checkpointing=True)
    model = apply_fsdp(load_model(path, config, "cuda"), FSDPConfig(), "cuda")
    batch = _batch().chunk(world)[rank]
    logp, _ = log_probs_in_micro_batches(model, batch, micro_batch_size=2)
    batch.old_log_probs = logp
    cfg = ActorConfig(optim=OptimConfig(lr=1e-3), ppo_micro_batch_size_per_gpu=1)
    optimizer = adamw(model, cfg.optim)
    metrics = update_policy(model, optimizer, None, batch, cfg, samples_per_mini_batch=len(batch))
    adapter = dict(adapter_tensors(model, dtype=torch.bfloat16, device=None))
    merged = dict(merged_tensors(model, dtype=torch.bfloat16, device=None, skip_tied_head=True))
    if rank == 0:
        out["metrics"] = metrics
        out["adapter_device"] = {str(v.device) for v in adapter.values()}
        out["adapter_dtype"] = {v.dtype for v in adapter.values()}
        out["max_b"] = max(v.abs().max().item() for k, v in adapter.items() if "lora_B" in k)
        out["merged_names"] = list(merged)
    torch.distributed.destroy_process_group()


def test_lora_fsdp2_nccl_bf16_update_moves_only_the_adapter(tmp_path):
    """LoRA under bf16 mixed precision with activation checkpointing on NCCL ranks: the update
    runs, the adapter moves, and both exports gather on the GPU in the serving dtype."""
    pytest.importorskip("peft")
    path, _, out = _spawn(_lora_rank, tmp_path)
    assert torch.isfinite(torch.tensor(out["metrics"]["actor/grad_norm"]))
    assert out["metrics"]["actor/optimizer_steps"] == 1
    assert out["max_b"] > 0  # B started at zero
    assert out["adapter_dtype"] == {torch.bfloat16}
    assert all(d.startswith("cuda") for d in out["adapter_device"])
    plain = load_model(path, ModelConfig(path=path), "cpu").state_dict()
    assert out["merged_names"] == list(plain)  # untied: every entry, transformers' names


def _critic_rank(rank: int, world: int, port: int, path: str, out: dict) -> None:
    from trainer.algos.value import gae_for_policy
    from trainer.config.critic import CriticConfig
    from trainer.workers.critic import Critic

    os.environ["LOCAL_RANK"] = str(rank)
    init_distributed(rank, world, f"127.0.0.1:{port}", "cuda")
    actor = ActorConfig(ppo_micro_batch_size_per_gpu=1)
    critic = Critic(CriticConfig().spec(actor, ModelConfig(path=path)), "cuda", total_steps=1)
    batch = _batch().chunk(world)[rank]
    batch.values = critic.compute_values(batch)
    rewards = torch.zeros_like(batch.response_mask, dtype=torch.float32)
    rewards[:, -1] = 1.0
    batch.advantages, batch.returns = gae_for_policy(
        rewards, batch.values, batch.response_mask, gamma=1.0, lam=0.95
    )
    metrics = critic.update(batch, samples_per_mini_batch=len(batch), seed=0)
    after = critic.compute_values(batch)
    if rank == 0:
        out["metrics"] = metrics
        out["values"] = batch.values
        out["after"] = after
    torch.distributed.destroy_process_group()


def test_critic_fsdp2_nccl_bf16_update(tmp_path):
    """The critic (value head on the same architecture) on NCCL in bf16: values near the fp32
    CPU value model's, a finite update that moves them toward the returns."""
    from trainer.workers.critic import CRITIC_SEED

    path, world, out = _spawn(_critic_rank, tmp_path)
    torch.manual_seed(CRITIC_SEED)
    cpu = load_model(path, ModelConfig(path=path), "cpu", value_head=True)
    from trainer.workers.critic_math import values_in_micro_batches

    reference = values_in_micro_batches(cpu, _batch().chunk(world)[0], micro_batch_size=2)
    assert (out["values"] - reference).abs().max() < 0.1
    assert torch.isfinite(torch.tensor(out["metrics"]["critic/grad_norm"]))
    assert out["metrics"]["critic/vf_loss"] > 0
    assert not torch.equal(out["after"], out["values"])
