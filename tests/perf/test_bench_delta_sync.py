"""Delta weight sync benchmark (``make bench``): full fine-tuning of smollm2-135m-instruct at the
demo's RL learning rate (1e-5, Adam) on 2 FSDP2 trainer ranks, 10 training steps, each followed
by a push of the weights to two vLLM CPU servers started alike: one gets them whole (route
``buckets``: all-gathered, Ray objects, staged and loaded), the other by delta sync (route
``delta``: only what changed since its base, applied to its base and loaded, checksums
compared). A warm-up push before the steps gives each server its weights (the delta server's
base, whole); the figures are the ten pushes after the steps, both sides from the same steps,
in alternating order. On one machine no byte crosses a network, so the seconds show the cost
of encoding and applying, not what fewer bytes save on a link.

Two serving dtypes, one after the other: bfloat16 (as on GPU; ``indices``: the elements whose
bits changed) and float32 (vLLM's CPU default; ``bf16_diff``: differences in bf16). Prints
bytes and seconds per push, min/median/max, and the ratios. Writes
bench_results/delta_sync.json. Target (the issue's): fewer bytes per push than whole.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from servers import ServerConfig, launch_servers, stop_servers
from tests.integration.cluster.helpers import cpu_spec
from trainer.config.actor import OptimConfig
from trainer.models import prepare
from trainer.workers import TrainBatch, WorkerGroup
from trainer.workers.weight_delta import DeltaSpec

STEPS = 10
LR = 1e-5  # the demo's RL learning rate (DEMO_RL_LR)


def _batch(seed: int, n: int = 8, p: int = 32, r: int = 64) -> TrainBatch:
    """A GRPO-shaped batch of random tokens with signed advantages."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, 40000, (n, p + r), generator=g)
    attn = torch.ones(n, p + r, dtype=torch.long)
    return TrainBatch(
        input_ids=ids,
        attention_mask=attn,
        position_ids=torch.cumsum(attn, 1) - 1,
        response_mask=attn[:, p:].clone(),
        advantages=torch.randn(n, r, generator=g).sign(),
    )


def _spread(xs: list[float]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def _run(group: WorkerGroup, path: Path, dtype: str, spec: DeltaSpec) -> dict:
    config = ServerConfig(model=str(path), max_model_len=512, http=False, dtype=dtype)
    whole_server, delta_server = launch_servers(config, 2, num_cpus=1)
    rows: dict[str, list[float]] = {"whole_s": [], "delta_s": [], "whole_mb": [], "delta_mb": []}
    try:
        group.push_weights([whole_server], 256 << 20, "buckets")  # warm-ups; the delta base
        group.push_weights([delta_server], 256 << 20, "delta", spec)
        for step in range(STEPS):
            batch = _batch(step)
            batch.old_log_probs = group.compute_log_prob(batch)[0]
            group.update_actor(batch, samples_per_mini_batch=len(batch), seed=step)
            for side in ("whole", "delta") if step % 2 else ("delta", "whole"):
                t = time.perf_counter()
                if side == "whole":
                    sent = group.push_weights([whole_server], 256 << 20, "buckets")
                else:
                    sent = group.push_weights([delta_server], 256 << 20, "delta", spec)
                    assert sent["whole_servers"] == 0.0  # full_every=0: deltas after the first
                rows[f"{side}_s"].append(time.perf_counter() - t)
                rows[f"{side}_mb"].append(sent["bytes"] / 1e6)
    finally:
        stop_servers([whole_server, delta_server])
    return {
        "serving_dtype": dtype,
        "encoding": spec.encoding,
        **{key: {**_spread(xs), "all": xs} for key, xs in rows.items()},
    }


def test_bench_delta_sync_smollm2(ray_local):
    path = prepare("smollm2-135m-instruct")
    spec = cpu_spec(path)
    actor = replace(spec.actor, optim=OptimConfig(lr=LR, weight_decay=0.0))
    group = WorkerGroup(replace(spec, actor=actor), 2)
    runs = []
    try:
        runs.append(_run(group, path, "bfloat16", DeltaSpec("indices", full_every=0)))
        runs.append(_run(group, path, "float32", DeltaSpec("bf16_diff", full_every=0)))
    finally:
        group.shutdown()
    out = Path("bench_results")
    out.mkdir(exist_ok=True)
    (out / "delta_sync.json").write_text(
        json.dumps({"steps": STEPS, "lr": LR, "runs": runs}, indent=2) + "\n"
    )
    print(
        f"\n[bench] delta weight sync, smollm2-135m-instruct full fine-tuning at lr {LR}, "
        f"2 gloo FSDP2 ranks -> 2 vLLM CPU servers, {STEPS} steps, one push each (medians)"
    )
    print(
        f"  {'serving / encoding':<22}{'whole MB':>10}{'delta MB':>10}{'ratio':>8}"
        f"{'whole s':>9}{'delta s':>9}{'ratio':>8}"
    )
    for run in runs:
        wm, dm = run["whole_mb"]["median"], run["delta_mb"]["median"]
        ws, ds = run["whole_s"]["median"], run["delta_s"]["median"]
        label = f"{run['serving_dtype']} / {run['encoding']}"
        print(
            f"  {label:<22}{wm:>10.1f}{dm:>10.1f}{dm / wm:>8.3f}{ws:>9.2f}{ds:>9.2f}{ds / ws:>8.2f}"
        )
        print(
            f"    delta MB per push (min/max): {run['delta_mb']['min']:.1f} / "
            f"{run['delta_mb']['max']:.1f}; fewer bytes than whole: {dm < wm} (target)"
        )
