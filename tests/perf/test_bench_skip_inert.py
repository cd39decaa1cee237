"""``actor.skip_zero_advantage_rows`` on 2 real FSDP2 gloo ranks (``make bench``): the same PPO
update of smollm2-135m-instruct with the zero-advantage samples computed and skipped, one run,
one machine.

The batch is agentic (``actor_workload.agentic_batch``: 16 samples, 4 prompts x n=4,
lognormal multi-turn responses, median 160 tokens, cap 768, 25% tool tokens), one mini-batch,
micro-batches of one sample (as the repo_fix recipe runs). Two of the four groups have
advantage 0 on every token, as GRPO gives a group whose samples scored alike (on repo_fix most
groups score 0 together). After a warm-up update of each side on the same ranks, the sides
alternate 3 times (weights move, the work does not); prints the median update seconds of both
and the speed-up; writes bench_results/skip_inert.json.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest
import torch

from tests.perf.actor_workload import AgenticBatchSpec, agentic_batch, two_cpu_ranks
from trainer.algos.correction import CorrectionSpec
from trainer.config.actor import ActorConfig, OptimConfig
from trainer.workers.inert import skip_inert_rows

REPO = Path(__file__).resolve().parents[2]
SPEC = AgenticBatchSpec(
    prompts=4, n=4, prompt_len=(40, 120), response_median=160, response_cap=768,
    vocab_size=49152, seed=3,
)  # fmt: skip
REPEATS = 3
ALIKE = (1, 3)
"""The groups whose samples scored alike."""


@pytest.mark.slow
def test_bench_skip_zero_advantage_rows_on_two_ranks(ray_local, smollm2_path):
    batch = agentic_batch(SPEC)
    batch.old_log_probs = torch.zeros(batch.response_mask.shape)
    g = torch.Generator().manual_seed(0)
    batch.advantages = torch.randn(len(batch), 1, generator=g) * batch.response_mask
    for group in ALIKE:
        batch.advantages[group * SPEC.n : (group + 1) * SPEC.n] = 0.0
    actor = ActorConfig(
        optim=OptimConfig(lr=1e-6), ppo_micro_batch_size_per_gpu=1, ppo_mini_batch_size=4
    )
    computed, skipped = skip_inert_rows(batch, actor, CorrectionSpec())
    sides = {"computed": batch, "skipped": computed}
    times: dict[str, list[float]] = {name: [] for name in sides}
    workers = two_cpu_ranks(str(smollm2_path), actor, balance=True)
    try:
        for b in sides.values():
            workers.update_actor(b, mini_batches=1)  # warm-up
        for _ in range(REPEATS):
            for name, b in sides.items():
                start = time.perf_counter()
                workers.update_actor(b, mini_batches=1)
                times[name].append(time.perf_counter() - start)
    finally:
        workers.shutdown()
    full, fast = statistics.median(times["computed"]), statistics.median(times["skipped"])
    sampled = batch.response_mask.sum(-1)
    result = {
        "tokens": int(batch.attention_mask.sum()),
        "samples": len(batch),
        "skipped_samples": int(skipped.sum()),
        "skipped_sampled_tokens": int(sampled[skipped].sum()),
        "sampled_tokens": int(sampled.sum()),
        "update_s_all_computed": [round(t, 2) for t in times["computed"]],
        "update_s_skipped": [round(t, 2) for t in times["skipped"]],
        "speedup": round(full / fast, 3),
    }
    print(
        f"\nskip_zero_advantage_rows, 2 gloo ranks, smollm2-135m, {result['tokens']} tokens in "
        f"{len(batch)} samples, {result['skipped_samples']} of advantage 0 "
        f"({result['skipped_sampled_tokens']} of {result['sampled_tokens']} sampled tokens): "
        f"update median {full:.2f} s all computed vs {fast:.2f} s skipped: {full / fast:.2f}x"
    )
    out = REPO / "bench_results" / "skip_inert.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    assert result["skipped_samples"] == len(ALIKE) * SPEC.n
