"""Actor benchmark on CPU (``make bench``; issue 22): the old-log-prob pass and update_actor of
the project's FSDP2 actor before and after packing, on smollm2-135m-instruct in fp32.

One gloo rank; a CPU-sized agentic GRPO batch (``actor_workload.agentic_batch``: 8 samples,
2 prompts x n=4, prompts 60-200 tokens, multi-turn responses of lognormal length, median 250,
cap 1024, 25% tool tokens); dynamic micro-batches of 2048 tokens (padded slots for old, real
tokens for new). old: rows padded to the micro-batch's longest and full-vocabulary logits
(``remove_padding=False``, ``log_prob_chunk_size=0``); new: the defaults (packed rows, chunked
LM head). Each is the log-prob pass then one optimizer step over the batch, after a warm-up on
2 samples, in this run. Prints both sides, the speed-up, the micro-batch counts and how many
token slots the padded layout computes per real token; the two sides' log-probs must agree.
Writes bench_results/actor_cpu.json. About 9 TFLOP of work: a few minutes on 2 idle cores
(9.6 minutes measured on 2 cores shared with another test run).
"""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path

import pytest
import torch

from tests.perf.actor_workload import (
    AgenticBatchSpec,
    ProjectActor,
    agentic_batch,
    batch_stats,
    guarded,
    padded_slots,
    single_rank_group,
    time_actor,
)
from trainer.workers import TrainBatch, balanced_micro_batches

REPO = Path(__file__).resolve().parents[2]
MAX_TOKENS = 2048
SPEC = AgenticBatchSpec(
    prompts=2, n=4, prompt_len=(60, 200), response_median=250, response_cap=1024,
    vocab_size=49152, seed=0,
)  # fmt: skip


def _run(path: Path, old: bool, batch: TrainBatch, out: dict) -> torch.Tensor:
    actor = ProjectActor(path, "cpu", max_tokens=MAX_TOKENS, old=old, checkpointing=False)
    warmup = batch.select(torch.arange(2))
    return time_actor(actor.log_probs, actor.update, batch, warmup, "cpu", out)


@pytest.mark.slow
def test_bench_actor_cpu_padded_vs_packed(smollm2_path):
    batch = agentic_batch(SPEC)
    stats = batch_stats(batch)
    with single_rank_group("cpu"):
        old, old_logp = guarded(partial(_run, smollm2_path, True, batch), "cpu")
        new, new_logp = guarded(partial(_run, smollm2_path, False, batch), "cpu")
    assert old_logp is not None and new_logp is not None
    gap = float((old_logp - new_logp)[batch.response_mask.bool()].abs().max())
    prompt_len, resp_len = batch.lengths()
    old_groups = balanced_micro_batches(prompt_len + resp_len, MAX_TOKENS)
    new_groups = balanced_micro_batches(prompt_len + resp_len, MAX_TOKENS, packed=True)
    slots = padded_slots(batch, old_groups)
    result = {
        "model": "smollm2-135m-instruct",
        "threads": torch.get_num_threads(),
        "max_tokens_per_micro_batch": MAX_TOKENS,
        "batch": stats,
        "old": old,
        "new": new,
        "speedup_log_prob": old["log_prob_s"] / new["log_prob_s"],
        "speedup_update": old["update_s"] / new["update_s"],
        "micro_batches": {"old": len(old_groups), "new": len(new_groups)},
        "padded_slots_per_real_token": slots / stats["real_tokens"],
        "logprob_gap_max": gap,
    }
    lines = [
        "",
        f"Actor on CPU ({result['threads']} threads), smollm2-135m-instruct fp32, 1 gloo rank: "
        f"{stats['samples']} samples ({SPEC.prompts} prompts x n={SPEC.n}), "
        f"{stats['real_tokens']:,} real tokens ({stats['response_tokens']:,} response, "
        f"{stats['tool_tokens']:,} of them tool), micro-batches of {MAX_TOKENS} tokens",
        f"  {'':<30}{'log-prob s':>11}{'update s':>10}",
        f"  {'old (padded, full logits)':<30}{old['log_prob_s']:>11.2f}{old['update_s']:>10.2f}",
        f"  {'new (packed, chunked head)':<30}{new['log_prob_s']:>11.2f}{new['update_s']:>10.2f}",
        f"  {'speed-up old/new':<30}{result['speedup_log_prob']:>10.2f}x"
        f"{result['speedup_update']:>9.2f}x",
        f"  micro-batches: old {len(old_groups)}, new {len(new_groups)}; padded layout: "
        f"{slots:,} token slots for {stats['real_tokens']:,} real tokens "
        f"({result['padded_slots_per_real_token']:.2f} per real token)",
        f"  max |log-prob old - new| {gap:.1e}",
    ]
    print("\n".join(lines))
    out = REPO / "bench_results"
    out.mkdir(exist_ok=True)
    (out / "actor_cpu.json").write_text(json.dumps(result, indent=1))
    assert gap < 1e-3
    assert math.isfinite(old["grad_norm"]) and math.isfinite(new["grad_norm"])
