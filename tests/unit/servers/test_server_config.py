"""ServerConfig: a bad engine or HTTP setting fails at construction, naming the setting."""

from __future__ import annotations

import pytest

from servers import ServerConfig


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
    ],
)
def test_bad_server_setting_is_named(setting, message):
    with pytest.raises(ValueError) as info:
        ServerConfig(model="/models/x", **setting)
    assert str(info.value) == message
