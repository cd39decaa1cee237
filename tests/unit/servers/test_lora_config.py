"""LoRA on a server: bad ``lora_rank`` / ``lora_adapter_path`` settings and bad adapters are
refused naming the setting; adapter folders are written as PEFT does, and those of a killed
server are removed."""

from __future__ import annotations

import asyncio
import json
import os
import typing

import pytest
import torch
from safetensors.torch import load_file

from servers import AsyncServer, ServerConfig
from servers.lora import (
    VLLM_MAX_LORA_RANKS,
    check_adapter_rank,
    check_lora,
    max_lora_rank,
    write_adapter,
)
from servers.shm import SHM, remove_shm
from servers.updates import AdapterUpdate
from servers.weights import new_adapter_root, sweep_orphans


@pytest.fixture
def adapter(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 16, "lora_alpha": 32}))
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    return tmp_path


def test_the_engines_max_lora_rank_is_the_next_one_vllm_accepts():
    from vllm.config.lora import MaxLoRARanks

    assert VLLM_MAX_LORA_RANKS == typing.get_args(MaxLoRARanks)
    assert [max_lora_rank(r) for r in (0, 1, 2, 8, 9, 16, 300, 512)] == [
        0, 1, 8, 8, 16, 16, 320, 512
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"lora_rank": -1}, "lora_rank must be in [0, 512] (0: LoRA off; 512 is vLLM's largest "
         "max_lora_rank), got -1"),
        ({"lora_rank": 1024}, "lora_rank must be in [0, 512] (0: LoRA off; 512 is vLLM's largest "
         "max_lora_rank), got 1024"),
        ({"lora_rank": 8, "max_loras": 0}, "max_loras must be >= 1, got 0"),
        ({"lora_adapter_path": "/no/such"}, "lora_adapter_path is set but lora_rank=0 (LoRA "
         "off): set lora_rank to the adapter's rank"),
        ({"lora_rank": 8, "lora_adapter_path": "/no/such"}, "lora_adapter_path='/no/such' is not "
         "a folder: give a PEFT adapter folder (adapter_config.json + adapter_model.safetensors, "
         "as PEFT's save_pretrained writes it)"),
        ({"engine_kwargs": {"enable_lora": True}}, "engine_kwargs.enable_lora: the server sets "
         "this engine argument from lora_rank; set lora_rank instead"),
        ({"engine_kwargs": {"max_lora_rank": 64}}, "engine_kwargs.max_lora_rank: the server sets "
         "this engine argument from lora_rank; set lora_rank instead"),
        ({"engine_kwargs": {"max_loras": 4}}, "engine_kwargs.max_loras: the server sets this "
         "engine argument from max_loras; set max_loras instead"),
    ],
)  # fmt: skip
def test_a_bad_lora_setting_is_named(setting, message):
    with pytest.raises(ValueError) as info:
        ServerConfig(model="/models/x", **setting)
    assert str(info.value) == message


def test_an_adapter_folder_the_engine_cannot_load_is_refused_at_construction(adapter):
    path = str(adapter)
    with pytest.raises(ValueError) as info:
        ServerConfig(model="/models/x", lora_rank=8, lora_adapter_path=path)
    assert str(info.value) == (
        f"lora_adapter_path={path!r} holds a rank-16 adapter, above lora_rank=8: set lora_rank "
        "to 16 or more"
    )
    ServerConfig(model="/models/x", lora_rank=12, lora_adapter_path=path)  # max_lora_rank 16

    (adapter / "adapter_model.safetensors").unlink()
    with pytest.raises(ValueError) as info:
        ServerConfig(model="/models/x", lora_rank=16, lora_adapter_path=path)
    assert str(info.value) == (
        f"lora_adapter_path={path!r} has no adapter_model.safetensors: give a folder written by "
        "PEFT's save_pretrained"
    )

    (adapter / "adapter_config.json").unlink()
    with pytest.raises(ValueError) as info:
        ServerConfig(model="/models/x", lora_rank=16, lora_adapter_path=path)
    assert str(info.value) == (
        f"lora_adapter_path={path!r} has no adapter_config.json: give a folder written by "
        "PEFT's save_pretrained"
    )


def test_a_config_that_is_not_a_lora_adapters_is_refused(adapter):
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "IA3"}))
    with pytest.raises(ValueError) as info:
        ServerConfig(model="/models/x", lora_rank=8, lora_adapter_path=str(adapter))
    assert str(info.value) == (
        f"lora_adapter_path={str(adapter)!r}: adapter_config.json is not a LoRA adapter config "
        "with a rank r (KeyError: 'r')"
    )


def test_callers_name_their_own_keys(adapter):
    """What the trainer's config check shows its users."""
    with pytest.raises(ValueError) as info:
        check_lora(
            4,
            str(adapter),
            rank_key="actor_rollout_ref.model.lora_rank",
            path_key="actor_rollout_ref.model.lora_adapter_path",
        )
    assert str(info.value) == (
        f"actor_rollout_ref.model.lora_adapter_path={str(adapter)!r} holds a rank-16 adapter, "
        "above actor_rollout_ref.model.lora_rank=4: set actor_rollout_ref.model.lora_rank to 16 "
        "or more"
    )


