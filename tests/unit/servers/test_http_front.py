"""HTTP front routes over real uvicorn + httpx, with a scripted engine adapter."""

from __future__ import annotations

import httpx
import pytest

from servers import ServerConfig, ServerCore, TokenOutput
from servers.http import HttpFront, build_app


class ScriptedEngine:
    vocab_size = 50
    max_model_len = 32

    def __init__(self) -> None:
        self.priorities: list[int] = []

    async def generate(self, request):
        self.priorities.append(request.priority)
        n = request.sampling_params.max_tokens
        return TokenOutput(token_ids=list(range(n)), log_probs=[-1.0] * n, finish_reason="length")

    async def health(self):
        return {"backend": "scripted"}


@pytest.fixture
async def client():
    core = ServerCore(ServerConfig(model="scripted"), engine=ScriptedEngine())
    front = HttpFront(build_app(core), "127.0.0.1", 0)
    url = await front.start()
    async with httpx.AsyncClient(base_url=url, timeout=10) as c:
        c.engine = core.engine
        yield c
    await front.stop()


async def test_generate_passes_priority_to_the_engine(client):
    for body in ({"prompt_ids": [1]}, {"prompt_ids": [1], "priority": -7}):
        assert (await client.post("/generate", json=body)).status_code == 200
    assert client.engine.priorities == [0, -7]


async def test_generate_returns_the_token_output_fields(client):
    r = await client.post(
        "/generate", json={"prompt_ids": [1, 2], "sampling_params": {"max_tokens": 3}}
    )
    assert r.status_code == 200
    assert r.json() == {"token_ids": [0, 1, 2], "log_probs": [-1.0] * 3, "finish_reason": "length"}


@pytest.mark.parametrize(
    "body,message,param",
    [
        ("not json", "request body must be JSON", None),
        ("[1, 2]", "request body must be a JSON object", None),
        ('{"sampling_params": {}}', "prompt_ids is required", "prompt_ids"),
        (
            '{"prompt_ids": [1], "prompt": "hi"}',
            "unknown field(s) prompt; expected prompt_ids, sampling_params, request_id, priority",
            "prompt",
        ),
        (
            '{"prompt_ids": [1], "priority": "high"}',
            "priority must be an integer (lower is scheduled first), got 'high'",
            "priority",
        ),
        ('{"prompt_ids": [1], "request_id": 5}', "request_id must be a string", "request_id"),
        (
            '{"prompt_ids": [1], "sampling_params": {"top_p": 0}}',
            "sampling_params.top_p must be a number in (0, 1], got 0",
            "sampling_params.top_p",
        ),
        ("[" * 5000, "request body is nested too deeply to parse as JSON", None),
        (
            '{"prompt_ids": [1], "request_id": "a\\ud800"}',
            "request body holds a lone UTF-16 surrogate ('\\ud800' in a string): send valid "
            "Unicode (escape pairs like \\ud83d\\ude00 are fine)",
            None,
        ),
    ],
)
async def test_bad_bodies_get_400_with_openai_error(client, body, message, param):
    r = await client.post("/generate", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json() == {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": 400}
    }


async def test_health_and_metrics(client):
    assert (await client.get("/health")).json() == {"status": "ok", "backend": "scripted"}
    await client.post("/generate", json={"prompt_ids": [1], "sampling_params": {"max_tokens": 2}})
    text = (await client.get("/metrics")).text
    assert "agentloop_generated_tokens_total 2.0" in text
    assert 'agentloop_requests_total{finish_reason="length"} 1.0' in text


async def test_chat_is_501_without_a_chat_backend(client):
    r = await client.post("/v1/chat/completions", json={"messages": []})
    assert r.status_code == 501
    assert "use /generate" in r.json()["error"]["message"]


async def test_text_completions_are_501_without_a_serving_layer(client):
    r = await client.post("/v1/completions", json={"prompt": "hi"})
    assert (r.status_code, r.json()) == (
        501,
        {
            "error": {
                "message": "text completions are not served by the vllm backend here; use "
                "/generate",
                "type": "server_error",
                "param": None,
                "code": 501,
            }
        },
    )


async def test_models_lists_the_served_model_whatever_the_engine(client):
    r = await client.get("/v1/models")
    assert r.status_code == 200
    (card,) = r.json()["data"]
    assert r.json()["object"] == "list"
    assert {k: v for k, v in card.items() if k != "created"} == {
        "id": "scripted",
        "object": "model",
        "owned_by": "agentloop",
        "root": "scripted",
        "max_model_len": 32,
    }


def test_front_binds_loopback_by_default():
    front = HttpFront(build_app(ServerCore(ServerConfig(model="x"), engine=ScriptedEngine())))
    assert front.host == "127.0.0.1" and front.port > 0
