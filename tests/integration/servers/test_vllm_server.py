"""The vLLM AsyncServer as a real Ray actor on the vLLM CPU engine (tiny-qwen3): the session's
shared server (``tests/ray_local.py``, whose settings these tests check). Generate, abort,
weight update, bad input, HTTP front (with its work limits and sequence-counting admission),
OpenAI client (chat, text completions, models), and engine settings passed through to vLLM."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import httpx
import openai
import pytest
import ray
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from servers import AsyncLLMServerManager
from servers.scratch import SCRATCH_PREFIX
from tests.generate_requests import req, turn_of
from tests.ray_local import (
    BATCHED_TOKENS,
    MAX_LOGPROBS,
    MAX_MODEL_LEN,
    MAX_N,
    MAX_NUM_SEQS,
    MAX_PROMPT,
    MAX_TOKENS,
)
from tests.weight_updates import load_named

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_path):
    return AutoTokenizer.from_pretrained(tiny_qwen3_path)


@pytest.fixture(scope="module")
def prompt(tokenizer) -> list[int]:
    msgs = [{"role": "user", "content": "Add 2 and 3."}]
    return tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)


@pytest.fixture(scope="module")
def server(tiny_server):
    """The session's shared tiny-qwen3 server: its settings (``tests/ray_local.py``) are the
    ones these tests check. Tests that load other weights put the original ones back."""
    return tiny_server


@pytest.fixture(scope="module")
def base_url(server) -> str:
    return ray.get(server.address.remote())


async def test_64_concurrent_requests_complete_with_one_logprob_per_token(server, prompt):
    manager = AsyncLLMServerManager([server])
    outs = await asyncio.gather(
        *[
            manager.generate(
                turn_of(
                    f"traj-{i}",
                    prompt_ids=prompt,
                    sampling_params={"max_tokens": 24, "temperature": 1.0, "seed": i},
                )
            )
            for i in range(64)
        ]
    )
    assert len(outs) == 64
    for out in outs:
        assert 1 <= len(out.token_ids) <= 24
        assert len(out.log_probs) == len(out.token_ids)
        assert all(lp <= 0.0 for lp in out.log_probs)
        assert out.finish_reason in ("stop", "length")
    assert manager.stats()[0]["in_flight"] == 0 and manager.stats()[0]["requests"] == 64


async def test_greedy_output_is_deterministic(server, prompt):
    params = {"max_tokens": 16, "temperature": 0.0}
    a = await server.generate.remote(req(prompt, params))
    b = await server.generate.remote(req(prompt, params))
    assert a.token_ids == b.token_ids and len(a.token_ids) > 0


async def test_max_tokens_is_clamped_to_the_model_length(server, prompt):
    out = await server.generate.remote(
        req(prompt, {"max_tokens": 10_000, "temperature": 1.0, "ignore_eos": True, "seed": 1})
    )
    assert len(prompt) + len(out.token_ids) == MAX_MODEL_LEN
    assert out.finish_reason == "length"


async def test_abort_ends_a_long_request_with_finish_reason_abort(server, prompt):
    params = {"max_tokens": 480, "temperature": 1.0, "ignore_eos": True}
    task = asyncio.ensure_future(server.generate.remote(req(prompt, params, "long-1")))
    await asyncio.sleep(1.0)
    await server.abort.remote("long-1")
    out = await asyncio.wait_for(task, timeout=60)
    assert out.finish_reason == "abort"
    assert len(out.token_ids) < 480


async def test_waiting_turns_run_lowest_priority_first_not_in_arrival_order(server, prompt):
    """Blockers fill every sequence slot; turns sent meanwhile in descending priority order
    run in waves of MAX_NUM_SEQS by ascending priority once the blockers end."""
    manager = AsyncLLMServerManager([server])
    long = {"max_tokens": 128, "ignore_eos": True, "temperature": 1.0}
    blockers = [
        asyncio.ensure_future(
            manager.generate(
                turn_of(f"block-{i}", prompt_ids=prompt, sampling_params=long, priority=-99)
            )
        )
        for i in range(MAX_NUM_SEQS)
    ]
    await asyncio.sleep(0.5)  # the blockers hold every slot
    finished: list[int] = []

    async def turn(priority: int) -> None:
        params = {"max_tokens": 8, "ignore_eos": True, "temperature": 1.0}
        await manager.generate(
            turn_of(
                f"wait-{priority}", prompt_ids=prompt, sampling_params=params, priority=priority
            )
        )
        finished.append(priority)

    priorities = list(range(3 * MAX_NUM_SEQS, 0, -1))  # arrival: highest value first
    waiters = []
    for p in priorities:
        waiters.append(asyncio.ensure_future(turn(p)))
        await asyncio.sleep(0.005)  # distinct arrival times
    await asyncio.gather(*blockers, *waiters)
    waves = [sorted(finished[k : k + MAX_NUM_SEQS]) for k in range(0, len(finished), MAX_NUM_SEQS)]
    ranked = sorted(priorities)
    assert waves == [ranked[k : k + MAX_NUM_SEQS] for k in range(0, len(ranked), MAX_NUM_SEQS)]


BAD_INPUTS = [
    ([], {"max_tokens": 4}, "prompt_ids is empty: send at least one token id"),
    ([1, 151936], {}, "prompt_ids contains token id 151936 outside the vocabulary [0, 151936)"),
    (
        [1] * MAX_MODEL_LEN,
        {},
        f"prompt_ids has {MAX_MODEL_LEN} tokens but the model length is "
        f"{MAX_MODEL_LEN}: shorten the prompt to at most {MAX_MODEL_LEN - 1} tokens",
    ),
    ([1, 2], {"temperature": -1}, "sampling_params.temperature must be a number >= 0, got -1"),
    (
        [1, 2],
        {"max_tokens": "ten"},
        "sampling_params.max_tokens must be an integer >= 1, got str 'ten'",
    ),
    ([1, 2], {"beam_width": 2}, "unknown sampling_params key(s) beam_width"),
]


@pytest.mark.parametrize("prompt_ids,params,message", BAD_INPUTS)
async def test_bad_input_over_ray_is_a_value_error_and_server_stays_healthy(
    server, prompt, prompt_ids, params, message
):
    with pytest.raises(ValueError) as info:
        await server.generate.remote(req(prompt_ids, params))
    assert message in str(info.value)
    assert (await server.health.remote())["backend"] == "vllm"
    ok = await server.generate.remote(req(prompt, {"max_tokens": 2}))
    assert len(ok.token_ids) >= 1


def _over_prompt_limit(length: int, field: str = "prompt_ids", how: str = "") -> str:
    return (
        f"{field} has {length} tokens{how}, over this server's limit "
        f"max_prompt_tokens={MAX_PROMPT} (agentloop-serve --max-prompt-tokens)"
    )


# Over HTTP a prompt past max_prompt_tokens is turned away before the model-length check.
HTTP_BAD_INPUTS = [
    (ids, params, _over_prompt_limit(len(ids)) if len(ids) > MAX_PROMPT else message)
    for ids, params, message in BAD_INPUTS
]


@pytest.mark.parametrize("prompt_ids,params,message", HTTP_BAD_INPUTS)
async def test_bad_input_over_http_is_400_with_openai_error_body(
    base_url, prompt_ids, params, message
):
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        r = await client.post(
            "/generate", json={"prompt_ids": prompt_ids, "sampling_params": params}
        )
        assert r.status_code == 400
        err = r.json()["error"]
        assert message in err["message"]
        assert err["type"] == "invalid_request_error" and err["code"] == 400
        assert (await client.get("/health")).status_code == 200


async def test_http_generate_health_and_metrics(base_url, prompt):
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        r = await client.post(
            "/generate",
            json={
                "prompt_ids": prompt,
                "sampling_params": {"max_tokens": 8, "temperature": 0},
                "request_id": "http-1",
            },
        )
        assert r.status_code == 200
        body = r.json()
        assert set(body) == {"token_ids", "log_probs", "finish_reason"}
        assert len(body["log_probs"]) == len(body["token_ids"]) > 0
        health = (await client.get("/health")).json()
        assert health["status"] == "ok" and health["max_model_len"] == MAX_MODEL_LEN
        text = (await client.get("/metrics")).text
    assert "agentloop_requests_in_flight 0.0" in text
    assert "agentloop_generated_tokens_total" in text
    assert "agentloop_request_latency_seconds_bucket" in text
    assert 'agentloop_request_errors_total{kind="bad_request"}' in text


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


async def test_openai_client_gets_a_chat_completion_with_usage(base_url):
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused")
    resp = await client.chat.completions.create(
        model="tiny-qwen3",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=8,
        temperature=0,
    )
    assert resp.choices[0].message.role == "assistant"
    assert resp.usage.completion_tokens == 8 or resp.choices[0].finish_reason == "stop"
    assert resp.usage.prompt_tokens > 0


async def test_openai_client_gets_a_parsed_tool_call(base_url):
    # Constrain decoding to a Hermes tool call so the random tiny model emits one; the
    # server's Hermes parser must turn the text into a structured tool call.
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused")
    resp = await client.chat.completions.create(
        model="tiny-qwen3",
        messages=[{"role": "user", "content": "Add 2 and 3."}],
        tools=TOOLS,
        max_tokens=64,
        temperature=0,
        extra_body={"structured_outputs": {"regex": __import__("re").escape(call)}},
    )
    message = resp.choices[0].message
    assert resp.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls[0].function.name == "add"
    assert json.loads(message.tool_calls[0].function.arguments) == {"a": 2, "b": 3}


ENGINE_KEYS = ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "enforce_eager")


async def test_engine_settings_reach_vllm_and_show_in_health(server):
    health = await server.health.remote()
    assert {k: health[k] for k in ENGINE_KEYS} == {
        "max_num_seqs": MAX_NUM_SEQS,
        "max_num_batched_tokens": BATCHED_TOKENS,
        "enable_chunked_prefill": False,
        "enforce_eager": True,
    }
    # one rank on CPU: the model runs inside the engine-core process (servers/cpu_layout.py)
    assert health["executor"] == "uni"


async def test_openai_client_lists_the_served_model(base_url):
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused")
    models = [m async for m in client.models.list()]
    assert [(m.id, m.object, m.owned_by) for m in models] == [("tiny-qwen3", "model", "agentloop")]


async def test_openai_client_gets_a_text_completion_through_vllm(base_url, tokenizer):
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused")
    resp = await client.completions.create(
        model="tiny-qwen3", prompt="2 + 3 =", max_tokens=6, temperature=0, logprobs=MAX_LOGPROBS
    )
    (choice,) = resp.choices
    assert resp.object == "text_completion" and resp.model == "tiny-qwen3"
    assert choice.finish_reason in ("stop", "length") and choice.text
    assert resp.usage.prompt_tokens == len(tokenizer("2 + 3 =")["input_ids"])
    assert len(choice.logprobs.tokens) == resp.usage.completion_tokens <= 6
    # a batch of token-id prompts with n=2 each: 4 choices, as admission counts them
    batch = await client.completions.create(
        model="tiny-qwen3", prompt=[[1, 2, 3], [4, 5]], n=2, max_tokens=2, temperature=1.0
    )
    assert sorted(c.index for c in batch.choices) == [0, 1, 2, 3]


async def test_an_eager_cpu_engine_compiles_nothing(server, base_url):
    """vLLM wraps the rank of each sampled token's log-prob in ``torch.compile``; an eager CPU
    engine runs it eagerly (servers/cpu_layout.eager_cpu_env): no inductor cache appears in
    the engine's temp folder (it did at every start, with a C++ compile, before)."""
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused")
    resp = await client.completions.create(
        model="tiny-qwen3", prompt=[[1, 2, 3], [4, 5]], max_tokens=3, logprobs=1
    )
    assert all(len(c.logprobs.tokens) >= 1 for c in resp.choices)
    pid = await server.__ray_call__.remote(lambda actor: os.getpid())
    (scratch,) = Path("/dev/shm").glob(f"{SCRATCH_PREFIX}{pid}-*")  # this server's own
    assert list(scratch.glob("torchinductor_*")) == []