def test_sglang_servers_refuse_a_starting_adapter(adapter):
    with pytest.raises(ValueError) as info:
        ServerConfig(
            model="/models/x", backend="sglang", lora_rank=16, lora_adapter_path=str(adapter)
        )
    assert str(info.value) == (
        "lora_adapter_path: sglang servers load no LoRA adapters here; use backend='vllm', or "
        "leave it unset and send the merged weights"
    )


def test_load_adapter_on_a_server_without_lora_names_lora_rank():
    server = AsyncServer(ServerConfig(model="/models/x", http=False))  # not started: no engine
    with pytest.raises(ValueError) as info:
        asyncio.run(server.apply_weights(AdapterUpdate({}, {"r": 8})))
    assert str(info.value) == (
        "this server was started with lora_rank=0 and loads no LoRA adapters: start it with "
        "lora_rank set to the adapter's rank, or send the merged weights"
    )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"r": 16}, "adapter rank 16 is above the largest this server loads (8, from "
         "lora_rank=8): start it with lora_rank=16 or more"),
        ({"r": 8, "rank_pattern": {"q_proj": 32}}, "adapter rank 32 is above the largest this "
         "server loads (8, from lora_rank=8): start it with lora_rank=32 or more"),
        ({"lora_alpha": 16}, "adapter config has no rank r: send the config PEFT writes for it"),
    ],
)  # fmt: skip
def test_an_adapter_the_server_cannot_load_is_named(config, message):
    with pytest.raises(ValueError) as info:
        check_adapter_rank(config, 8)
    assert str(info.value) == message
    check_adapter_rank({"r": 8}, 5)  # lora_rank 5 -> max_lora_rank 8


def test_an_adapter_is_written_as_peft_writes_it(tmp_path):
    tensors = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.ones(8, 4)}
    config = {"r": 8, "lora_alpha": 16, "target_modules": {"v_proj", "q_proj"}}
    write_adapter(tmp_path / "v1", tensors, config)
    saved = json.loads((tmp_path / "v1" / "adapter_config.json").read_text())
    assert saved == {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
    weights = load_file(tmp_path / "v1" / "adapter_model.safetensors")
    assert torch.equal(weights[next(iter(tensors))], torch.ones(8, 4))

    with pytest.raises(TypeError):  # not JSON: nothing is left behind
        write_adapter(tmp_path / "v2", tensors, {"r": 8, "bad": object()})
    assert not (tmp_path / "v2").exists()


def test_an_export_writes_the_adapter_beside_the_folder_s_other_files(tmp_path):
    """``exist_ok``: the trainer's ``hf_model`` export folder already holds the tokenizer; an
    error removes only the adapter's two files."""
    from enum import Enum

    class Kind(Enum):  # json refuses a plain enum: json_safe must turn it into its value
        LORA = "LORA"

    export = tmp_path / "huggingface"
    export.mkdir()
    (export / "tokenizer.json").write_text("{}")
    tensors = {"base_model.model.lm.lora_B.weight": torch.zeros(4, 8)}
    config = {"r": 8, "peft_type": Kind.LORA, "layers": (1, 2), "target_modules": {"k", "q"}}
    write_adapter(export, tensors, config, exist_ok=True)
    assert sorted(p.name for p in export.iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors", "tokenizer.json",
    ]  # fmt: skip
    saved = json.loads((export / "adapter_config.json").read_text())
    assert saved == {"r": 8, "peft_type": "LORA", "layers": [1, 2], "target_modules": ["k", "q"]}
    with pytest.raises(TypeError):
        write_adapter(export, tensors, {"r": 8, "bad": object()}, exist_ok=True)
    assert [p.name for p in export.iterdir()] == ["tokenizer.json"]
    with pytest.raises(FileExistsError):  # a server's version folder must be new
        write_adapter(export, tensors, config)
    assert (export / "tokenizer.json").is_file()


def test_the_adapter_folders_of_a_dead_server_are_swept(dead_pid, tmp_path):
    orphan = tmp_path / f"agentloop-lora-{dead_pid}-abc"
    (orphan / "v3").mkdir(parents=True)
    (orphan / "v3" / "adapter_config.json").write_text("{}")

    mine = new_adapter_root(tmp_path)

    assert not orphan.exists()
    assert mine.is_dir() and mine.name.startswith(f"agentloop-lora-{os.getpid()}-")
    assert sweep_orphans(tmp_path) == 0


@pytest.mark.skipif(not SHM.is_dir(), reason="needs /dev/shm")
def test_a_killed_servers_adapter_folder_is_removed_by_name():
    root = new_adapter_root(SHM)
    (root / "v1").mkdir()
    try:
        assert remove_shm([root.name]) == [root.name]
        assert not root.exists()
    finally:
        if root.exists():
            import shutil

            shutil.rmtree(root)
