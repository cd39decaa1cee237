"""One generation-throughput measurement of vLLM CPU in this process (run by
``test_bench_preloads.py`` under different ``LD_PRELOAD`` settings, which the engine's
process inherits): ``python tests/perf/preload_throughput.py <model> <requests> <tokens>``
prints ``{"tok_s": ..., "preload": ...}`` as its last line."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from servers import ServerConfig
from servers.vllm import VLLMEngine, to_vllm_sampling

PROMPT = list(range(1000, 1016))  # 16 ids inside every model's vocabulary


async def measure(model: str, requests: int, tokens: int, rounds: int = 3) -> float:
    from vllm import TokensPrompt

    engine = VLLMEngine(ServerConfig(model=model, max_model_len=1024))
    await engine.start()
    params = {"max_tokens": tokens, "temperature": 1.0, "ignore_eos": True}

    async def one(i: int) -> int:
        final = None
        async for out in engine.engine.generate(
            TokensPrompt(prompt_token_ids=PROMPT),
            to_vllm_sampling({**params, "seed": i}),
            f"r-{i}-{time.monotonic_ns()}",
        ):
            final = out
        return len(final.outputs[0].token_ids)

    try:
        await asyncio.gather(*[one(-i - 1) for i in range(8)])  # warm-up
        best = 0.0
        for _ in range(rounds):
            start = time.perf_counter()
            done = sum(await asyncio.gather(*[one(i) for i in range(requests)]))
            best = max(best, done / (time.perf_counter() - start))
        return best
    finally:
        engine.shutdown()


if __name__ == "__main__":
    model, requests, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    tok_s = asyncio.run(measure(model, requests, tokens))
    print(json.dumps({"tok_s": tok_s, "preload": os.environ.get("LD_PRELOAD", "")}))
