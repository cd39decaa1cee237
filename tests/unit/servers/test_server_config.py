"""ServerConfig: a bad engine or HTTP setting fails at construction, naming the setting."""

from __future__ import annotations

import asyncio
from dataclasses import fields

import pytest
import torch

from servers import EngineConfig, ServerConfig


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"backend": "tgi"}, "backend must be 'vllm' or 'sglang', got 'tgi'"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size must be >= 1"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization must be in (0, 1]"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization must be in (0, 1]"),
        ({"max_model_len": 1}, "max_model_len must be >= 2 (or None for the model's)"),
        ({"cpu_kvcache_space_gib": 0}, "cpu_kvcache_space_gib must be >= 1 GiB"),
        (
            {"logprobs_mode": "logits"},
            "logprobs_mode must be 'processed_logprobs' or 'raw_logprobs'",
        ),
        ({"port": 70000}, "port must be in [0, 65535], got 70000"),
        ({"port": -1}, "port must be in [0, 65535], got -1"),
        (
            {"weight_transfer": "rdma"},
            "weight_transfer must be 'host', 'nccl' or 'ipc', got 'rdma'",
        ),
        (
            {"backend": "sglang", "weight_transfer": "nccl"},
            "weight_transfer='nccl' is vLLM's weight-transfer API: use backend='vllm', or "
            "weight_transfer='host' with sglang",
        ),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens must be >= 1 (or None), got 0"),
        (
            {"engine_kwargs": {"tensor_parallel_size": 2}},
            "engine_kwargs.tensor_parallel_size: the server sets this engine argument from "
            "tensor_parallel_size; set tensor_parallel_size instead",
        ),
        (
            {"engine_kwargs": {"weight_transfer_config": {}}},
            "engine_kwargs.weight_transfer_config: the server sets this engine argument from "
            "weight_transfer; set weight_transfer instead",
        ),
        (
            {"engine_kwargs": {"worker_extension_cls": "my.Ext"}},
            "engine_kwargs.worker_extension_cls: the server sets this engine argument itself and "
            "it cannot be changed; remove it",
        ),
        (
            {"backend": "sglang", "engine_kwargs": {"tp_size": 2}},
            "engine_kwargs.tp_size: the server sets this engine argument from "
            "tensor_parallel_size; set tensor_parallel_size instead",
        ),
    ],
)
def test_bad_server_setting_is_named(setting, message):
    with pytest.raises(ValueError) as info:
        ServerConfig(model="/models/x", **setting)
    assert str(info.value) == message


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal")
def test_a_gpu_weight_transfer_is_refused_on_cpu_before_an_engine_starts():
    from servers.vllm import VLLMEngine

    engine = VLLMEngine(ServerConfig(model="/models/x", weight_transfer="nccl"))
    with pytest.raises(ValueError) as info:
        asyncio.run(engine.start())
    assert str(info.value) == (
        "weight_transfer='nccl' needs CUDA GPUs (vLLM's weight-transfer API); use "
        "weight_transfer='host' on CPU"
    )
    assert engine.engine is None


def test_an_unknown_vllm_engine_argument_fails_the_start_naming_it_before_the_engine():
    from servers.vllm import VLLMEngine

    config = ServerConfig(model="/models/x", engine_kwargs={"max_num_batchd_tokens": 64})
    engine = VLLMEngine(config)
    with pytest.raises(ValueError) as info:
        asyncio.run(engine.start())
    assert str(info.value) == (
        "engine_kwargs.max_num_batchd_tokens is not an engine argument of vLLM (did you mean "
        "max_num_batched_tokens? set max_num_batched_tokens for it): fix the name or remove it"
    )
    assert engine.engine is None


def test_a_server_of_an_engine_node_takes_every_engine_field_as_it_is():
    """``ServerConfig.of_engine``: the rollout config's ``engine`` node reaches the server with
    no field copied by hand; a launcher's own value (the derived ``max_model_len``) wins."""
    engine = EngineConfig(
        backend="sglang",
        tensor_parallel_size=2,
        gpu_memory_utilization=0.7,
        enforce_eager=True,
        scheduling_policy="fcfs",
        max_num_seqs=8,
        max_num_batched_tokens=4096,
        enable_chunked_prefill=False,
        engine_kwargs={"attention_backend": "triton"},
    )
    server = ServerConfig.of_engine(engine, model="m", max_model_len=1536, http=False)
    for f in fields(EngineConfig):
        if f.name != "max_model_len":
            assert getattr(server, f.name) == getattr(engine, f.name), f.name
    assert (server.model, server.max_model_len, server.http) == ("m", 1536, False)
    assert isinstance(server, EngineConfig)  # the servers read the engine fields as they are
