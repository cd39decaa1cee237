"""``trainer.balance_batch`` on 2 real FSDP2 gloo ranks (``make bench``; issue 40): the same
PPO update of smollm2-135m-instruct with and without balancing, one run, one machine.

The batch is agentic (``actor_workload.agentic_batch``: 16 samples, 4 prompts x n=4,
lognormal multi-turn responses, median 160 tokens, cap 768, 25% tool tokens) in 2 mini-batches
(one optimizer step each), dynamic micro-batches of 1024 real tokens. Without balancing each
rank takes an equal contiguous share of every mini-batch, so one rank can hold most of the
tokens while the other waits at the gradient all-reduce; with it, each mini-batch's rows are
spread by tokens. After a warm-up update on the same ranks, each side runs the update 3 times
(weights move, the work does not); prints the per-rank token imbalance and the median update
seconds of both sides and the speed-up; writes bench_results/balance_batch.json.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest
import torch

from tests.perf.actor_workload import AgenticBatchSpec, agentic_batch, two_cpu_ranks
from trainer.config.actor import ActorConfig, OptimConfig
from trainer.workers import WorkerGroup
from trainer.workers.balance import rank_layout

REPO = Path(__file__).resolve().parents[2]
SPEC = AgenticBatchSpec(
    prompts=4, n=4, prompt_len=(40, 120), response_median=160, response_cap=768,
    vocab_size=49152, seed=3,
)  # fmt: skip
MINI_BATCHES, REPEATS = 2, 3


def _timed(group: WorkerGroup, batch, balance: bool) -> tuple[list[float], dict]:
    group.balance = balance
    group.update_actor(batch, mini_batches=MINI_BATCHES)  # warm-up
    times, metrics = [], {}
    for _ in range(REPEATS):
        start = time.perf_counter()
        metrics = group.update_actor(batch, mini_batches=MINI_BATCHES)
        times.append(time.perf_counter() - start)
    return times, metrics


@pytest.mark.slow
def test_bench_balance_batch_on_two_ranks(ray_local, smollm2_path):
    batch = agentic_batch(SPEC)
    batch.old_log_probs = torch.zeros(batch.response_mask.shape)
    g = torch.Generator().manual_seed(0)
    batch.advantages = torch.randn(len(batch), 1, generator=g) * batch.response_mask
    actor = ActorConfig(
        optim=OptimConfig(lr=1e-6),
        use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu=1024,
        ppo_mini_batch_size=2,
    )
    layout = rank_layout(batch, 2, MINI_BATCHES, balance=True)
    group = two_cpu_ranks(str(smollm2_path), actor)
    try:
        plain, _ = _timed(group, batch, balance=False)
        balanced, metrics = _timed(group, batch, balance=True)
    finally:
        group.shutdown()
    before, after = statistics.median(plain), statistics.median(balanced)
    result = {
        "tokens": int(batch.attention_mask.sum()),
        "samples": len(batch),
        "imbalance_before": round(layout.before, 3),
        "imbalance_after": round(layout.after, 3),
        "update_s_unbalanced": [round(t, 2) for t in plain],
        "update_s_balanced": [round(t, 2) for t in balanced],
        "speedup": round(before / after, 3),
    }
    print(
        f"\nbalance_batch, 2 gloo ranks, smollm2-135m, {result['tokens']} tokens in "
        f"{len(batch)} samples, {MINI_BATCHES} mini-batches: rank token imbalance (max/mean) "
        f"{layout.before:.3f} -> {layout.after:.3f}; update median {before:.2f} s unbalanced "
        f"vs {after:.2f} s balanced: {before / after:.2f}x"
    )
    out = REPO / "bench_results" / "balance_batch.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    assert metrics["balance/imbalance_after"] == pytest.approx(layout.after)
    assert layout.after <= layout.before
