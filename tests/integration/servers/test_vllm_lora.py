"""LoRA adapters served by the vLLM CPU engine: what the server samples from is the adapter
loaded last (its log-probs equal a transformers + PEFT forward's), over ``generate`` and the
OpenAI completions endpoint; requests finish on the version they started with; old versions'
folders go; bad adapters are refused by name and the server keeps serving.

One in-process server per model: SmolLM2 (started from a saved adapter, ``lora_adapter_path``)
runs first and is shut down before tiny-qwen3's starts, so that one engine runs at a time."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from transformers import AutoModelForCausalLM, AutoTokenizer

from servers import AsyncServer, ServerConfig
from servers.updates import AdapterUpdate
from tests.generate_requests import req

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

logger = logging.getLogger(__name__)

PROMPT = [151644, 872, 198, 9707, 11, 3555, 374, 220, 17, 10, 17, 30, 151645, 198, 151644, 77091]
SAMPLED = {"max_tokens": 24, "temperature": 1.0, "seed": 3, "ignore_eos": True}
LORA_RANK = 8
TOLERANCE = 1e-3  # served vs. transformers log-probs, float32 both


def _peft_model(path: Any) -> Any:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    config = LoraConfig(r=LORA_RANK, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0)
    return get_peft_model(model, config).eval()


def _new_adapter(model: Any, seed: int, scale: float = 0.05) -> tuple[dict, dict]:
    """Give ``model``'s adapter random ``lora_B`` (PEFT starts it at zero: no change) and
    return what a trainer sends: PEFT-named tensors and the JSON-safe adapter config."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * scale)
    config = model.peft_config["default"].to_dict()
    config["target_modules"] = sorted(config["target_modules"])
    tensors = {k: v.clone() for k, v in get_peft_model_state_dict(model).items()}
    return tensors, config


