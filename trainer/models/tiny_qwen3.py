"""``tiny-qwen3``: a seeded, randomly initialised Qwen3ForCausalLM with the real Qwen tokenizer.

Small enough that vLLM on CPU starts and generates in seconds, while every token-level path
(special tokens, chat template, tool-call markers, ``<think>`` blocks) is exactly Qwen3's.
"""

from __future__ import annotations

import json
from pathlib import Path

from tqdm.auto import tqdm

from trainer.models.templates import read_template

__all__ = ["LONG_WINDOW", "TINY_QWEN3_CONFIG", "build_tiny_qwen3"]

SEED = 0
# Head size 32 is the smallest the vLLM CPU attention backend accepts.
TINY_QWEN3_CONFIG: dict = {
    "vocab_size": 151936,  # Qwen3 pads its 151,669 tokens to a multiple of 128
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "max_position_embeddings": 8192,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "pad_token_id": 151643,
}
LONG_WINDOW = 40960
"""Qwen3's own ``max_position_embeddings``: ``tiny-qwen3-long``'s window, room for a coding
CLI's first prompt (on a repo_fix task, Claude Code's renders to ~11.9k tokens, Codex's
to ~8.5k)."""


def build_tiny_qwen3(out: Path, window: int | None = None) -> None:
    """Build the asset into ``out``; ``window`` replaces ``max_position_embeddings`` (the
    weights do not depend on it: the same seed gives the same tensors)."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    from trainer.models.qwen_tokenizer import build_qwen_tokenizer, save_qwen_tokenizer

    steps = tqdm(total=3, desc="tiny-qwen3", unit="step", leave=False)
    steps.set_postfix_str("tokenizer from qwen.tiktoken")
    tokenizer = build_qwen_tokenizer(read_template("qwen3"))
    save_qwen_tokenizer(tokenizer, out)
    steps.update()

    steps.set_postfix_str("random weights")
    torch.manual_seed(SEED)
    settings = dict(TINY_QWEN3_CONFIG)
    if window is not None:
        settings["max_position_embeddings"] = window
    config = Qwen3Config(**settings, dtype="float32")
    model = Qwen3ForCausalLM(config).to(torch.float32).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=151643, eos_token_id=[151645, 151643], pad_token_id=151643
    )
    steps.update()

    steps.set_postfix_str("save")
    model.save_pretrained(out, safe_serialization=True)
    (out / "agentloop-model.json").write_text(
        json.dumps({"source": "random init", "seed": SEED, "config": settings}) + "\n"
    )
    steps.update()
    steps.close()