async def test_a_bad_text_completion_is_400_with_the_engines_reason(base_url):
    """``logprobs`` over the engine's ``max_logprobs`` (set by ``engine_kwargs``): vLLM says so."""
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        await client.completions.create(
            model="tiny-qwen3", prompt="hi", max_tokens=2, logprobs=MAX_LOGPROBS + 2
        )
    assert info.value.status_code == 400
    assert (
        f"Requested sample logprobs of {MAX_LOGPROBS + 2}, which is greater than max allowed: "
        f"{MAX_LOGPROBS}" in info.value.body["message"]
    )


async def test_a_text_prompt_over_the_limit_once_tokenized_is_400(base_url, tokenizer):
    words = " ".join(["apple"] * (MAX_PROMPT + 20))  # under the model length, over the limit
    length = len(tokenizer(words)["input_ids"])
    assert MAX_PROMPT < length < MAX_MODEL_LEN - 4
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        r = await client.post(
            "/v1/completions", json={"model": "tiny-qwen3", "prompt": words, "max_tokens": 4}
        )
    assert (r.status_code, r.json()) == (
        400,
        _error(_over_prompt_limit(length, "prompt"), "prompt"),
    )


async def test_openai_bad_request_is_400(base_url):
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(
            model="tiny-qwen3", messages=[{"role": "user", "content": "hi"}], temperature=-3
        )
    assert info.value.status_code == 400


