"""A copy of tiny-qwen3 that ends its turns. tiny-qwen3's weights are random, so it almost
never samples ``<|im_end|>`` and every turn runs to the token limit; a test that needs model
turns to end (so that a simulated user answers them) uses this copy, whose ``<|im_end|>``
embedding row (tied: the output row too) points along the mean final hidden state, so that a
sampled turn ends after a few tokens (at the default scale, 1 to ~30 with a median of ~5)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

__all__ = ["turn_ending_copy"]


def turn_ending_copy(source: Path, target: Path, scale: float = 0.8) -> Path:
    """``source`` (tiny-qwen3's folder) copied to ``target`` with the end-of-turn row set to
    ``scale`` times the unit mean of its final hidden states over a few chat prompts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shutil.copytree(source, target)
    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    chats = [[{"role": "user", "content": f"What is {a} plus {2 * a}?"}] for a in range(2, 10)]
    with torch.no_grad():
        states = [
            model(
                torch.tensor([_ids(tokenizer, c)]),
                output_hidden_states=True,
            ).hidden_states[-1][0]
            for c in chats
        ]
        mean = torch.cat(states).mean(0)
        model.get_input_embeddings().weight[eot] = scale * mean / mean.norm()
    model.save_pretrained(target)
    return target


def _ids(tokenizer, chat: list[dict]) -> list[int]:
    return tokenizer.apply_chat_template(
        chat, add_generation_prompt=True, tokenize=True, return_dict=False
    )
