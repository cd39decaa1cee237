"""The real SGLang engine behind the same contract (needs CUDA and the sglang extra)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.integration]


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
        out = await engine.generate([151644, 872, 198], {"max_tokens": 8, "temperature": 0}, "g1")
        assert len(out.token_ids) == len(out.log_probs) > 0
        again = await engine.generate([151644, 872, 198], {"max_tokens": 8, "temperature": 0}, "g2")
        assert again.token_ids == out.token_ids
    finally:
        engine.shutdown()