def _error(message: str, param: str | None, code: int = 400) -> dict:
    kind = "invalid_request_error" if code < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _over(field: str, value: int, key: str, limit: int) -> dict:
    flag = "--" + key.replace("_", "-")
    message = f"{field}={value} exceeds this server's limit {key}={limit} (agentloop-serve {flag})"
    return _error(message, field)


CHAT = {"model": "tiny-qwen3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.mark.parametrize(
    "path,body,error",
    [
        ("/v1/chat/completions", {**CHAT, "n": MAX_N + 1}, _over("n", MAX_N + 1, "max_n", MAX_N)),
        (
            "/v1/chat/completions",
            {**CHAT, "max_tokens": MAX_TOKENS + 1},
            _over("max_tokens", MAX_TOKENS + 1, "max_tokens_per_request", MAX_TOKENS),
        ),
        (
            "/v1/chat/completions",
            {**CHAT, "max_completion_tokens": 10**6},
            _over("max_completion_tokens", 10**6, "max_tokens_per_request", MAX_TOKENS),
        ),
        (
            "/generate",
            {"prompt_ids": [1, 2], "sampling_params": {"max_tokens": MAX_TOKENS + 1}},
            _over(
                "sampling_params.max_tokens", MAX_TOKENS + 1, "max_tokens_per_request", MAX_TOKENS
            ),
        ),
        (
            "/generate",
            {"prompt_ids": [1] * (MAX_PROMPT + 1)},
            _error(_over_prompt_limit(MAX_PROMPT + 1), "prompt_ids"),
        ),
        (
            "/v1/completions",
            {"model": "tiny-qwen3", "prompt": "hi", "max_tokens": MAX_TOKENS + 1},
            _over("max_tokens", MAX_TOKENS + 1, "max_tokens_per_request", MAX_TOKENS),
        ),
    ],
)
async def test_a_request_over_a_work_limit_is_400_naming_the_limit(base_url, path, body, error):
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        r = await client.post(path, json=body)
        assert (r.status_code, r.json()) == (400, error)
        metrics = (await client.get("/metrics")).text
    assert 'agentloop_http_rejected_total{reason="over_limit"}' in metrics


