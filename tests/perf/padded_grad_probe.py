"""The padded actor's gradient on the agentic batch, with and without the padded-attention
guard (``trainer.workers.varlen_attention.guard_padded_attention``): a diagnostic for the NaN
gradient norm the padded path gave on an H200 (issue 43), run by ``gpu_check.sh``.

The batch's prompts differ in length, so rows are left-padded and some query rows have no real
key. For each shape: one log-prob pass and one update of the padded actor (``old`` in the actor
benchmark), first with transformers' SDPA mask as it is, then guarded; prints the gradient norm,
whether the log-probs are finite, and the seconds.

    python -m tests.perf.padded_grad_probe [shape ...]   # default 0.6B
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

import trainer.workers.policy_math as policy_math
from tests.perf.actor_workload import (
    AgenticBatchSpec,
    ProjectActor,
    agentic_batch,
    release_memory,
    save_random_qwen3,
    single_rank_group,
)


def probe(shape: str, tokens: int = 16384) -> None:
    batch = agentic_batch(AgenticBatchSpec())
    left_padded = int((batch.attention_mask[:, 0] == 0).sum())
    print(f"{shape}: {len(batch)} rows, {left_padded} left-padded, {tokens} tokens/GPU", flush=True)
    guard = policy_math.guard_padded_attention
    with tempfile.TemporaryDirectory() as folder:
        path = save_random_qwen3(shape, Path(folder), "cuda")
        for guarded in (False, True):
            policy_math.guard_padded_attention = guard if guarded else (lambda model: None)
            actor = ProjectActor(path, "cuda", max_tokens=tokens, old=True, checkpointing=True)
            start = time.perf_counter()
            logp = actor.log_probs(batch)
            metrics = actor.update(replace(batch, old_log_probs=logp))
            torch.cuda.synchronize()
            finite = bool(torch.isfinite(logp).all())
            print(
                f"  {'guarded' if guarded else 'stock mask':<11} grad_norm "
                f"{metrics['actor/grad_norm']:.4g}  log-probs finite {finite}  "
                f"{time.perf_counter() - start:.1f} s",
                flush=True,
            )
            del actor
            release_memory()
    policy_math.guard_padded_attention = guard


if __name__ == "__main__":
    with single_rank_group("cuda"):
        for name in sys.argv[1:] or ["0.6B"]:
            probe(name)
