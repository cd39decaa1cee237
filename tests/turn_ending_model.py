"""A copy of tiny-qwen3 that ends its turns. tiny-qwen3's weights are random, so it almost
never samples ``<|im_end|>`` and every turn runs to the token limit; a test that needs model
turns to end (so that a simulated user answers them) uses this copy, whose ``<|im_end|>``
embedding row (tied: the output row too) points along the mean final hidden state, so that a
sampled turn ends after a few tokens (at the default scale, 1 to ~30 with a median of ~5)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import torch

__all__ = ["ending_anywhere_copy", "turn_ending_copy"]


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


def ending_anywhere_copy(source: Path, target: Path, end_prob: float = 0.25) -> Path:
    """``source`` copied to ``target`` so that every position, however long its context (a
    coding CLI's 12k-token prompt), samples ``<|im_end|>`` with about ``end_prob``: turns
    end after ~1/end_prob tokens. A random model's final hidden states share no direction
    over long contexts, so ``turn_ending_copy``'s row does not reach them; here one hidden
    dimension is made constant instead. Every token embedding gets the same value ``c`` in
    dimension 0 and no layer writes to it (the rows of ``o_proj`` and ``down_proj`` that
    output dimension 0 are zeroed), so the residual stream holds ``c`` there at every
    position and the final norm's output there is nearly constant. The embeddings are tied:
    the shared ``c`` shifts every logit alike (softmax ignores it), and ``<|im_end|>``'s
    larger value ``c + d`` lifts its logit alone, ``d`` solved from ``end_prob``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shutil.copytree(source, target)
    tokenizer = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    emb = model.get_input_embeddings().weight
    c = 1.0
    with torch.no_grad():
        emb[:, 0] = c
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0] = 0.0
            layer.mlp.down_proj.weight[0] = 0.0
        chat = [{"role": "user", "content": "What is 2 plus 4?"}]
        h = model(torch.tensor([_ids(tokenizer, chat)]), output_hidden_states=True)
        h0 = float(h.hidden_states[-1][0, -1, 0])
        # p(eot) = e^(h0 d) / (e^(h0 d) + sum of the other tokens' e^logit); the others'
        # logits differ from the shared shift by little, so their sum is about vocab - 1
        lift = math.log(end_prob / (1 - end_prob) * (emb.shape[0] - 1))
        emb[eot, 0] = c + lift / h0
    model.save_pretrained(target)
    return target