def _log_probs(model: Any, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def _gaps(
    model: Any, prompt: list[int], tokens: list[int], served: list[float]
) -> tuple[float, float]:
    """Largest |served - adapter| and |served - base model| log-prob over ``tokens``."""
    got = torch.tensor(served)
    lora = (got - _log_probs(model, prompt, tokens)).abs().max().item()
    with model.disable_adapter():
        base = (got - _log_probs(model, prompt, tokens)).abs().max().item()
    return lora, base


def _assert_follows_adapter(
    model: Any, prompt: list[int], tokens: list[int], served: list[float]
) -> None:
    lora, base = _gaps(model, prompt, tokens, served)
    logger.info("largest log-prob gap: %.1e to the adapter, %.2f to the base model", lora, base)
    assert lora < TOLERANCE, lora
    assert base > 0.05 and base > 50 * lora, (lora, base)  # the adapter is applied


async def test_smollm2_started_from_an_adapter_folder_serves_it(smollm2_path, tmp_path):
    model = _peft_model(smollm2_path)
    _new_adapter(model, seed=5, scale=0.02)
    model.save_pretrained(tmp_path)  # PEFT's own folder: adapter_config.json + safetensors
    server = AsyncServer(
        ServerConfig(
            model=str(smollm2_path),
            max_model_len=256,
            enforce_eager=True,
            http=False,
            lora_rank=LORA_RANK,
            lora_adapter_path=str(tmp_path),
        )
    )
    try:
        assert (await server.start())["lora_version"] == 1
        prompt = AutoTokenizer.from_pretrained(smollm2_path).apply_chat_template(
            [{"role": "user", "content": "Add 2 and 3."}],
            add_generation_prompt=True,
            return_dict=False,
        )
        out = await server.generate(req(prompt, SAMPLED))
        _assert_follows_adapter(model, prompt, out.token_ids, out.log_probs)
    finally:
        await server.shutdown()
    assert (tmp_path / "adapter_model.safetensors").is_file()  # the user's folder is left alone


@pytest.fixture(scope="module")
def peft_model(tiny_qwen3_path) -> Any:
    return _peft_model(tiny_qwen3_path)


@pytest.fixture(scope="module")
async def server(tiny_qwen3_path):
    server = AsyncServer(
        ServerConfig(
            model=str(tiny_qwen3_path), max_model_len=256, enforce_eager=True, lora_rank=LORA_RANK
        )
    )
    await server.start()
    yield server
    await server.shutdown()


def _folders(server: AsyncServer) -> list[str]:
    return sorted(p.name for p in server.core.engine.adapter_root.iterdir())


async def test_before_any_adapter_the_server_serves_the_base_model(server, peft_model):
    assert server.weight_sync_info().lora_rank == LORA_RANK
    assert (await server.health())["lora_version"] == 0
    out = await server.generate(req(PROMPT, SAMPLED))
    with peft_model.disable_adapter():
        base = _log_probs(peft_model, PROMPT, out.token_ids)
    assert (torch.tensor(out.log_probs) - base).abs().max().item() < TOLERANCE


async def test_a_loaded_adapter_is_what_the_server_samples_from(server, peft_model):
    version = await server.apply_weights(AdapterUpdate(*_new_adapter(peft_model, seed=1)))
    assert version == (await server.health())["lora_version"] >= 1
    assert {"adapter_config.json", "adapter_model.safetensors"} == {
        p.name for p in (server.core.engine.adapter_root / f"v{version}").iterdir()
    }
    out = await server.generate(req(PROMPT, SAMPLED))
    _assert_follows_adapter(peft_model, PROMPT, out.token_ids, out.log_probs)


async def test_the_openai_completions_endpoint_samples_from_the_current_adapter(server, peft_model):
    await server.apply_weights(AdapterUpdate(*_new_adapter(peft_model, seed=2)))
    body = {"model": "tiny-qwen3", "prompt": PROMPT, "logprobs": 1, "return_token_ids": True}
    async with httpx.AsyncClient(base_url=server.address(), timeout=60) as client:
        reply = await client.post("/v1/completions", json={**body, **SAMPLED})
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == "tiny-qwen3"  # not the adapter version's name
    choice = reply.json()["choices"][0]
    tokens, served = choice["token_ids"], choice["logprobs"]["token_logprobs"]
    assert len(tokens) == SAMPLED["max_tokens"]
    _assert_follows_adapter(peft_model, PROMPT, tokens, served)


async def test_a_request_finishes_on_its_version_while_newer_ones_load(server, peft_model):
    first = _new_adapter(peft_model, seed=11)
    v1 = await server.apply_weights(AdapterUpdate(*first))
    engine = server.core.engine.engine
    long = asyncio.ensure_future(
        server.generate(req(PROMPT, {**SAMPLED, "max_tokens": 200, "seed": 4}))
    )
    while engine.get_num_unfinished_requests() == 0:  # the request has reached the engine
        await asyncio.sleep(0.005)
    v2 = await server.apply_weights(AdapterUpdate(*_new_adapter(peft_model, seed=12)))
    v3 = await server.apply_weights(AdapterUpdate(*_new_adapter(peft_model, seed=13)))
    assert not long.done(), "the long request ended before the new versions loaded"
    assert (v2, v3) == (v1 + 1, v1 + 2)
    assert _folders(server) == [f"v{v1}", f"v{v2}", f"v{v3}"]  # v1 kept: a request runs on it

    out = await server.generate(req(PROMPT, SAMPLED))  # new requests: the current version
    _assert_follows_adapter(peft_model, PROMPT, out.token_ids, out.log_probs)
    finished = await long
    set_peft_model_state_dict(peft_model, first[0])
    _assert_follows_adapter(peft_model, PROMPT, finished.token_ids, finished.log_probs)

    v4 = await server.apply_weights(AdapterUpdate(*_new_adapter(peft_model, seed=14)))
    assert _folders(server) == [f"v{v3}", f"v{v4}"]  # the current one and the one before
    assert (await server.health())["lora_version"] == v4


async def test_an_adapter_above_the_servers_rank_is_refused(server, peft_model):
    tensors, config = _new_adapter(peft_model, seed=21)
    before = (await server.health())["lora_version"]
    with pytest.raises(ValueError) as info:
        await server.apply_weights(AdapterUpdate(tensors, {**config, "r": 16}))
    assert str(info.value) == (
        "adapter rank 16 is above the largest this server loads (8, from lora_rank=8): start "
        "it with lora_rank=16 or more"
    )
    assert (await server.health())["lora_version"] == before


async def test_an_adapter_for_modules_the_model_lacks_is_refused_and_serving_goes_on(
    server, peft_model
):
    tensors, config = _new_adapter(peft_model, seed=22)
    before = (await server.health())["lora_version"]
    folders = _folders(server)
    wrong = {name.replace("q_proj", "qkv_typo"): t for name, t in tensors.items()}
    with pytest.raises(ValueError) as info:
        await server.apply_weights(AdapterUpdate(wrong, config))
    message = str(info.value)
    assert message.startswith("vLLM could not load the adapter: "), message
    assert "model.layers.0.self_attn.qkv_typo" in message
    assert (await server.health())["lora_version"] == before
    assert _folders(server) == folders  # the refused version's folder is gone
    out = await server.generate(req(PROMPT, SAMPLED))
    assert len(out.token_ids) == SAMPLED["max_tokens"]
