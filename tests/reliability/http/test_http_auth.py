"""``agentloop-serve --api-key`` on a real vLLM CPU engine (tiny-qwen3, shared with the other
HTTP modules): the official
``openai`` client with the key is served, a wrong key gets 401, a request without the header
gets 401 with the OpenAI-style body and ``WWW-Authenticate: Bearer``, ``GET /health`` stays
open for probes, and the rejections are counted in ``/metrics``."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.reliability.http.conftest import KEY

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MESSAGE = (
    "missing or wrong bearer token: send 'Authorization: Bearer <key>' "
    "(the server's api_key / AGENTLOOP_API_KEY)"
)
CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}


@pytest.fixture(scope="module")
def url(server_url) -> str:
    return server_url


def test_openai_client_with_the_key_is_served(url):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)
    out = client.chat.completions.create(model="tiny-qwen3", **CHAT)
    assert out.choices[0].finish_reason in ("stop", "length")
    assert out.usage.completion_tokens >= 1


def test_openai_client_with_a_wrong_key_gets_401(url):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError) as info:
        client.chat.completions.create(model="tiny-qwen3", **CHAT)
    assert info.value.status_code == 401
    assert info.value.body == {
        "message": MESSAGE,
        "type": "invalid_request_error",
        "param": None,
        "code": 401,
    }


def test_no_header_gets_401_but_health_is_open_and_metrics_count_rejections(url):
    before = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    r = httpx.post(f"{url}/generate", json={"prompt_ids": [151644, 872, 198]}, timeout=60)
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error"]["message"] == MESSAGE
    assert httpx.get(f"{url}/metrics", timeout=60).status_code == 401
    health = httpx.get(f"{url}/health", timeout=60)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    after = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    assert _rejected(after) == _rejected(before) + 2


def _rejected(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith('agentloop_http_rejected_total{reason="unauthorized"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
