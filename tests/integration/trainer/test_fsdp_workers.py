"""FSDP2 on 2 gloo ranks (Ray actors) against one process without FSDP on the same batch:
same log-probs, same loss, same weights after the update; the same with a LoRA adapter, whose
checkpoints resume exactly and whose exports load with PEFT and with transformers alone."""

from __future__ import annotations

import copy

import pytest
import torch

from trainer.algos.correction import CorrectionSpec
from trainer.config.actor import ActorConfig, ModelConfig, OptimConfig, RefConfig
from trainer.workers import TrainBatch, WorkerGroup, WorkerSpec, log_probs_in_micro_batches
from trainer.workers.fsdp import load_model
from trainer.workers.fsdp_worker import adamw
from trainer.workers.inert import skip_inert_rows
from trainer.workers.lora import adapter_tensors, trainable_parameters
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


def actor_config(**overrides) -> ActorConfig:
    base = dict(
        optim=OptimConfig(lr=1e-4, weight_decay=0.0),
        ppo_micro_batch_size_per_gpu=2,
        ppo_epochs=2,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
    )
    return ActorConfig(**{**base, **overrides})


def two_ranks(path: str, cfg: ActorConfig) -> WorkerGroup:
    """Two FSDP2 gloo ranks of the actor ``cfg`` on the model at ``path``."""
    spec = WorkerSpec(
        model_path=path,
        model=ModelConfig(path=path),
        actor=cfg,
        ref=RefConfig(),
        need_ref=False,
        device="cpu",
    )
    return WorkerGroup(spec, world_size=2)


def test_two_gloo_ranks_match_one_process(local_ray, tiny_qwen3_path):
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
    group = two_ranks(path, cfg)
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


def test_two_gloo_ranks_take_their_old_log_probs_from_the_update_as_one_process(
    local_ray, tiny_qwen3_path
):
    """One optimizer step on a batch without old log-probs: each rank's update takes them
    from its own forward; the log-probs and entropies come back in batch order, equal to a
    pass's, and the weights move as one process's update given that pass's log-probs. Rows 2,
    3 and 5 have advantage 0: the ranks skip them (fillers standing in for them,
    ``trainer.workers.inert``) and, one sample a micro-batch, leave their micro-batches out,
    the rank with fewer left running idle ones to match the other's count; the one process
    computes everything, and the weights still agree."""
    path = str(tiny_qwen3_path)
    cfg = actor_config(ppo_epochs=1, ppo_micro_batch_size_per_gpu=1)
    batch = make_batch()
    batch.advantages[[2, 3, 5]] = 0.0
    computed, skipped = skip_inert_rows(batch, cfg, CorrectionSpec())
    assert skipped.tolist() == [False, False, True, True, False, True, False, False]
    model = load_model(path, ModelConfig(path=path), "cpu")
    old, entropy = log_probs_in_micro_batches(model, batch, micro_batch_size=8, with_entropy=True)
    given = copy.deepcopy(batch)
    given.old_log_probs = old
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    update_policy(model, optimizer, None, given, cfg, samples_per_mini_batch=len(batch))
    expected = model.state_dict()
    group = two_ranks(path, cfg)
    try:
        metrics, logp, ent = group.update_actor_on_policy(computed, seed=0)
        state = group.full_state_dict()
    finally:
        group.shutdown()
    assert metrics["actor/optimizer_steps"] == 1.0 and metrics["actor/ppo_kl"] == 0.0
    live = ~skipped
    assert torch.allclose(logp[live], old[live], atol=LOGP_ATOL), (logp - old)[live].abs().max()
    assert (logp[skipped] == 0).all()  # not computed
    assert entropy is not None
    assert torch.allclose(ent[live], entropy[live], atol=LOGP_ATOL)
    worst = max((state[k] - v).abs().max().item() for k, v in expected.items())
    assert worst < WEIGHT_ATOL


def test_reference_policy_stays_frozen_and_checkpointing_matches(local_ray, tiny_qwen3_path):
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


# ---- LoRA -----------------------------------------------------------------------------------
LORA = {"lora_rank": 8, "lora_alpha": 16}
# Adam moves every adapter entry by ~lr per step, also those whose gradient is near zero (A's
# gradient in step 2 is proportional to B, itself ~lr): float32 sums in another order change
# such entries by ~1% of a step. Measured in one process, micro-batches of 2 vs 1: 5.6e-6 at
# lr 1e-3, 3.2e-7 at lr 1e-4; so lr 1e-4 (B moves by 2e-4) and a bound of 1e-6.
LORA_LR, LORA_WEIGHT_ATOL = 1e-4, 1e-6