async def test_a_chat_prompt_over_the_limit_after_the_template_is_400(base_url, tokenizer):
    words = " ".join(["apple"] * MAX_PROMPT)  # under the model length, over the prompt limit
    messages = [{"role": "user", "content": words}]
    length = len(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    )
    assert MAX_PROMPT < length < MAX_MODEL_LEN - 4
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="tiny-qwen3", messages=messages, max_tokens=4)
    assert info.value.status_code == 400
    assert (
        info.value.body
        == _error(_over_prompt_limit(length, "messages", " after the chat template"), "messages")[
            "error"
        ]
    )


async def _in_flight(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    line = next(x for x in text.splitlines() if x.startswith("agentloop_requests_in_flight "))
    return float(line.split()[1])


async def test_admission_counts_each_choice_of_a_chat_request(base_url):
    """With room for MAX_SEQUENCES=4 sequences, a chat request with n=3 running leaves room
    for one more: an n=2 request gets 503 at once, an n=1 request runs beside it."""
    long = {**CHAT, "max_tokens": 200, "ignore_eos": True, "temperature": 1.0}
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        first = asyncio.ensure_future(client.post("/v1/chat/completions", json={**long, "n": 3}))
        deadline = asyncio.get_running_loop().time() + 30
        while await _in_flight(client) < 1:
            assert asyncio.get_running_loop().time() < deadline, "n=3 request never started"
            await asyncio.sleep(0.05)
        busy = await client.post("/v1/chat/completions", json={**CHAT, "n": 2})
        message = (
            "server overloaded: 3 requests in flight and this one counts as 2 (n=2; the limit "
            "max_concurrent_requests=4 counts each choice); retry later, lower n or raise the "
            "limit"
        )
        assert (busy.status_code, busy.json()) == (503, _error(message, None, 503))
        assert busy.headers["retry-after"] == "1"
        assert not first.done()  # the n=2 request was turned away while n=3 ran
        beside = await client.post("/v1/chat/completions", json={**CHAT, "n": 1})
        assert beside.status_code == 200
        done = await first
        assert done.status_code == 200 and len(done.json()["choices"]) == 3
        assert (await client.post("/v1/chat/completions", json={**CHAT, "n": 2})).status_code == 200


def _hf_logprobs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


async def test_weight_update_changes_outputs_and_logprobs_match_transformers(
    server, prompt, tiny_qwen3_path
):
    greedy = {"max_tokens": 12, "temperature": 0.0}
    before = await server.generate.remote(req(prompt, greedy))
    original = load_file(str(tiny_qwen3_path / "model.safetensors"))
    torch.manual_seed(123)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_path, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    new_state = {k: v.clone() for k, v in model.state_dict().items()}
    loaded = await load_named(server, list(new_state.items()), 1 << 20)
    try:
        assert loaded == len(new_state)

        after = await server.generate.remote(req(prompt, greedy))
        assert after.token_ids != before.token_ids

        sampled = await server.generate.remote(
            req(prompt, {"max_tokens": 32, "temperature": 1.0, "seed": 7, "ignore_eos": True})
        )
        reference = _hf_logprobs(model, prompt, sampled.token_ids)
        diff = (torch.tensor(sampled.log_probs) - reference).abs().mean().item()
        assert diff < 1e-3, diff
    finally:  # the server is shared: its original weights go back whatever happened
        await load_named(server, list(original.items()))
    # Restoring the original weights restores the original greedy output exactly.
    restored = await server.generate.remote(req(prompt, greedy))
    assert restored.token_ids == before.token_ids


async def test_sleep_and_wake_up_are_noops_on_cpu_and_server_still_generates(server, prompt):
    await server.sleep.remote()
    await server.wake_up.remote()
    out = await server.generate.remote(req(prompt, {"max_tokens": 3}))
    assert len(out.token_ids) >= 1


async def _running(server) -> bool:
    """The server has a generate request running (its in-flight gauge)."""
    text = await server.metrics_text.remote()
    line = next(x for x in text.splitlines() if x.startswith("agentloop_requests_in_flight "))
    return float(line.split()[1]) >= 1


def _old_and_new(path):
    """The original state dict, its model, and a perturbed copy (the next version)."""
    original = load_file(str(path / "model.safetensors"))
    old = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    new = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    torch.manual_seed(321)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return original, old, new


async def _through_an_update(server, manager, prompt, session, new, original, **pause):
    """A turn of ``session`` as long as the model allows (about 4.5 s of decoding at full
    speed); once the (warm) engine has run it for a second (some tokens, far from the end,
    however long it took to start under load) the manager pauses (``pause``), ``new``'s
    weights load as version 1 and it resumes; ``original`` goes back after.
    Returns the finished turn, stamped 0 then 1, and how many tokens version 0 sampled."""
    budget = MAX_MODEL_LEN - len(prompt) - 8
    params = {"max_tokens": budget, "temperature": 1.0, "ignore_eos": True}
    task = asyncio.ensure_future(
        manager.generate(turn_of(session, prompt_ids=prompt, sampling_params=params))
    )
    deadline = time.monotonic() + 60
    while not await _running(server):
        assert time.monotonic() < deadline, "the request never started"
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)
    assert await manager.pause(**pause) == 1
    await load_named(server, list(new.state_dict().items()), 1 << 20)
    manager.resume(1)
    try:
        out = await asyncio.wait_for(task, timeout=120)
    finally:
        await load_named(server, list(original.items()))
    assert out.finish_reason == "length" and len(out.token_ids) == budget
    assert out.versions is not None and out.log_probs is not None
    k = out.versions.count(0)
    assert 0 < k < budget and out.versions == [0] * k + [1] * (budget - k)
    return out, k


