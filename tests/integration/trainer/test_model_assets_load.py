"""Both model assets load in transformers and generate; tiny-qwen3 loads in vLLM (CPU) and
agrees with transformers greedily."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.generate_requests import req

pytestmark = pytest.mark.integration

PROMPT = [{"role": "user", "content": "What is the capital of France?"}]
NEW_TOKENS = 8


def _greedy_hf(path, prompt_ids: list[int], new_tokens: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
        )
    return out[0, len(prompt_ids) :].tolist()


def _prompt_ids(path) -> list[int]:
    tok = AutoTokenizer.from_pretrained(path)
    return tok.apply_chat_template(PROMPT, add_generation_prompt=True, return_dict=False)


def test_smollm2_generates_an_answer_in_transformers(smollm2_path):
    tok = AutoTokenizer.from_pretrained(smollm2_path)
    new = _greedy_hf(smollm2_path, _prompt_ids(smollm2_path), 12)
    assert len(new) == 12
    # A real pretrained instruct model, not random weights: it knows this one.
    assert "Paris" in tok.decode(new, skip_special_tokens=True)


def test_tiny_qwen3_generates_in_transformers(tiny_qwen3_path):
    new = _greedy_hf(tiny_qwen3_path, _prompt_ids(tiny_qwen3_path), NEW_TOKENS)
    assert len(new) == NEW_TOKENS
    assert all(0 <= t < 151936 for t in new)


async def test_tiny_qwen3_loads_in_vllm_and_matches_transformers_greedy(
    tiny_server, tiny_qwen3_path
):
    """On the session's shared tiny-qwen3 server (``tests/ray_local.py``: the asset loaded by
    vLLM CPU through the project's AsyncServer, float32), where a vLLM ``LLM`` of its own in a
    subprocess cost a second engine start (49 s of the serial tier)."""
    prompt = _prompt_ids(tiny_qwen3_path)
    greedy = {"max_tokens": NEW_TOKENS, "min_tokens": NEW_TOKENS, "temperature": 0.0}
    got = await tiny_server.generate.remote(req(prompt, greedy))
    assert len(got.token_ids) == NEW_TOKENS
    assert len(got.log_probs) == NEW_TOKENS
    assert all(lp <= 0.0 for lp in got.log_probs)
    # Same weights, same tokenizer, greedy: vLLM and transformers agree token for token.
    assert got.token_ids == _greedy_hf(tiny_qwen3_path, prompt, NEW_TOKENS)