def lora_spec(path: str, cfg: ActorConfig, need_ref: bool = False) -> WorkerSpec:
    return WorkerSpec(
        model_path=path,
        model=ModelConfig(path=path, **LORA),
        actor=cfg,
        ref=RefConfig(),
        need_ref=need_ref,
        device="cpu",
    )


def unmerged(merged: dict, adapter: dict, prefix: str = "base_model.model.") -> dict:
    """The base weights under a merged state: each adapted W + s * B @ A minus s * B @ A."""
    base = dict(merged)
    scaling = LORA["lora_alpha"] / LORA["lora_rank"]
    for name, a in adapter.items():
        if ".lora_A." in name:
            module = name[len(prefix) : -len(".lora_A.weight")]
            b = adapter[name.replace(".lora_A.", ".lora_B.")]
            base[f"{module}.weight"] = merged[f"{module}.weight"] - scaling * b @ a
    return base


def test_two_gloo_ranks_with_lora_train_the_adapter_as_one_process(local_ray, tiny_qwen3_path):
    """LoRA (rank 8, all linear layers) on 2 FSDP2 ranks against one process without FSDP: the
    same adapter after 2 Adam steps, the base weights untouched, optimizer state for the
    adapter only, and the reference policy (adapter off) is the base model."""
    path = str(tiny_qwen3_path)
    cfg = actor_config(
        optim=OptimConfig(lr=LORA_LR, weight_decay=0.0), use_kl_loss=True, kl_loss_coef=0.1
    )
    batch = make_batch(seed=5)
    initial = load_model(path, ModelConfig(path=path), "cpu").state_dict()
    # ---- one process, no FSDP (seeded as every rank is: the same initial A)
    torch.manual_seed(0)
    model = load_model(path, ModelConfig(path=path, **LORA), "cpu")
    base_logp, _ = log_probs_in_micro_batches(model, batch, micro_batch_size=8)  # B = 0
    noise = torch.randn(base_logp.shape, generator=torch.Generator().manual_seed(1))
    batch.old_log_probs = base_logp + 0.1 * noise * batch.response_mask
    batch.ref_log_probs = base_logp
    optimizer = adamw(model, cfg.optim)
    single = update_policy(
        model, optimizer, None, copy.deepcopy(batch), cfg, samples_per_mini_batch=len(batch)
    )
    expected = dict(adapter_tensors(model))
    assert {id(p) for p in optimizer.state} == {id(p) for p in trainable_parameters(model)}
    # ---- two FSDP2 ranks over gloo
    group = WorkerGroup(lora_spec(path, cfg, need_ref=True), world_size=2)
    try:
        logp, _ = group.compute_log_prob(batch)
        ref = group.compute_ref_log_prob(batch)
        sharded = group.update_actor(batch, samples_per_mini_batch=len(batch), seed=0)
        after, _ = group.compute_log_prob(batch)
        ref_after = group.compute_ref_log_prob(batch)
        adapter, config = group.adapter_state()
        merged = group.full_state_dict()
        memory = group.memory_stats()
    finally:
        group.shutdown()
    assert torch.allclose(logp, base_logp, atol=LOGP_ATOL)
    assert torch.allclose(ref, base_logp, atol=LOGP_ATOL)
    assert torch.allclose(ref_after, base_logp, atol=LOGP_ATOL)  # the adapter off: the base
    moved = (after - base_logp).abs().max().item()
    assert moved > 10 * LOGP_ATOL
    assert single["actor/optimizer_steps"] == sharded["actor/optimizer_steps"] == 2
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss"):
        assert sharded[key] == pytest.approx(single[key], rel=LOSS_RTOL), key
    # the same adapter as one process
    assert list(adapter) == list(expected) and config["r"] == LORA["lora_rank"]
    worst = max((adapter[k] - v).abs().max().item() for k, v in expected.items())
    change = max(v.abs().max().item() for k, v in adapter.items() if ".lora_B." in k)
    print(
        f"LoRA fsdp2 x2 vs one process: max adapter diff {worst:.2e}, max |B| {change:.2e}, "
        f"max actor log-prob change {moved:.2e}"
    )
    assert worst <= LORA_WEIGHT_ATOL
    assert change > LORA_LR  # B left zero: the adapter moved
    # the base weights did not move: the merged state minus the adapter is the initial model
    base = unmerged(merged, adapter)
    assert list(base) == list(initial)
    drift = max((base[k] - v).abs().max().item() for k, v in initial.items())
    assert drift < 1e-6, drift
    # optimizer state on each rank: exp_avg and exp_avg_sq of its adapter shard (+ step scalars)
    for rank in memory:
        assert rank["trainable_mb"] > 0
        assert 2 * rank["trainable_mb"] <= rank["optimizer_mb"] < 2 * rank["trainable_mb"] + 0.01


