"""Weight sync, the trainer's side on a GPU (marker ``gpu``; torch and transformers only): how
long one FSDP2 rank takes to get a random Qwen3-1.7B-shaped model out of its shards for the
servers, the old way and the new ways, in the same run:

- ``fp32 to host``: all-gather float32 master weights, copy each to host (the path before);
- ``bf16 to host``: cast on the GPU, then all-gather and copy (the ``buckets`` route);
- ``bf16 on device``: cast and all-gather, left on the GPU (what vLLM's NCCL/IPC transfer sends);
- ``bf16 staged``: the rank's shard cast on the GPU and copied into a /dev/shm file (the
  ``staged`` route; needs ~3.5 GB of /dev/shm).

Writes bench_results/weight_sync_gpu.json.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu


def _model(path: str) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
    )  # fmt: skip
    with torch.device("cuda"):
        Qwen3ForCausalLM(config).save_pretrained(path)


def test_bench_weights_out_of_the_shards_on_gpu(tmp_path):
    from trainer.config.actor import FSDPConfig, ModelConfig
    from trainer.workers.fsdp import apply_fsdp, full_tensors, init_distributed, load_model
    from trainer.workers.weight_send import stage_shards

    path = str(tmp_path / "model")
    _model(path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    init_distributed(0, 1, f"127.0.0.1:{port}", "cuda")
    model = apply_fsdp(load_model(path, ModelConfig(path=path), "cuda"), FSDPConfig(), "cuda")

    def drain(dtype: torch.dtype, device: str | None) -> int:
        n = 0
        for _, t in full_tensors(model, dtype=dtype, device=device, skip_tied_head=True):
            n += t.numel() * t.element_size()
        torch.cuda.synchronize()
        return n

    shared = None

    def staged() -> int:
        nonlocal shared
        plan, shared = stage_shards(model, torch.bfloat16, shared)
        return plan.nbytes

    cases = {
        "fp32 to host": lambda: drain(torch.float32, "cpu"),
        "bf16 to host": lambda: drain(torch.bfloat16, "cpu"),
        "bf16 on device": lambda: drain(torch.bfloat16, None),
        "bf16 staged": staged,
    }
    result: dict[str, dict[str, float]] = {}
    for name, run in cases.items():
        try:
            run()  # warm-up (allocations, page faults of the file)
            times = []
            for _ in range(3):
                t = time.perf_counter()
                nbytes = run()
                times.append(time.perf_counter() - t)
        except (RuntimeError, OSError) as err:  # e.g. too little /dev/shm: the others still run
            result[name] = {"error": f"{type(err).__name__}: {err}"}
            continue
        result[name] = {"gb": nbytes / 1e9, "seconds": min(times), "all": times}
    if shared is not None:
        shared.close()
    torch.distributed.destroy_process_group()
    out = Path("bench_results")
    out.mkdir(exist_ok=True)
    (out / "weight_sync_gpu.json").write_text(json.dumps(result, indent=2) + "\n")
    gpu = torch.cuda.get_device_name()
    print(f"\n[bench] weights out of the shards, Qwen3-1.7B shape, 1 rank, {gpu}")
    for name, r in result.items():
        if "error" in r:
            print(f"  {name:<16}failed: {r['error']}")
            continue
        print(f"  {name:<16}{r['gb']:>6.2f} GB {r['seconds']:>7.3f} s (best of 3)")
    assert not [name for name, r in result.items() if "error" in r], result
