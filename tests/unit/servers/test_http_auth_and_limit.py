"""The HTTP front's guard over real uvicorn + httpx, with scripted engine adapters: the bearer
token (``ServerConfig.api_key`` / ``AGENTLOOP_API_KEY``), the per-request work limits
(``max_n``, ``max_tokens_per_request``, ``max_prompt_tokens``: 400 naming the limit) and the
in-flight limit (``max_concurrent_requests``, counted in sequences: 503 at once with
``Retry-After``, counted in the metrics)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from servers import ServerConfig, ServerCore, TokenOutput
from servers.http import HttpFront, build_app

KEY = "s3cret-key"
UNAUTHORIZED = {
    "error": {
        "message": "missing or wrong bearer token: send 'Authorization: Bearer <key>' "
        "(the server's api_key / AGENTLOOP_API_KEY)",
        "type": "invalid_request_error",
        "param": None,
        "code": 401,
    }
}


def overloaded(limit: int) -> dict:
    return {
        "error": {
            "message": f"server overloaded: {limit} requests in flight (limit "
            f"max_concurrent_requests={limit}); retry later or raise the limit",
            "type": "server_error",
            "param": None,
            "code": 503,
        }
    }


class GatedEngine:
    """Each generate waits at the gate; ``waiting`` counts the ones parked there."""

    vocab_size = 50
    max_model_len = 32

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.waiting = 0

    async def generate(self, request):
        self.waiting += 1
        await self.gate.wait()
        self.waiting -= 1
        return TokenOutput(token_ids=[1], log_probs=[-1.0], finish_reason="length")

    async def health(self):
        return {"backend": "gated"}


async def _front(config: ServerConfig, engine, chat=None):
    core = ServerCore(config, engine=engine)
    front = HttpFront(build_app(core, chat), "127.0.0.1", 0)
    return front, await front.start()


@pytest.fixture
async def keyed():
    engine = GatedEngine()
    engine.gate.set()
    front, url = await _front(ServerConfig(model="gated", api_key=KEY), engine)
    async with httpx.AsyncClient(base_url=url, timeout=10) as c:
        yield c
    await front.stop()


GENERATE = {"prompt_ids": [1, 2], "sampling_params": {"max_tokens": 1}}


@pytest.mark.parametrize(
    "method,path",
    [
        ("POST", "/generate"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/metrics"),
        ("GET", "/no-such-route"),
        ("POST", "/health"),
    ],
)
@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong", f"Basic {KEY}", KEY, f"Bearer {KEY}x"]
)
async def test_every_route_but_get_health_needs_the_bearer_token(
    keyed, method, path, authorization
):
    headers = {"Authorization": authorization} if authorization else {}
    r = await keyed.request(method, path, json=GENERATE, headers=headers)
    assert r.status_code == 401
    assert r.json() == UNAUTHORIZED
    assert r.headers["www-authenticate"] == "Bearer"


async def test_the_right_token_is_served_and_health_needs_none(keyed):
    assert (await keyed.get("/health")).json() == {"status": "ok", "backend": "gated"}
    await keyed.post("/generate", json=GENERATE)  # one 401 for the metrics below
    auth = {"Authorization": f"Bearer {KEY}"}
    r = await keyed.post("/generate", json=GENERATE, headers=auth)
    assert r.status_code == 200 and r.json()["token_ids"] == [1]
    r = await keyed.post("/generate", json=GENERATE, headers={"authorization": f"bearer {KEY}"})
    assert r.status_code == 200  # the scheme is case-insensitive (RFC 7235)
    metrics = await keyed.get("/metrics", headers=auth)
    assert metrics.status_code == 200
    assert 'agentloop_http_rejected_total{reason="unauthorized"} 1.0' in metrics.text


def test_api_key_comes_from_the_environment_when_not_given(monkeypatch):
    monkeypatch.setenv("AGENTLOOP_API_KEY", "from-env")
    assert ServerConfig(model="x").api_key == "from-env"
    assert ServerConfig(model="x", api_key="given").api_key == "given"
    assert "from-env" not in repr(ServerConfig(model="x"))  # keys stay out of logs
    monkeypatch.setenv("AGENTLOOP_API_KEY", "")
    assert ServerConfig(model="x").api_key is None
    monkeypatch.delenv("AGENTLOOP_API_KEY")
    assert ServerConfig(model="x").api_key is None


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"api_key": " "}, "api_key must be a non-empty string (None turns auth off)"),
        ({"max_concurrent_requests": 0}, "max_concurrent_requests must be >= 1, got 0"),
        (
            {"scheduling_policy": "lifo"},
            "scheduling_policy must be 'priority' or 'fcfs', got 'lifo'",
        ),
        ({"max_num_seqs": 0}, "max_num_seqs must be >= 1 (or None), got 0"),
        ({"max_n": 0}, "max_n must be >= 1, got 0"),
        ({"max_tokens_per_request": 0}, "max_tokens_per_request must be >= 1, got 0"),
        (
            {"max_prompt_tokens": 0},
            "max_prompt_tokens must be >= 1 (or None for the model length), got 0",
        ),
    ],
)
def test_bad_guard_settings_are_rejected(kwargs, message):
    with pytest.raises(ValueError) as info:
        ServerConfig(model="x", **kwargs)
    assert str(info.value) == message


async def _until(predicate, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_requests_over_the_limit_get_503_at_once_and_the_rest_complete():
    engine = GatedEngine()
    front, url = await _front(ServerConfig(model="gated", max_concurrent_requests=2), engine)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            admitted = [asyncio.create_task(c.post("/generate", json=GENERATE)) for _ in range(2)]
            await _until(lambda: engine.waiting == 2)
            over = await c.post("/generate", json=GENERATE)
            assert over.status_code == 503
            assert over.json() == overloaded(2)
            assert over.headers["retry-after"] == "1"
            chat = await c.post("/v1/chat/completions", json={"messages": []})
            assert chat.status_code == 503  # the limit counts both engine routes together
            # health and metrics are not limited: probes still answer during overload
            assert (await c.get("/health")).status_code == 200
            metrics = (await c.get("/metrics")).text
            assert 'agentloop_http_rejected_total{reason="overloaded"} 2.0' in metrics
            assert "agentloop_requests_in_flight 2.0" in metrics
            engine.gate.set()
            assert [r.status_code for r in await asyncio.gather(*admitted)] == [200, 200]
            assert (await c.post("/generate", json=GENERATE)).status_code == 200
    finally:
        await front.stop()


async def test_a_streamed_chat_response_holds_its_slot_until_the_stream_ends():
    release = asyncio.Event()

    async def chat(body):
        async def stream():
            yield "data: first\n\n"
            await release.wait()
            yield "data: [DONE]\n\n"

        return 200, stream()

    engine = GatedEngine()
    engine.gate.set()
    config = ServerConfig(model="gated", max_concurrent_requests=1)
    front, url = await _front(config, engine, chat)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            async with c.stream("POST", "/v1/chat/completions", json={"stream": True}) as s:
                assert s.status_code == 200
                lines = s.aiter_lines()
                assert await anext(lines) == "data: first"
                busy = await c.post("/generate", json=GENERATE)
                assert busy.status_code == 503 and busy.json() == overloaded(1)
                release.set()
                assert [line async for line in lines if line] == ["data: [DONE]"]
            assert (await c.post("/generate", json=GENERATE)).status_code == 200
    finally:
        await front.stop()


def _gated_chat(gate: asyncio.Event, bodies: list[dict]):
    async def chat(body):
        bodies.append(body)
        await gate.wait()
        return 200, {"choices": [], "usage": {}}

    return chat


async def test_admission_counts_a_chat_requests_n_choices():
    gate, bodies = asyncio.Event(), []
    config = ServerConfig(model="gated", max_concurrent_requests=4)
    front, url = await _front(config, GatedEngine(), _gated_chat(gate, bodies))
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            held = asyncio.create_task(c.post("/v1/chat/completions", json={"n": 3}))
            await _until(lambda: len(bodies) == 1)
            over = await c.post("/v1/chat/completions", json={"n": 2})
            assert over.status_code == 503 and over.headers["retry-after"] == "1"
            assert over.json()["error"]["message"] == (
                "server overloaded: 3 requests in flight and this one counts as 2 (n=2; the "
                "limit max_concurrent_requests=4 counts each choice); retry later, lower n or "
                "raise the limit"
            )
            one = asyncio.create_task(c.post("/v1/chat/completions", json={"messages": []}))
            await _until(lambda: len(bodies) == 2)  # n absent counts as 1: 3 + 1 fit
            full = await c.post("/generate", json=GENERATE)
            assert full.json() == overloaded(4)
            gate.set()
            assert [r.status_code for r in await asyncio.gather(held, one)] == [200, 200]
            assert bodies == [{"n": 3}, {"messages": []}]  # the guard's parse reaches the route
            assert (await c.post("/v1/chat/completions", json={"n": 4})).status_code == 200
    finally:
        await front.stop()


async def test_admission_counts_a_completion_requests_prompts_times_n():
    gate, bodies = asyncio.Event(), []
    core = ServerCore(ServerConfig(model="gated", max_concurrent_requests=4), engine=GatedEngine())
    front = HttpFront(build_app(core, completions=_gated_chat(gate, bodies)), "127.0.0.1", 0)
    url = await front.start()
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            batch = {"prompt": [[1, 2], [3]], "n": 2}  # 2 token-id prompts x n=2
            held = asyncio.create_task(c.post("/v1/completions", json=batch))
            await _until(lambda: len(bodies) == 1)
            over = await c.post("/v1/completions", json={"prompt": ["a", "b"]})
            assert (over.status_code, over.json()["error"]["message"]) == (
                503,
                "server overloaded: 4 requests in flight and this one counts as 2 (n x prompts; "
                "the limit max_concurrent_requests=4 counts each sequence); retry later, send "
                "fewer prompts or a lower n, or raise the limit",
            )
            gate.set()
            assert (await held).status_code == 200
            assert (await c.post("/v1/completions", json={"prompt": "a"})).status_code == 200
    finally:
        await front.stop()


def _over(field: str, value: int, key: str, limit: int, why: str = "") -> str:
    flag = "--" + key.replace("_", "-")
    return (
        f"{field}={value} exceeds this server's limit {key}={limit}{why} (agentloop-serve {flag})"
    )


LIMITS = {"max_n": 8, "max_tokens_per_request": 100, "max_prompt_tokens": 10}


@pytest.mark.parametrize(
    "config,path,body,message,param",
    [
        (LIMITS, "/v1/chat/completions", {"n": 9}, _over("n", 9, "max_n", 8), "n"),
        (
            {"max_concurrent_requests": 4},
            "/v1/chat/completions",
            {"n": 5},
            _over(
                "n",
                5,
                "max_concurrent_requests",
                4,
                ", which counts each of a request's n sequences",
            ),
            "n",
        ),
        (
            LIMITS,
            "/v1/chat/completions",
            {"max_tokens": 101},
            _over("max_tokens", 101, "max_tokens_per_request", 100),
            "max_tokens",
        ),
        (
            LIMITS,
            "/v1/chat/completions",
            {"max_completion_tokens": 500, "max_tokens": 5},
            _over("max_completion_tokens", 500, "max_tokens_per_request", 100),
            "max_completion_tokens",
        ),
        (
            LIMITS,
            "/generate",
            {"prompt_ids": [1, 2], "sampling_params": {"max_tokens": 101}},
            _over("sampling_params.max_tokens", 101, "max_tokens_per_request", 100),
            "sampling_params.max_tokens",
        ),
        (
            LIMITS,
            "/generate",
            {"prompt_ids": [1] * 11},
            "prompt_ids has 11 tokens, over this server's limit max_prompt_tokens=10 "
            "(agentloop-serve --max-prompt-tokens)",
            "prompt_ids",
        ),
        (LIMITS, "/v1/completions", {"prompt": "hi", "n": 9}, _over("n", 9, "max_n", 8), "n"),
        (
            LIMITS,
            "/v1/completions",
            {"prompt": "hi", "max_tokens": 101},
            _over("max_tokens", 101, "max_tokens_per_request", 100),
            "max_tokens",
        ),
        (
            {"max_concurrent_requests": 4},
            "/v1/completions",
            {"prompt": ["a", "b", "c"], "n": 2},
            "prompt holds 3 prompts of n=2 sequences each, 6 in all, over this server's limit "
            "max_concurrent_requests=4 (agentloop-serve --max-concurrent-requests): send fewer "
            "prompts per request",
            "prompt",
        ),
    ],
)
async def test_a_request_over_a_work_limit_is_400_before_admission(
    config, path, body, message, param
):
    gate, bodies = asyncio.Event(), []
    gate.set()
    engine = GatedEngine()
    engine.gate.set()
    front, url = await _front(
        ServerConfig(model="gated", **config), engine, _gated_chat(gate, bodies)
    )
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            r = await c.post(path, json=body)
            assert r.status_code == 400
            assert r.json() == {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": param,
                    "code": 400,
                }
            }
            metrics = (await c.get("/metrics")).text
            assert 'agentloop_http_rejected_total{reason="over_limit"} 1.0' in metrics
            assert bodies == [] and engine.waiting == 0
    finally:
        await front.stop()


async def test_limits_leave_mistyped_fields_to_the_routes_own_check():
    engine = GatedEngine()
    engine.gate.set()
    front, url = await _front(ServerConfig(model="gated", max_tokens_per_request=5), engine)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            r = await c.post(
                "/generate", json={"prompt_ids": [1], "sampling_params": {"max_tokens": "9"}}
            )
            assert r.json()["error"]["message"] == (
                "sampling_params.max_tokens must be an integer >= 1, got str '9'"
            )
            assert (await c.post("/generate", content=b"{not json")).json()["error"][
                "message"
            ] == "request body must be JSON"
            ok = await c.post(
                "/generate", json={"prompt_ids": [1], "sampling_params": {"max_tokens": 5}}
            )
            assert ok.status_code == 200
    finally:
        await front.stop()