async def test_a_turn_aborted_for_a_weight_update_resumes_and_each_token_matches_its_version(
    server, prompt, tiny_qwen3_path
):
    """Partial rollout: ``pause(abort=True)`` mid-turn, new weights, ``resume(1)``: the turn
    continues from the tokens it had, each stamped with the version that sampled it, and
    each stored log-prob is the trainer's at that version."""
    original, old, new = _old_and_new(tiny_qwen3_path)
    manager = AsyncLLMServerManager([server])
    await manager.generate(turn_of("warm", prompt_ids=prompt, sampling_params={"max_tokens": 4}))
    out, k = await _through_an_update(
        server, manager, prompt, "partial-1", new, original, abort=True
    )
    assert manager.resumed_turns == 1
    stored = torch.tensor(out.log_probs)
    before = _hf_logprobs(old, prompt, out.token_ids[:k])
    after = _hf_logprobs(new, prompt + out.token_ids[:k], out.token_ids[k:])
    gap = (stored - torch.cat([before, after])).abs()
    assert gap.max().item() < 1e-3, gap.max().item()
    # the resumed half is not the old policy's: the stamps matter
    stale = _hf_logprobs(old, prompt + out.token_ids[:k], out.token_ids[k:])
    assert (stored[k:] - stale).abs().mean().item() > 1e-2


