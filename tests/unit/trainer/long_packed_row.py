"""Run by ``test_packing.py`` in a fresh interpreter (its peak RSS is this program's alone):
a forward and backward of the tiny random Qwen3 over one packed 16,384-token row of two samples
(12,000 + 4,384 tokens), with SDPA restricted to its fused kernels, or, with ``math``, one
plain SDPA call of the math backend over a 4,096-token sample as the control that the
measurement sees a [tokens, tokens] score matrix. Prints the growth of the peak RSS in MiB."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from tests.unit.trainer.tiny_model import tiny_qwen3
from trainer.workers.batch import TrainBatch
from trainer.workers.policy_math import forward_log_probs

LENGTHS = (12_000, 4_384)
PROMPT = 100


def _peak_mib() -> float:
    """This process's peak RSS (VmHWM). Not ``getrusage``: its maxrss survives ``exec`` and
    starts at the forking parent's size, which hides growth below that."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _long_batch(vocab: int) -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    width = max(LENGTHS)
    ids = torch.randint(0, vocab, (len(LENGTHS), width), generator=g)
    attn = torch.zeros_like(ids)
    for i, n in enumerate(LENGTHS):
        attn[i, width - n :] = 1  # left-padded
    response = min(LENGTHS) - PROMPT  # the last columns; the shorter sample's first 100 are prompt
    return TrainBatch(
        input_ids=ids,
        attention_mask=attn,
        position_ids=(attn.cumsum(1) - 1).clamp(min=0),
        response_mask=attn[:, width - response :].clone(),
    )


def main(mode: str) -> None:
    torch.set_num_threads(1)
    model = tiny_qwen3().train()
    batch = _long_batch(model.config.vocab_size)
    if mode == "math":
        q = torch.randn(1, 4, 4096, 8)
        before = _peak_mib()
        with sdpa_kernel([SDPBackend.MATH]):
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    else:
        before = _peak_mib()
        # The fused kernels only: a fall back to the math path is an error, not a slow run.
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
            log_probs, _ = forward_log_probs(model, batch, remove_padding=True, chunk_size=2048)
            log_probs.sum().backward()
        assert all(p.grad is not None for p in model.parameters())
    print(f"{_peak_mib() - before:.1f}")


if __name__ == "__main__":
    main(sys.argv[1])
