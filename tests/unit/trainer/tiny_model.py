"""A tiny random Qwen3 (vocab 256, 2 layers) for in-process policy-math tests."""

from __future__ import annotations

import torch
import transformers


def tiny_qwen3() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    )
    return transformers.Qwen3ForCausalLM(config).float()