def _counter(text: str, name: str) -> float:
    """A Prometheus counter's total over its labels."""
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    )


async def test_an_in_flight_update_keeps_the_turn_running_and_stamps_both_versions(
    server, prompt, tiny_qwen3_path
):
    """In-flight update: ``pause(keep=True)`` mid-turn, the new weights load between two
    decode steps, ``resume(1)``: the same engine request runs on (no abort, no second request,
    no prompt sent again), its tokens stamped 0 then 1 where the engine says the weights
    changed; the first part's log-probs are the old policy's, the rest are not."""
    original, old, new = _old_and_new(tiny_qwen3_path)
    manager = AsyncLLMServerManager([server])
    await manager.generate(turn_of("warm", prompt_ids=prompt, sampling_params={"max_tokens": 4}))
    text = await server.metrics_text.remote()
    prompts_before = _counter(text, "agentloop_prompt_tokens_total")
    requests_before = _counter(text, "agentloop_requests_total")
    # pause(keep=True) returns at once: the turn keeps running in the engine
    out, k = await _through_an_update(
        server, manager, prompt, "inflight-1", new, original, keep=True
    )
    assert (manager.kept_turns, manager.resumed_turns, manager.reprefilled_tokens) == (1, 0, 0)
    text = await server.metrics_text.remote()
    assert _counter(text, "agentloop_requests_total") == requests_before + 1  # one request
    assert _counter(text, "agentloop_prompt_tokens_total") == prompts_before + len(prompt)
    stored = torch.tensor(out.log_probs)
    before = _hf_logprobs(old, prompt, out.token_ids[:k])
    assert (stored[:k] - before).abs().max().item() < 1e-3
    stale = _hf_logprobs(old, prompt + out.token_ids[:k], out.token_ids[k:])
    assert (stored[k:] - stale).abs().mean().item() > 1e-2  # the new weights sampled these
