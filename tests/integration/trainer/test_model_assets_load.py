"""Both model assets load in transformers and generate; tiny-qwen3 loads in vLLM (CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

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


VLLM_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from vllm import LLM, SamplingParams

    if __name__ == "__main__":
        path, prompt, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
        llm = LLM(model=path, enforce_eager=True, max_model_len=1024, dtype="float32")
        params = SamplingParams(max_tokens=n, min_tokens=n, temperature=0.0, logprobs=0)
        out = llm.generate({"prompt_token_ids": prompt}, params)[0].outputs[0]
        lp = [next(iter(d.values())).logprob for d in out.logprobs]
        print("RESULT " + json.dumps({"ids": list(out.token_ids), "logprobs": lp}))
    """
)


def test_tiny_qwen3_loads_in_vllm_and_matches_transformers_greedy(tiny_qwen3_path, tmp_path):
    prompt = _prompt_ids(tiny_qwen3_path)
    script = tmp_path / "vllm_generate.py"
    script.write_text(VLLM_SCRIPT)
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    result = subprocess.run(
        [sys.executable, str(script), str(tiny_qwen3_path), json.dumps(prompt), str(NEW_TOKENS)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stderr[-4000:]
    got = json.loads(lines[-1][len("RESULT ") :])
    assert len(got["ids"]) == NEW_TOKENS
    assert len(got["logprobs"]) == NEW_TOKENS
    assert all(lp <= 0.0 for lp in got["logprobs"])
    # Same weights, same tokenizer, greedy: vLLM and transformers agree token for token.
    assert got["ids"] == _greedy_hf(tiny_qwen3_path, prompt, NEW_TOKENS)
