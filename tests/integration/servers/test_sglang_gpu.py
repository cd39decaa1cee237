"""The real SGLang engine behind the same contract (needs CUDA and the sglang extra)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.integration]


def checked(prompt_ids: list[int], request_id: str):
    """A greedy 8-token request as ``ServerCore`` hands it to an engine (params complete)."""
    from servers.types import GenerateRequest, SamplingParams

    params = SamplingParams(max_tokens=8, temperature=0, logprobs=True)
    return GenerateRequest(prompt_ids=prompt_ids, sampling_params=params, request_id=request_id)


async def test_sglang_engine_generates_tokens_with_logprobs(tiny_qwen3_path):
    pytest.importorskip("sglang")
    from servers import ServerConfig
    from servers.sglang import SGLangEngine

    engine = SGLangEngine(
        ServerConfig(
            model=str(tiny_qwen3_path),
            backend="sglang",
            max_model_len=512,
            gpu_memory_utilization=0.3,
        )
    )
    await engine.start()
    try:
        out = await engine.generate(checked([151644, 872, 198], "g1"))
        assert len(out.token_ids) == len(out.log_probs) > 0
        again = await engine.generate(checked([151644, 872, 198], "g2"))
        assert again.token_ids == out.token_ids
    finally:
        engine.shutdown()
