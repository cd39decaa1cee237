"""HTTP load benchmark (``make bench``): 200 concurrent chat completions against a real
``agentloop-serve`` (tiny-qwen3, vLLM CPU engine), from a bounded local load generator
(one ``httpx.AsyncClient``, 200 connections, each request 16 tokens with ``ignore_eos``).

1. Default limit (``max_concurrent_requests=256``): all 200 admitted. Target (printed): no
   non-200 and no client timeout; p50/p99/max latency, requests/s and tokens/s.
2. Limit 64: at most 64 in flight, the rest answered 503 without running. Targets (printed):
   the 503s come back in < 1 s and the accepted requests' p99 is below phase 1's.

Each phase starts its own server, warms it up (16 chat requests, then 200 concurrent
``/health`` calls so that the client's 200 connections are open), then fires the 200 at once.
The server admits a request when uvicorn has parsed it, on the same event loop that renders
and tokenizes the admitted chat requests; on 2 cores that work, not the limit check, sets how
fast a 503 comes back. Writes bench_results/http_load.json.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest

from tests.serve_cli import serve_cli

REPO = Path(__file__).resolve().parents[2]
N_REQUESTS, N_TOKENS, SMALL_LIMIT = 200, 16, 64
CHAT = {
    "model": "tiny-qwen3",
    "messages": [{"role": "user", "content": "Tell me a story."}],
    "max_tokens": N_TOKENS,
    "ignore_eos": True,
}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


async def _fire(url: str, n: int) -> tuple[float, list[tuple[int, float, int]]]:
    """``n`` chat requests at once; (wall seconds, [(status, seconds, completion tokens)])."""
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=url, timeout=300.0, limits=limits) as client:

        async def one() -> tuple[int, float, int]:
            start = time.perf_counter()
            r = await client.post("/v1/chat/completions", json=CHAT)
            tokens = r.json()["usage"]["completion_tokens"] if r.status_code == 200 else 0
            return r.status_code, time.perf_counter() - start, tokens

        await asyncio.gather(*[one() for _ in range(16)])  # warm-up
        await asyncio.gather(*[client.get("/health") for _ in range(n)])  # open n connections
        start = time.perf_counter()
        results = await asyncio.gather(*[one() for _ in range(n)])
        return time.perf_counter() - start, results


def _phase(limit: int | None) -> dict:
    args = ["--model", "tiny-qwen3", "--max-model-len", "256"]
    if limit is not None:
        args += ["--max-concurrent-requests", str(limit)]
    with serve_cli(*args, env={"AGENTLOOP_API_KEY": ""}) as url:
        wall, results = asyncio.run(_fire(url, N_REQUESTS))
    ok = [s for code, s, _ in results if code == 200]
    rejected = [s for code, s, _ in results if code == 503]
    tokens = sum(t for _, _, t in results)
    return {
        "limit": limit or 256,
        "requests": N_REQUESTS,
        "ok": len(ok),
        "status_503": len(rejected),
        "non_200": N_REQUESTS - len(ok),
        "wall_s": wall,
        "req_per_s": len(ok) / wall,
        "tok_per_s": tokens / wall,
        "ok_p50_s": pct(ok, 0.5),
        "ok_p99_s": pct(ok, 0.99),
        "ok_max_s": max(ok, default=0.0),
        "rejected_p50_s": pct(rejected, 0.5),
        "rejected_max_s": max(rejected, default=0.0),
    }


@pytest.mark.slow
def test_bench_http_load_200_concurrent_chat_requests():
    full = _phase(None)
    small = _phase(SMALL_LIMIT)
    out = REPO / "bench_results"
    out.mkdir(exist_ok=True)
    (out / "http_load.json").write_text(json.dumps({"default": full, "limited": small}, indent=2))
    print(
        f"\n[bench] HTTP load: {N_REQUESTS} concurrent chat completions x {N_TOKENS} tokens, "
        "tiny-qwen3, agentloop-serve on the vLLM CPU engine"
    )
    print(
        f"  {'limit':<7}{'200':>5}{'503':>5}{'other':>7}{'p50 s':>8}{'p99 s':>8}{'max s':>8}"
        f"{'req/s':>8}{'tok/s':>8}{'503 p50 s':>11}{'503 max s':>11}"
    )
    for r in (full, small):
        print(
            f"  {r['limit']:<7}{r['ok']:>5}{r['status_503']:>5}"
            f"{r['non_200'] - r['status_503']:>7}{r['ok_p50_s']:>8.2f}{r['ok_p99_s']:>8.2f}"
            f"{r['ok_max_s']:>8.2f}{r['req_per_s']:>8.1f}{r['tok_per_s']:>8.1f}"
            f"{r['rejected_p50_s']:>11.3f}{r['rejected_max_s']:>11.3f}"
        )

    def met(ok: bool) -> str:
        return "met" if ok else "not met"

    print(
        f"  targets: limit 256: 0 non-200 ({met(full['non_200'] == 0)}); limit {SMALL_LIMIT}: "
        f"503s answered in < 1 s ({met(0 < small['rejected_max_s'] < 1)}), accepted p99 below "
        f"the unlimited p99 ({met(small['ok_p99_s'] < full['ok_p99_s'])})"
    )
    assert full["ok"] + small["ok"] > 0