def test_lora_checkpoint_resumes_exactly_and_exports_adapter_and_merged_model(
    local_ray, tiny_qwen3_path, tmp_path
):
    """A LoRA checkpoint holds the adapter and its optimizer state only; new ranks that load it
    continue bit for bit as the uninterrupted ranks do. The hf_model export is a PEFT adapter
    folder and hf_merged a plain transformers folder, both giving the actor's log-probs."""
    import torch.distributed.checkpoint as dcp
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    path = str(tiny_qwen3_path)
    cfg = actor_config(optim=OptimConfig(lr=1e-3, weight_decay=0.0), ppo_epochs=1)
    first, second = make_batch(seed=6), make_batch(seed=7)
    initial = load_model(path, ModelConfig(path=path), "cpu")
    for batch in (first, second):
        batch.old_log_probs, _ = log_probs_in_micro_batches(initial, batch, micro_batch_size=8)
    actor = tmp_path / "actor"
    contents = ["model", "optimizer", "hf_model", "hf_merged"]
    group = WorkerGroup(lora_spec(path, cfg), world_size=2)
    try:
        group.update_actor(first, samples_per_mini_batch=len(first), seed=0)
        group.save_checkpoint(str(actor), contents)
        saved_logp, _ = group.compute_log_prob(second)
        group.update_actor(second, samples_per_mini_batch=len(second), seed=1)
        uninterrupted = group.adapter_state()[0]
    finally:
        group.shutdown()
    group = WorkerGroup(lora_spec(path, cfg), world_size=2)
    try:
        info = group.load_checkpoint(str(actor))
        loaded_logp, _ = group.compute_log_prob(second)
        group.update_actor(second, samples_per_mini_batch=len(second), seed=1)
        resumed = group.adapter_state()[0]
    finally:
        group.shutdown()
    assert info == {"optimizer": True, "updates": 1}
    assert torch.equal(loaded_logp, saved_logp)
    assert list(resumed) == list(uninterrupted)
    assert all(torch.equal(resumed[k], v) for k, v in uninterrupted.items())
    # the sharded checkpoint: adapter entries only (model and optimizer)
    keys = dcp.FileSystemReader(str(actor / "dcp")).read_metadata().state_dict_metadata
    model_keys = [k for k in keys if k.startswith("model.")]
    assert model_keys and all(".lora_A." in k or ".lora_B." in k for k in model_keys)
    assert all(".lora_" in k for k in keys if k.startswith("optimizer.state."))
    dcp_mb = sum(f.stat().st_size for f in (actor / "dcp").iterdir()) / 1e6
    full_mb = (tiny_qwen3_path / "model.safetensors").stat().st_size / 1e6
    print(f"LoRA dcp checkpoint {dcp_mb:.3f} MB (model.safetensors {full_mb:.1f} MB)")
    assert dcp_mb < full_mb / 50
    # the exports give the actor's log-probs at the checkpoint
    adapter_dir, merged_dir = actor / "huggingface", actor / "huggingface_merged"
    assert (adapter_dir / "adapter_config.json").is_file()
    assert not (adapter_dir / "model.safetensors").exists()
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path), adapter_dir)
    merged_model = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    for name, exported in (("adapter", peft_model), ("merged", merged_model)):
        logp, _ = log_probs_in_micro_batches(exported, second, micro_batch_size=8)
        diff = (logp - saved_logp).abs().max().item()
        print(f"{name} export vs the actor: max log-prob diff {diff:.2e}")
        assert diff < 1e-5, name
