"""LoRA vs full fine-tuning benchmark (``make bench``, issue 24): smollm2-135m-instruct on 2
FSDP2 gloo ranks (Ray actors) and one vLLM CPU server started with LoRA enabled, in the same
run. For each method, after a warm-up step:

- the actor update's seconds on one fixed GRPO batch (2 PPO mini-batches);
- each rank's trainer memory: peak RSS, and the bytes of trainable parameters, gradients
  and optimizer state it holds;
- the weight sync as the trainer runs it (``WorkerGroup.push_weights``): full weights by the
  staged route, or the adapter loaded as the server's next LoRA version; bytes and seconds.

Rounds alternate the methods' syncs so load from other processes hits both alike. Targets
(printed): the adapter sync moves < 5% of the full sync's bytes and takes less time.
Writes bench_results/lora.json. The demo's held-out accuracy with each method comes from
``DEMO_LORA=1 make demo`` (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import ray
import torch

from servers import ServerConfig, launch_servers
from trainer.config.actor import ActorConfig, ModelConfig, OptimConfig, RefConfig
from trainer.models import prepare
from trainer.workers import TrainBatch, WorkerGroup, WorkerSpec

RANK, ALPHA = 16, 32
ROUNDS = 3


def grpo_batch(n: int = 8, prompt: int = 96, response: int = 160) -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 40000, (n, prompt + response), generator=g)
    attn = torch.ones_like(ids)
    mask = torch.ones(n, response, dtype=torch.long)
    mask[:, 40:70] = 0  # a tool response in every sample
    return TrainBatch(
        input_ids=ids,
        attention_mask=attn,
        position_ids=attn.cumsum(1) - 1,
        response_mask=mask,
        advantages=torch.randn(n, 1, generator=g).expand(n, response).clone() * mask,
    )


def spec_for(path: Path, lora: bool) -> WorkerSpec:
    model = ModelConfig(
        path=str(path),
        lora_rank=RANK if lora else 0,
        lora_alpha=ALPHA,
        target_modules="all-linear",
    )
    actor = ActorConfig(
        optim=OptimConfig(lr=1e-4 if lora else 1e-5, weight_decay=0.0),
        ppo_mini_batch_size=4,
        ppo_micro_batch_size_per_gpu=2,
    )
    return WorkerSpec(
        model_path=str(path), model=model, actor=actor, ref=RefConfig(), need_ref=False,
        device="cpu",
    )  # fmt: skip


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def test_bench_lora_vs_full_fine_tuning_smollm2(ray_local):
    path = prepare("smollm2-135m-instruct")
    (server,) = launch_servers(
        ServerConfig(model=str(path), max_model_len=1024, http=False, lora_rank=RANK)
    )
    batch = grpo_batch()
    groups = {m: WorkerGroup(spec_for(path, m == "lora"), 2) for m in ("full", "lora")}
    step: dict[str, list[float]] = {m: [] for m in groups}
    sync: dict[str, list[float]] = {m: [] for m in groups}
    sent: dict[str, dict] = {}
    try:
        batch.old_log_probs = groups["full"].compute_log_prob(batch)[0]  # the same start
        for method, group in groups.items():  # warm-ups
            group.update_actor(batch, samples_per_mini_batch=len(batch), seed=0)
            sent[method] = group.push_weights([server], 256 << 20)
        for _ in range(ROUNDS):
            for method, group in groups.items():
                t = time.perf_counter()
                group.update_actor(batch, samples_per_mini_batch=len(batch), seed=0)
                step[method].append(time.perf_counter() - t)
                t = time.perf_counter()
                group.push_weights([server], 256 << 20)
                sync[method].append(time.perf_counter() - t)
        memory = {m: g.memory_stats() for m, g in groups.items()}
        health = ray.get(server.health.remote())
    finally:
        for group in groups.values():
            group.shutdown()
        ray.get(server.shutdown.remote())
        ray.kill(server)

    rows = {
        "update step (s, median)": {m: _median(step[m]) for m in groups},
        "weight sync (s, median)": {m: _median(sync[m]) for m in groups},
        "weight sync (MB)": {m: sent[m]["bytes"] / 1e6 for m in groups},
        "peak RSS per rank (MB)": {m: max(r["peak_rss_mb"] for r in memory[m]) for m in groups},
        "trainable params per rank (MB)": {
            m: max(r["trainable_mb"] for r in memory[m]) for m in groups
        },
        "gradients per rank (MB)": {m: max(r["grad_mb"] for r in memory[m]) for m in groups},
        "optimizer state per rank (MB)": {
            m: max(r["optimizer_mb"] for r in memory[m]) for m in groups
        },
    }
    result = {
        "model": "smollm2-135m-instruct",
        "lora": {"rank": RANK, "alpha": ALPHA, "target_modules": "all-linear"},
        "trainer_ranks": 2,
        "rounds": ROUNDS,
        "rows": rows,
        "all": {"step": step, "sync": sync},
        "memory": memory,
    }
    out = Path("bench_results")
    out.mkdir(exist_ok=True)
    (out / "lora.json").write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"\n[bench] LoRA (rank {RANK}, all linear layers) vs full fine-tuning, "
        f"smollm2-135m-instruct, 2 gloo FSDP2 ranks, vLLM CPU server, {ROUNDS} rounds"
    )
    print(f"  {'':<32}{'full':>10}{'LoRA':>10}{'LoRA/full':>11}")
    for name, row in rows.items():
        ratio = row["lora"] / row["full"] if row["full"] else float("nan")
        print(f"  {name:<32}{row['full']:>10.3f}{row['lora']:>10.3f}{ratio:>11.4f}")
    mb = rows["weight sync (MB)"]
    print(
        f"  adapter sync < 5% of the full sync's bytes: {mb['lora'] < 0.05 * mb['full']} (target)"
    )
    faster = rows["weight sync (s, median)"]
    print(f"  adapter sync sooner than the full sync: {faster['lora'] < faster['full']} (target)")
    assert health["lora_version"] == 1 + ROUNDS  # every LoRA push loaded a new version
    assert 0 < mb["lora"] < mb["full"]
