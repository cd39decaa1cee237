"""The HTTP front over its request limit: a real ``agentloop-serve`` (tiny-qwen3 on the vLLM
CPU engine, shared with the other HTTP modules) with ``--max-concurrent-requests 8`` gets 40
chat completions: ``LIMIT`` long ones first, held in flight (``/metrics`` shows them), then the
rest at once. Requests over the limit are answered 503 at once with the exact OpenAI-style
body and ``Retry-After: 1``, every admitted one completes (200), none hangs (client timeout),
the rejections are counted in ``/metrics``, and afterwards a normal request is served. (Sent
all at once on a loaded 2-core machine, the 40 could arrive spread out enough that no more
than ``LIMIT`` were ever in flight, and none was refused.)"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.reliability.http.conftest import AUTH, LIMIT

pytestmark = [pytest.mark.integration, pytest.mark.slow]

N_REQUESTS = 40
CHAT = {
    "model": "tiny-qwen3",
    "messages": [{"role": "user", "content": "Count to ten."}],
    "max_tokens": 32,
    "ignore_eos": True,  # every admitted request holds its slot for 32 decode steps
}
HOLD = {**CHAT, "max_tokens": 400}  # the first LIMIT hold their slots for 400 decode steps
OVERLOADED = {
    "error": {
        "message": f"server overloaded: {LIMIT} requests in flight (limit "
        f"max_concurrent_requests={LIMIT}); retry later or raise the limit",
        "type": "server_error",
        "param": None,
        "code": 503,
    }
}


def _in_flight(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith("agentloop_requests_in_flight "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _rejected(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith('agentloop_http_rejected_total{reason="overloaded"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_requests_over_the_limit_get_503_and_the_admitted_ones_complete(server_url):
    timeout = httpx.Timeout(120.0)  # a hung request fails the test with a timeout error
    limits = httpx.Limits(max_connections=N_REQUESTS)
    async with httpx.AsyncClient(
        base_url=server_url, timeout=timeout, limits=limits, headers=AUTH
    ) as client:
        before = _rejected((await client.get("/metrics")).text)
        held = [
            asyncio.create_task(client.post("/v1/chat/completions", json=HOLD))
            for _ in range(LIMIT)
        ]
        for _ in range(600):  # the LIMIT long requests are admitted and running
            if _in_flight((await client.get("/metrics")).text) >= LIMIT:
                break
            await asyncio.sleep(0.05)
        rest = await asyncio.gather(
            *[client.post("/v1/chat/completions", json=CHAT) for _ in range(N_REQUESTS - LIMIT)]
        )
        replies = [*(await asyncio.gather(*held)), *rest]
        ok = [r for r in replies if r.status_code == 200]
        busy = [r for r in replies if r.status_code == 503]
        assert len(ok) + len(busy) == N_REQUESTS, [r.status_code for r in replies]
        # nothing is in flight when the first LIMIT arrive, so at least those are admitted
        assert len(ok) >= LIMIT and len(busy) >= 1, (len(ok), len(busy))
        for r in busy:
            assert r.json() == OVERLOADED
            assert r.headers["retry-after"] == "1"
        for r in ok:
            assert r.json()["usage"]["completion_tokens"] in (32, HOLD["max_tokens"])
        assert all(r.status_code == 200 for r in replies[:LIMIT])  # the held ones completed
        metrics = (await client.get("/metrics")).text
        assert _rejected(metrics) - before == len(busy)
        assert "agentloop_requests_in_flight 0.0" in metrics
        after = await client.post("/v1/chat/completions", json=CHAT)
        assert after.status_code == 200 and after.json()["choices"][0]["finish_reason"] == "length"
